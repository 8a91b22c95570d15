#!/usr/bin/env bash
# The one test command. Checks that PostgreSQL and Redis answer, then formatting, the code names
# the documentation gives, the compose file, lints, and every test of the workspace: unit
# tests, the storage suite and the black-box suite (each test once on PostgreSQL and once on
# SQLite, a fresh database per test, the real service binary and card-sim processor), the
# caller's half (crates/client: its types checked against openapi.yaml, and its client and
# `payments` command line driven through a faulty network in the black-box suite), the
# embedded-mode and end-to-end tests, and last the contract test against openapi.yaml.
# Everything is built once with every feature but `next-version` (the crash tests need the
# `failpoints` build); the api crate once more with `next-version` too, the other half of a
# fleet mid-deploy in the rolling-deploy tests; then the workspace's own crates once more
# without features, for the test of the build people deploy. The dependencies are compiled once
# for all three. The black-box suite includes a kill -9 soak of about 20 s per backend. The HA soak
# (scripts/ha/soak.sh) then runs the deployed build on Patroni, HAProxy and Redis Sentinel while
# their nodes are killed and frozen: about two minutes; it installs etcd, Patroni, HAProxy and
# redis-sentinel from Debian when they are missing (as root; otherwise it prints the install line).
# Last, where a Docker engine answers, the compose stack (scripts/compose/e2e.sh): the README's
# compose commands, the e2e suite in its container and faults through Docker, with exact counts.
#
#   scripts/test.sh            # everything
#   TEST_DATABASE_URL=postgres://user@host:5432/postgres scripts/test.sh
#   TEST_SERVICES=private scripts/test.sh   # against a PostgreSQL and a Redis of its own
#
# With TEST_DATABASE_URL or TEST_REDIS_URL unset and nothing answering at the default address
# (127.0.0.1:5432, 127.0.0.1:6379), the run starts a private one and stops it at the end; a
# server that is not installed is installed from Debian when the run is root (otherwise the run
# stops with the install line).
#
# Safe to re-run: each test creates and drops its own database; leftovers of interrupted runs
# are dropped first.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says how long the one before it took, and the run's end says how long each took:
# where a run's time goes, in its own log.
STEP_NAME="" STEP_STARTED=$SECONDS STEP_TIMES=""
step() {
    end_step
    STEP_NAME="$*" STEP_STARTED=$SECONDS
    printf '\n==> %s\n' "$*"
}
end_step() {
    [ -n "$STEP_NAME" ] || return 0
    local took=$((SECONDS - STEP_STARTED))
    printf '(%s: %d s)\n' "$STEP_NAME" "$took"
    STEP_TIMES+="$(printf '%6d s  %s' "$took" "$STEP_NAME")"$'\n'
    STEP_NAME=""
}
fail() { printf 'test.sh: %s\n' "$*" >&2; exit 1; }

# The builds and the compose images need disk: a run that fills it fails at a link with "No
# space left on device", minutes in. Said first, so that such a failure reads as what it is.
mkdir -p target
printf 'Disk free for target/: %s\n' "$(df -h --output=avail target | tail -n 1 | tr -d ' ')"

