#!/usr/bin/env bash
# The two storage backends side by side: the same release binary, once on PostgreSQL and once
# on the embedded SQLite file, both with the in-process simulator and without Redis, measured
# with the same wrk scripts as scripts/bench.sh, interleaved round by round so that both sides
# of a ratio see the same machine.
#
#   scripts/bench/backends.sh [--duration SECONDS] [--rounds N] [--connections N] [--no-build]
#
# Scenarios: first-charge (a new key per request: claim, charge, record charged, finish) and
# replay (one completed key, every request a replay from the database). Prints one Markdown
# table: the median requests/s and p50 of each backend, the median over the rounds of the
# SQLite/PostgreSQL ratio, and the error responses wrk counted. PostgreSQL is BENCH_DATABASE_URL (a server URL without a database;
# default postgres://postgres@127.0.0.1:5432); a fresh database is created and dropped.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DURATION=10 ROUNDS=3 CONNECTIONS=16 BUILD=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) DURATION="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --connections) CONNECTIONS="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "backends.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

die() { echo "backends.sh: $*" >&2; exit 1; }
command -v wrk >/dev/null || die "wrk is not installed (apt-get install wrk)"
command -v psql >/dev/null || die "psql is not installed (it creates and drops the database)"
PG_SERVER="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}"
psql "$PG_SERVER/postgres" -qAtc 'SELECT 1' >/dev/null 2>&1 ||
    die "PostgreSQL does not answer at $PG_SERVER (set BENCH_DATABASE_URL)"

cd "$ROOT"
[[ $BUILD == 1 ]] && cargo build --release --locked -p payments-api
BIN="$ROOT/target/release/payments-api"
[[ -x $BIN ]] || die "$BIN is missing (run without --no-build)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/payments-backends.XXXXXX")"
DB="bench_backends_$$"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Starts the service in its own directory and sets STARTED_URL once it listens. (Not called
# in a command substitution: that would run it in a subshell, and cleanup would never learn
# the service's pid.)
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Sets STARTED_URL (the API) and STARTED_METRICS (its metrics listener).
start() {
    local name=$1 port metrics_port; shift
    port=$(free_port) metrics_port=$(free_port)
    mkdir -p "$WORK/$name"
    (cd "$WORK/$name" && exec env -i PATH="$PATH" PAYMENTS__SERVER__BIND="127.0.0.1:$port" \
        PAYMENTS__SERVER__METRICS_BIND="127.0.0.1:$metrics_port" \
        PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT=512 \
        PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=0 \
        PAYMENTS__LOG__FILTER=warn "$@" "$BIN" >"$WORK/$name.log" 2>&1) &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        if curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz"; then
            STARTED_URL="http://127.0.0.1:$port" STARTED_METRICS="http://127.0.0.1:$metrics_port"
            return
        fi
        sleep 0.1
    done
    die "$name did not start (see $WORK/$name.log)"
}

start postgres DATABASE_URL="$PG_SERVER/$DB"
PG_URL=$STARTED_URL PG_METRICS=$STARTED_METRICS
start sqlite
SQLITE_URL=$STARTED_URL SQLITE_METRICS=$STARTED_METRICS

# One completed charge per service for the replay scenario.
REPLAY_KEY="replay-$$"
for url in "$PG_URL" "$SQLITE_URL"; do
    status=$(curl -s -o /dev/null -w '%{http_code}' "$url/charges" \
        -H 'Authorization: Bearer sk_test_acme' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $REPLAY_KEY" -d '{"amount":100,"currency":"usd","source":"tok_visa"}')
    [[ $status == 201 ]] || die "the replay key's first charge answered $status at $url"
done

# Runs one scenario and prints "rps p50_ms non2xx".
run() {
    local url=$1 script=$2 arg=$3
    LUA_PATH="$ROOT/scripts/bench/?.lua;;" wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --latency \
        -s "$ROOT/scripts/bench/$script" "$url/charges" -- "$arg" |
        awk '/^BENCH/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                        print v["rps"], v["p50_ms"], v["non2xx"] }'
}

declare -A RPS P50 RATIOS ERRORS
for round in $(seq 1 "$ROUNDS"); do
    for scenario in first-charge replay; do
        case $scenario in
            first-charge) script=first-charge.lua; arg="r$round" ;;
            replay) script=replay.lua; arg="$REPLAY_KEY" ;;
        esac
        read -r pg_rps pg_p50 pg_errors < <(run "$PG_URL" "$script" "$arg")
        read -r sq_rps sq_p50 sq_errors < <(run "$SQLITE_URL" "$script" "$arg")
        ERRORS[$scenario,postgres]=$(( ${ERRORS[$scenario,postgres]:-0} + pg_errors ))
        ERRORS[$scenario,sqlite]=$(( ${ERRORS[$scenario,sqlite]:-0} + sq_errors ))
        RPS[$scenario,postgres]+="$pg_rps " P50[$scenario,postgres]+="$pg_p50 "
        RPS[$scenario,sqlite]+="$sq_rps " P50[$scenario,sqlite]+="$sq_p50 "
        RATIOS[$scenario]+="$(awk -v a="$sq_rps" -v b="$pg_rps" 'BEGIN { printf "%.2f", a / b }') "
        echo "round $round $scenario: postgres $pg_rps req/s, sqlite $sq_rps req/s" >&2
    done
done

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo
echo "| Scenario | PostgreSQL req/s | PostgreSQL p50 ms | SQLite req/s | SQLite p50 ms | SQLite / PostgreSQL | non-2xx (PG / SQLite) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for scenario in first-charge replay; do
    printf '| %s | %s | %s | %s | %s | %s | %s / %s |\n' "$scenario" \
        "$(median <<<"${RPS[$scenario,postgres]}")" "$(median <<<"${P50[$scenario,postgres]}")" \
        "$(median <<<"${RPS[$scenario,sqlite]}")" "$(median <<<"${P50[$scenario,sqlite]}")" \
        "$(median <<<"${RATIOS[$scenario]}")" \
        "${ERRORS[$scenario,postgres]}" "${ERRORS[$scenario,sqlite]}"
done
# Any answer other than 201 (by status, and by idempotency outcome), as each service counted it (wrk's non-2xx count
# includes answers to requests it cut off at the end of a run, which the service may not see).
for backend in postgres sqlite; do
    url=$PG_METRICS; [[ $backend == sqlite ]] && url=$SQLITE_METRICS
    other=$(curl -s "$url/metrics" |
        grep -E '^(http_requests_total|idempotency_outcomes_total)' |
        grep -vE 'status="201"|outcome="(executed|replayed_db)"' || true)
    [[ -n $other ]] && printf '\n%s answered other than 201:\n%s\n' "$backend" "$other"
done
echo
echo "$(nproc) cores, $(date -u +%Y-%m-%d), $DURATION s x $ROUNDS rounds, $CONNECTIONS connections"
