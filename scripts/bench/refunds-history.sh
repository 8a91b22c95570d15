#!/usr/bin/env bash
# One tenant's refunds as its history grows: a release build on a PostgreSQL database of its
# own (the in-process simulator, no Redis), 64 charges of 999,999.99 USD to refund from, then
# for each history size in turn: the tenant's ledger grown to that many charges
# (ledger-history.sql), the funds read timed (EXPLAIN ANALYZE of the statement every
# reservation runs under the tenant's balance lock), a 3-s warm-up and a run of
# first-refund.lua (refunds of one minor unit under new keys, spread over the 64 charges).
# Prints one Markdown table.
#
#   scripts/bench/refunds-history.sh [--charges "0 100000"] [--duration SECONDS]
#                                    [--connections N] [--bin PATH] [--no-build]
#
# --charges: the tenant's history before each run, in charges (each one customer_payments
# entry), in increasing order. --bin: the service binary (built with the `bench` feature or
# without; default: this checkout's release build). PostgreSQL is BENCH_DATABASE_URL (a server
# URL without a database; default postgres://postgres@127.0.0.1:5432).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SIZES="0 100000" DURATION=10 CONNECTIONS=16 BUILD=1 BIN="$ROOT/target/release/payments-api"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --charges) SIZES="$2"; shift 2 ;;
        --duration) DURATION="$2"; shift 2 ;;
        --connections) CONNECTIONS="$2"; shift 2 ;;
        --bin) BIN="$2" BUILD=0; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "refunds-history.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

die() { echo "refunds-history.sh: $*" >&2; exit 1; }
command -v wrk >/dev/null || die "wrk is not installed (apt-get install wrk)"
command -v psql >/dev/null || die "psql is not installed (it creates and drops the database)"
PG_SERVER="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}"
psql "$PG_SERVER/postgres" -qAtc 'SELECT 1' >/dev/null 2>&1 ||
    die "PostgreSQL does not answer at $PG_SERVER (set BENCH_DATABASE_URL)"

cd "$ROOT"
[[ $BUILD == 1 ]] && cargo build --release --locked -p payments-api
[[ -x $BIN ]] || die "$BIN is missing (run without --no-build, or name one with --bin)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/payments-refunds.XXXXXX")"
DB="bench_refunds_$$"
PID=
cleanup() {
    [[ -n $PID ]] && kill "$PID" 2>/dev/null
    wait 2>/dev/null || true
    psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
psql "$PG_SERVER/postgres" -qc "CREATE DATABASE $DB" >/dev/null
db() { psql "$PG_SERVER/$DB" -X -q -v ON_ERROR_STOP=1 "$@"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port) metrics_port=$(free_port)
(cd "$WORK" && exec env -i PATH="$PATH" DATABASE_URL="$PG_SERVER/$DB" \
    PAYMENTS__SERVER__BIND="127.0.0.1:$port" PAYMENTS__SERVER__METRICS_BIND="127.0.0.1:$metrics_port" \
    PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT=512 \
    PAYMENTS__AUTH__RATE_LIMIT_PER_SEC=1000000000 PAYMENTS__AUTH__RATE_LIMIT_BURST=1000000000 \
    PAYMENTS__LOG__FILTER=warn "$BIN" >"$WORK/service.log" 2>&1) &
PID=$!
URL="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
    curl -fs -o /dev/null --max-time 1 "$URL/readyz" && break
    sleep 0.1
done
curl -fs -o /dev/null --max-time 1 "$URL/readyz" || die "the service did not start: $(tail -5 "$WORK/service.log")"

# The charges every refund is taken from.
CHARGES=()
for i in $(seq 1 64); do
    id=$(curl -fs "$URL/charges" -H 'Authorization: Bearer sk_test_acme' \
        -H 'Content-Type: application/json' -H "Idempotency-Key: refunds-history-$$-$i" \
        -d '{"amount":99999999,"currency":"usd","source":"tok_visa"}' |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])') ||
        die "charge $i was not made"
    CHARGES+=("$id")
done
CHARGE_IDS=$(IFS=,; echo "${CHARGES[*]}")

# Prints "rps p50_ms non2xx" of one run of first-refund.lua.
refunds() {
    LUA_PATH="$ROOT/scripts/bench/?.lua;;" wrk -t2 -c"$CONNECTIONS" -d"$1" --latency \
        -s "$ROOT/scripts/bench/first-refund.lua" "$URL/charges" -- "$2" "$CHARGE_IDS" |
        awk '/^BENCH/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                        print v["rps"], v["p50_ms"], v["non2xx"] }'
}

# The funds read of a reservation (`holding::FUNDS`, with the tenant and currency bound), as it
# runs under the lock: its execution time in ms.
funds_read_ms() {
    db -At -c "EXPLAIN (ANALYZE, FORMAT JSON)
        SELECT currency, CAST(sum(available) AS BIGINT), CAST(sum(pending) AS BIGINT) FROM funds
        WHERE tenant_id = 'acme' AND currency = 'USD' GROUP BY currency ORDER BY currency" |
        python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)[0]["Execution Time"])'
}

echo "| customer_payments entries before the run | refunds a second | p50, ms | non-2xx | the funds read, ms |"
echo "| ---: | ---: | ---: | ---: | ---: |"
had=0 run=0
for size in $SIZES; do
    run=$((run + 1))
    if ((size > had)); then
        db -v charges=$((size - had)) -v run="$run" -f "$ROOT/scripts/bench/ledger-history.sql"
        had=$size
    fi
    entries=$(db -At -c "SELECT count(*) FROM ledger_entries
                         WHERE tenant_id = 'acme' AND account = 'customer_payments'")
    read_ms=$(funds_read_ms)
    refunds 3s "warm-$run" >/dev/null
    read -r rps p50 errors < <(refunds "${DURATION}s" "run-$run")
    printf '| %s | %s | %s | %s | %s |\n' "$entries" "$rps" "$p50" "$errors" "$read_ms"
done
echo
echo "$(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), $DURATION s a run, $CONNECTIONS connections"
