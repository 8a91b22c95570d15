#!/usr/bin/env bash
# Service CPU per cached replay at one connection, for A/B comparisons of builds: runs
# `wrk -c1 -t1` replays of one cached key against each given payments-api binary in turn
# (interleaved, ROUNDS rounds) and prints the CPU microseconds the service used per request
# (user + system time from /proc) and the p50 latency of each run.
#
#   scripts/bench/replay-cpu.sh BINARY_A BINARY_B [...]      # ROUNDS=3 DURATION=10 by default
#   RECENT_ANSWERS_BYTES=0 scripts/bench/replay-cpu.sh ...    # replays from Redis, not memory
#
# Each binary runs with SQLite in memory and Redis at BENCH_REDIS_URL (redis://127.0.0.1:6379),
# under a key prefix of its own; a cached replay never touches the database. With
# RECENT_ANSWERS_BYTES set, the service keeps that many bytes of recent answers (0: none, so
# every replay comes from Redis). Needs wrk and curl and python3. Safe to re-run; every
# service it starts is stopped when it ends.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
REDIS_URL=${BENCH_REDIS_URL:-redis://127.0.0.1:6379}
(($# >= 1)) || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
command -v wrk >/dev/null || { echo "replay-cpu.sh: wrk is required (apt-get install wrk)" >&2; exit 1; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
pids=()
settings=()
[[ -n ${RECENT_ANSWERS_BYTES:-} ]] && settings+=("PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=$RECENT_ANSWERS_BYTES")
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

run_one() { # BINARY INDEX ROUND
    local bin=$1 log port pid key before after line requests p50
    log="$(mktemp)"
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # Logs at warn, as scripts/bench.sh runs the service: request logs would be measured too.
    # The tenant's rate is lifted, as there: what is measured is the replay, not its refusal.
    env -i PATH="$PATH" DATABASE_URL=sqlite::memory: REDIS_URL="$REDIS_URL" \
        PAYMENTS__SERVER__BIND="127.0.0.1:$port" PAYMENTS__SERVER__METRICS_BIND= PAYMENTS__LOG__FILTER=warn \
        PAYMENTS__AUTH__RATE_LIMIT_PER_SEC=1000000000 PAYMENTS__AUTH__RATE_LIMIT_BURST=1000000000 \
        PAYMENTS__REDIS__CACHE_SECRET="replay-cpu-cache-secret-0123456789abcdef" \
        PAYMENTS__REDIS__KEY_PREFIX="replay-cpu:$2:$3:$$" "${settings[@]}" "$bin" >"$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 1 100); do
        curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" && break
        sleep 0.1
    done
    curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" ||
        { echo "replay-cpu.sh: $bin did not start: $(cat "$log")" >&2; exit 1; }
    key="replay-cpu-$2-$3"
    curl -fsS -o /dev/null -H 'Authorization: Bearer sk_test_acme' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $key" -d '{"amount":100,"currency":"usd","source":"tok_visa"}' \
        "http://127.0.0.1:$port/charges"
    # Warm up, then measure.
    (cd "$here" && wrk -c1 -t1 -d2s -s replay.lua "http://127.0.0.1:$port/charges" -- "$key" >/dev/null)
    before="$(cpu_ticks "$pid")"
    line="$(cd "$here" && wrk -c1 -t1 -d"${DURATION}s" -s replay.lua "http://127.0.0.1:$port/charges" -- "$key" | grep '^BENCH')"
    after="$(cpu_ticks "$pid")"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    requests="$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$line")"
    [[ $line == *" non2xx=0 "* ]] || { echo "replay-cpu.sh: $bin answered errors: $line" >&2; exit 1; }
    p50="$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<<"$line")"
    awk -v b="$bin" -v r="$3" -v n="$requests" -v t=$((after - before)) -v us="$tick_us" -v p="$p50" \
        'BEGIN { printf "%s\tround %d\t%d requests\t%.0f us CPU/request\tp50 %s ms\n", b, r, n, t * us / n, p }'
    rm -f "$log"
}

for round in $(seq 1 "$ROUNDS"); do
    i=0
    for bin in "$@"; do
        run_one "$bin" "$i" "$round"
        i=$((i + 1))
    done
done
