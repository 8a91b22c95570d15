#!/usr/bin/env bash
# The compose stack, tested as a user runs it: what the README tells a user to run, with
# whichever of `docker compose` (v2) and `docker-compose` (v1) is there, then faults:
#
#   1. up --build -d
#   2. the README's curl, sent twice: 201, then the same bytes with Idempotent-Replayed: true
#   3. scripts/demo.sh against the stack (its last step with the `payments` command line)
#   4. --profile e2e build e2e, then --profile e2e run --rm e2e (crates/api/tests/e2e.rs in
#      its own container)
#   5. the faults of scripts/compose/faults.py: payments-api killed with -9 and paused past its
#      lock, Redis paused; each with exact counts. Its callers retry with the `payments` command
#      line (PAYMENTS_CLI, else target/debug/payments, built when missing)
#   6. down -v
#
# It runs under a compose project of its own (payments-compose-test) with images tagged
# compose-test and the API on a free port, so it never touches a stack a person is running,
# and takes the stack down however it ends (its logs are kept in target/compose-logs/ when a
# step fails). Base images that cannot be pulled are built from Debian's packages first
# (scripts/compose/base-images.sh), and the certificates this machine added to its CA bundle
# (/usr/local/share/ca-certificates) go to the builder as EXTRA_CA_CERTS unless that is set.
# It ends with one summary line. Needs a Docker engine; scripts/test.sh runs it when one
# answers.
#
#   scripts/compose/e2e.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { printf 'compose: %s\n' "$*"; }
fail() { printf 'compose/e2e.sh: %s\n' "$*" >&2; exit 1; }
seconds_since() { echo $(($(date +%s) - $1)); }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (start dockerd, or check DOCKER_HOST)"
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
    version="v2 ($(docker compose version --short))"
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
    version="v1 ($(docker-compose version --short))"
else
    fail "neither docker compose (v2) nor docker-compose (v1) is installed"
fi
say "compose ${version}"

# The faults charge with the `payments` command line (crates/client), as a caller should retry:
# the one scripts/test.sh built beside the service, or PAYMENTS_CLI.
payments_cli=${PAYMENTS_CLI:-target/debug/payments}
if [ ! -x "$payments_cli" ]; then
    say "building the payments command line (cargo build -p payments-client)"
    cargo build --locked -q -p payments-client --bin payments || fail "cannot build the payments command line"
    payments_cli=target/debug/payments
fi

export COMPOSE_PROJECT_NAME=payments-compose-test PAYMENTS_IMAGE_TAG=compose-test
PAYMENTS_API_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PAYMENTS_API_PORT
base_url="http://127.0.0.1:$PAYMENTS_API_PORT"
logs=target/compose-logs
mkdir -p "$logs"

down() { "${compose[@]}" --profile e2e down -v --remove-orphans >/dev/null 2>&1 || true; }
finish() {
    local status=$?
    if [ "$status" != 0 ]; then
        "${compose[@]}" --profile e2e logs --no-color >"$logs/stack.log" 2>&1 || true
        say "FAILED; the stack's logs are in $logs/stack.log"
    fi
    # A fault that stopped half-way may leave a container paused, which down cannot stop.
    for container in $("${compose[@]}" ps -q 2>/dev/null); do
        docker unpause "$container" >/dev/null 2>&1 || true
    done
    down
    exit "$status"
}
trap finish EXIT
down # what an interrupted run of this script left behind

