#!/usr/bin/env bash
# Instructions per request of the service, for A/B comparisons of builds that wall-clock runs on
# a shared two-core machine cannot tell apart: runs each given payments-api binary (built with
# the `bench` feature) under valgrind's callgrind and counts the instructions it executes
# while serving `wrk -c1 -t1` requests of floor-http (GET /healthz), floor-redis
# (GET /bench/redis) and replay-cache (one charge's retry), each counted alone after a
# warm-up, and prints them per request: a line per binary, its path, then each scenario's name
# and its instructions per request. Counts move by a percent or two between runs (the
# service's background work during a measurement counts too), whatever else the machine does;
# they leave out the kernel (the sockets), and the SHA-256 extensions, which valgrind does not
# emulate, so SHA-256 counts at its portable cost.
#
#   scripts/bench/instructions.sh BINARY [BINARY...]      # DURATION=10 seconds per path
#
# Each binary runs with SQLite in memory and Redis at BENCH_REDIS_URL (redis://127.0.0.1:6379),
# under a key prefix of its own. Needs valgrind, wrk, curl and python3. Every service it
# starts is stopped when it ends.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
DURATION=${DURATION:-10}
REDIS_URL=${BENCH_REDIS_URL:-redis://127.0.0.1:6379}
(($# >= 1)) || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
for tool in valgrind callgrind_control wrk curl python3; do
    command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is required" >&2; exit 1; }
done
work="$(mktemp -d)"
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# The instructions a callgrind dump holds (its `summary:` line).
instructions() { sed -n 's/^summary: //p' "$1" | head -n 1; }

measure() { # BINARY INDEX
    local bin=$1 port key scenario path script line requests dump n=0
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    env -i PATH="$PATH" DATABASE_URL=sqlite::memory: REDIS_URL="$REDIS_URL" \
        PAYMENTS__SERVER__BIND="127.0.0.1:$port" PAYMENTS__SERVER__METRICS_BIND= PAYMENTS__LOG__FILTER=warn \
        PAYMENTS__AUTH__RATE_LIMIT_PER_SEC=1000000000 PAYMENTS__AUTH__RATE_LIMIT_BURST=1000000000 \
        PAYMENTS__REDIS__CACHE_SECRET="instructions-cache-secret-0123456789abcdef" \
        PAYMENTS__REDIS__KEY_PREFIX="instructions:$2:$$" \
        valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.$2.%p" "$bin" \
        >"$work/service.$2.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
        curl -fs -o /dev/null --max-time 2 "http://127.0.0.1:$port/readyz" && break
        sleep 0.2
    done
    curl -fs -o /dev/null --max-time 2 "http://127.0.0.1:$port/readyz" ||
        { echo "instructions.sh: $bin did not start: $(tail -5 "$work/service.$2.log")" >&2; exit 1; }
    # A UUID, as the client crate sends: the key is scanned for card numbers on every request.
    key="$(python3 -c 'import uuid; print(uuid.uuid4())')"
    curl -fsS -o /dev/null -H 'Authorization: Bearer sk_test_acme' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $key" -d '{"amount":100,"currency":"usd","source":"tok_visa"}' \
        "http://127.0.0.1:$port/charges"
    printf '%s' "$bin"
    for scenario in floor-http floor-redis replay-cache; do
        case $scenario in
            floor-http) path=healthz script=get.lua ;;
            floor-redis) path=bench/redis script=get.lua ;;
            replay-cache) path=charges script=replay.lua ;;
        esac
        (cd "$here" && wrk -c1 -t1 -d3s -s "$script" "http://127.0.0.1:$port/$path" -- "$key" >/dev/null)
        callgrind_control -z "$pid" >/dev/null 2>&1
        line="$(cd "$here" && wrk -c1 -t1 -d"${DURATION}s" -s "$script" "http://127.0.0.1:$port/$path" -- "$key" | grep '^BENCH')"
        n=$((n + 1))
        callgrind_control -d "$path" "$pid" >/dev/null 2>&1
        requests="$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$line")"
        dump="$(ls "$work"/callgrind."$2".*."$n")"
        printf '\t%s %d' "$scenario" $(($(instructions "$dump") / requests))
    done
    printf '\n'
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
}

i=0
for bin in "$@"; do
    i=$((i + 1))
    measure "$bin" "$i"
done