# host:port out of a URL, for a dependency-free reachability check.
host_port() { sed -E 's#^[a-z]+://([^@/]*@)?([^/?]+).*#\2#' <<<"$1"; }
answers() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Private services, when the machine's do not answer at the default addresses (or when
# TEST_SERVICES=private): a PostgreSQL cluster and a Redis of this run's own, on free ports,
# stopped when the run ends. A URL given explicitly is never replaced: if it does not answer,
# that is an error.
PRIVATE="$PWD/target/test-services"
PRIVATE_PG="" PRIVATE_REDIS_PID="" BASE_IMAGES_PID=""
as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
stop_private() {
    local status=$?
    end_step
    [ -n "$STEP_TIMES" ] && printf '\n==> Time per step (%d s in all)\n%s' "$SECONDS" "$STEP_TIMES"
    [ -n "$BASE_IMAGES_PID" ] && { kill "$BASE_IMAGES_PID" 2>/dev/null || true; }
    [ -n "$PRIVATE_REDIS_PID" ] && { kill "$PRIVATE_REDIS_PID" 2>/dev/null || true; }
    if [ -n "$PRIVATE_PG" ]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$PRIVATE_PG" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$PRIVATE_PG"
    fi
    exit "$status"
}
# A server package that is missing is installed from Debian when the run is root; otherwise
# the run stops with the one line that installs it.
install_or_fail() {
    local package=$1 why=$2
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 ||
        fail "$why, and it is not installed: apt-get install $package"
    echo "$why: installing $package from Debian"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"; } >/dev/null ||
        fail "apt-get install $package failed"
}
start_private_postgres() {
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ ! -x "$PG_BIN/initdb" ]; then
        install_or_fail postgresql "no PostgreSQL answers to start a private one"
        PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    fi
    local port
    port=$(free_port)
    # Under /tmp, which the postgres user can reach whatever the checkout's directory allows.
    PRIVATE_PG=$(mktemp -d /tmp/payments-test-postgres.XXXXXX)
    [ "$(id -u)" = 0 ] && chown postgres "$PRIVATE_PG"
    mkdir -p "$PRIVATE"
    as_postgres "$PG_BIN/initdb" -D "$PRIVATE_PG" -U postgres -A trust >"$PRIVATE/initdb.log" ||
        fail "initdb of the private PostgreSQL failed (see $PRIVATE/initdb.log)"
    as_postgres "$PG_BIN/pg_ctl" -D "$PRIVATE_PG" -l "$PRIVATE_PG/server.log" -w \
        -o "-p $port -k $PRIVATE_PG -c listen_addresses=127.0.0.1" start >/dev/null ||
        fail "the private PostgreSQL did not start (see $PRIVATE_PG/server.log)"
    export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
    echo "started a private PostgreSQL at 127.0.0.1:$port"
}
start_private_redis() {
    command -v redis-server >/dev/null 2>&1 ||
        install_or_fail redis-server "no Redis answers to start a private one"
    local port
    port=$(free_port)
    mkdir -p "$PRIVATE"
    rm -f "$PRIVATE/redis.pid"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
        --dir "$PRIVATE" --pidfile "$PRIVATE/redis.pid" --logfile "$PRIVATE/redis.log" ||
        fail "the private Redis did not start (see $PRIVATE/redis.log)"
    for _ in $(seq 1 50); do answers "127.0.0.1:$port" && break; sleep 0.1; done
    PRIVATE_REDIS_PID=$(cat "$PRIVATE/redis.pid")
    export TEST_REDIS_URL="redis://127.0.0.1:$port"
    echo "started a private Redis at 127.0.0.1:$port"
}
trap stop_private EXIT

step "Checking services"
DEFAULT_PG="postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS="redis://127.0.0.1:6379"
if [ "${TEST_SERVICES:-}" = private ] ||
    { [ -z "${TEST_DATABASE_URL:-}" ] && ! answers "$(host_port "$DEFAULT_PG")"; }; then
    start_private_postgres
fi
if [ "${TEST_SERVICES:-}" = private ] ||
    { [ -z "${TEST_REDIS_URL:-}" ] && ! answers "$(host_port "$DEFAULT_REDIS")"; }; then
    start_private_redis
fi
export TEST_DATABASE_URL="${TEST_DATABASE_URL:-$DEFAULT_PG}"
export TEST_REDIS_URL="${TEST_REDIS_URL:-$DEFAULT_REDIS}"

pg_hostport=$(host_port "$TEST_DATABASE_URL")
[ "${pg_hostport##*:}" = "$pg_hostport" ] && pg_hostport="$pg_hostport:5432"
if ! answers "$pg_hostport"; then
    fail "PostgreSQL is not answering at $pg_hostport (TEST_DATABASE_URL=$TEST_DATABASE_URL).
  Start it (on Debian: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start),
  point TEST_DATABASE_URL at a server whose user may create databases, or leave it unset for a
  private one."
fi
echo "PostgreSQL answers at $pg_hostport"

redis_hostport=$(host_port "$TEST_REDIS_URL")
[ "${redis_hostport##*:}" = "$redis_hostport" ] && redis_hostport="$redis_hostport:6379"
if ! answers "$redis_hostport"; then
    fail "Redis is not answering at $redis_hostport (TEST_REDIS_URL=$TEST_REDIS_URL).
  Start it (redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no),
  point TEST_REDIS_URL at one, or leave it unset for a private one."