# --- base images and the builder's CA ------------------------------------------------------
step_started=$(date +%s)
started=$step_started
images=$(bash scripts/compose/base-images.sh) || fail "the base images could not be made (above)"
eval "$images"
export RUNTIME_IMAGE RUST_IMAGE POSTGRES_IMAGE REDIS_IMAGE
say "base images ($(seconds_since "$started")s): $RUST_IMAGE $RUNTIME_IMAGE $POSTGRES_IMAGE $REDIS_IMAGE"
if [ -z "${EXTRA_CA_CERTS:-}" ] && compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    EXTRA_CA_CERTS=$(cat /usr/local/share/ca-certificates/*.crt)
    export EXTRA_CA_CERTS
    say "the builder trusts this machine's $(grep -c 'BEGIN CERTIFICATE' <<<"$EXTRA_CA_CERTS") added CA certificates"
fi

summary=("Compose ${version}")

# --- 1. up --build -d ----------------------------------------------------------------------
started=$(date +%s)
say "1. ${compose[*]} up --build -d"
"${compose[@]}" up --build -d >"$logs/up.log" 2>&1 || {
    tail -n 40 "$logs/up.log" >&2
    fail "up --build -d failed (whole output in $logs/up.log)"
}
for _ in $(seq 1 120); do curl -fsS "$base_url/readyz" >/dev/null 2>&1 && break; sleep 1; done
curl -fsS "$base_url/readyz" >/dev/null || fail "payments-api did not become ready at $base_url"
summary+=("${compose[*]} up --build -d: ready in $(seconds_since "$started")s")

# --- 2. the README's curl, twice -----------------------------------------------------------
# Taken from the README itself (its first curl to /charges, up to the line that does not go
# on), pointed at this stack's port.
readme_curl=$(awk '/^curl -i localhost:8080\/charges/ { on = 1 } on { print } on && !/\\$/ { exit }' README.md)
[ -n "$readme_curl" ] || fail "README.md has no curl -i localhost:8080/charges command"
readme_curl=${readme_curl//localhost:8080/localhost:$PAYMENTS_API_PORT}
say "2. the README's curl, twice"
first=$(bash -c "$readme_curl" 2>/dev/null | tr -d '\r')
again=$(bash -c "$readme_curl" 2>/dev/null | tr -d '\r')
body() { sed '1,/^$/d' <<<"$1"; }
head -n 1 <<<"$first" | grep -q '^HTTP/1.1 201' || fail "the README's curl answered: $(head -n 1 <<<"$first")"
grep -qi '^idempotent-replayed' <<<"$first" && fail "the README's first curl was a replay"
head -n 1 <<<"$again" | grep -q '^HTTP/1.1 201' || fail "its second send answered: $(head -n 1 <<<"$again")"
grep -qi '^idempotent-replayed: true$' <<<"$again" || fail "its second send was not a replay"
[ "$(body "$first")" = "$(body "$again")" ] || fail "its replay's body differs from the first"
summary+=("the README's curl twice: 201, then 201 replayed with the same body")

# --- 3. scripts/demo.sh --------------------------------------------------------------------
say "3. scripts/demo.sh $base_url"
PAYMENTS_CLI="$payments_cli" bash scripts/demo.sh "$base_url" >"$logs/demo.log" 2>&1 || {
    tail -n 20 "$logs/demo.log" >&2
    fail "scripts/demo.sh failed against the stack (whole output in $logs/demo.log)"
}
summary+=("scripts/demo.sh: $(grep -c '^  ok:' "$logs/demo.log") checks ok")

# --- 4. the e2e profile --------------------------------------------------------------------
started=$(date +%s)
say "4. ${compose[*]} --profile e2e build e2e; ${compose[*]} --profile e2e run --rm e2e"
"${compose[@]}" --profile e2e build e2e >"$logs/e2e-build.log" 2>&1 || {
    tail -n 40 "$logs/e2e-build.log" >&2
    fail "building the e2e image failed (whole output in $logs/e2e-build.log)"
}
"${compose[@]}" --profile e2e run --rm e2e >"$logs/e2e.log" 2>&1 || {
    tail -n 40 "$logs/e2e.log" >&2
    fail "the e2e suite failed against the stack (whole output in $logs/e2e.log)"
}
passed=$(sed -nE 's/^test result: ok\. ([0-9]+) passed.*/\1/p' "$logs/e2e.log" | tail -n 1)
[ -n "$passed" ] && [ "$passed" -gt 0 ] || fail "the e2e suite ran no test ($logs/e2e.log)"
summary+=("${compose[*]} --profile e2e build e2e and run --rm e2e: $passed passed ($(seconds_since "$started")s)")

# --- 5. faults -----------------------------------------------------------------------------
say "5. faults"
python3 scripts/compose/faults.py --port "$PAYMENTS_API_PORT" --payments "$payments_cli" -- "${compose[@]}" | tee "$logs/faults.log"
summary+=("$(sed -n 's/^faults summary: //p' "$logs/faults.log")")

# --- 6. down -v ----------------------------------------------------------------------------
say "6. ${compose[*]} down -v"
"${compose[@]}" --profile e2e down -v --remove-orphans >"$logs/down.log" 2>&1 ||
    fail "down -v failed ($logs/down.log)"
[ -z "$("${compose[@]}" ps -q 2>/dev/null)" ] || fail "containers are left after down -v"
summary+=("${compose[*]} down -v: nothing left")

summary+=("$(seconds_since "$step_started")s in all")
printf -v line '%s; ' "${summary[@]}"
say "summary: ${line%; }"