fi
command -v redis-server >/dev/null 2>&1 ||
    install_or_fail redis-server "the Redis-outage tests start and stop a redis-server of their own"
echo "Redis answers at $redis_hostport"
if command -v psql >/dev/null 2>&1; then
    # Databases left by interrupted runs (a test that is killed cannot drop its own).
    psql "$TEST_DATABASE_URL" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'payments_test_%'" |
        while read -r db; do
            [ -n "$db" ] && psql "$TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
        done
fi

# The compose step's base images are made while everything else builds and runs: where none
# can be pulled, debootstrap and Debian's packages take minutes, mostly of network and disk.
if docker info >/dev/null 2>&1; then
    mkdir -p target/compose-logs
    bash scripts/compose/base-images.sh >/dev/null 2>target/compose-logs/base-images.log &
    BASE_IMAGES_PID=$!
fi

step "Formatting (cargo fmt --check)"
cargo fmt --all --check

step "Docs name only what exists (scripts/check-doc-names.py)"
python3 scripts/check-doc-names.py

step "Compose file (docker-compose.yml against the Compose Specification schema)"
bash scripts/check-compose.sh

step "Lints (cargo clippy -D warnings, default features and all features)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "Tests (cargo test --workspace, every feature but next-version; database tests on PostgreSQL and SQLite)"
# Every feature of the workspace but `next-version`, which would make every test's service the
# next schema version: a feature added to a crate is added here.
TEST_FEATURES=payments-api/failpoints,payments-api/bench,payments-idempotency/memory,payments-idempotency/conformance,payments-storage/bench
# The rolling-deploy tests run the build one schema version up beside the tests' own. It is
# built as the tests' build is (the whole workspace, every target, the same features and
# `next-version`), so that the two share every dependency, compiled once, and differ only in the
# api crate. Cargo keeps both builds' artifacts apart, so neither rebuilds the other; the binary
# is copied out before the tests' build takes the name `payments-api` back.
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --workspace --all-targets --features "$TEST_FEATURES,payments-api/next-version" --locked
mkdir -p "$TARGET/next-version"
cp "$TARGET/debug/payments-api" "$TARGET/next-version/payments-api"
export PAYMENTS_NEXT_VERSION_BIN="$TARGET/next-version/payments-api"
# The crash tests abort the service on purpose: no core files.
ulimit -c 0
cargo test --workspace --all-targets --features "$TEST_FEATURES" --locked

step "The engine's schedules (printed: how many, and the seed that replays them)"
# Already run above; again here with their output, so the log says what was explored.
cargo test -p payments-idempotency --all-features --locked --test engine_schedules -- --nocapture 2>&1 |
    grep -E '^(explored|test result|ENGINE_SEED)'

step "The deployed build (no failpoints): the crash, pause and fail variables do nothing"
# Rebuilds only the workspace's own crates without features (the whole workspace is selected,
# so that every dependency is the tests' build's, compiled once); the HA soak and the contract
# step below use this binary too.
cargo test --workspace --test api --locked -- without_failpoints::

step "The HA soak (scripts/ha/soak.sh: Patroni, HAProxy, Sentinel and three instances, faults in turn)"
# The deployed build of the step above; the soak's topology has ports of its own (25000-26383).
HA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug" bash scripts/ha/soak.sh

step "Contract (schemathesis against openapi.yaml)"
bash scripts/contract.sh

step "The compose stack (scripts/compose/e2e.sh: the README's commands, the e2e suite, faults)"
if docker info >/dev/null 2>&1; then
    if [ -n "$BASE_IMAGES_PID" ]; then
        wait "$BASE_IMAGES_PID" ||
            fail "the base images could not be made (target/compose-logs/base-images.log)"
        BASE_IMAGES_PID=""
    fi
    PAYMENTS_CLI="$TARGET/debug/payments" bash scripts/compose/e2e.sh
else
    echo "skipped: no Docker engine answers (.ci/run installs and starts one)"
fi
