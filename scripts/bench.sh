#!/usr/bin/env bash
# The benchmarks of docs/BENCHMARKS.md: every path of POST /charges under wrk, beside the floor
# it is measured against, printed as one Markdown table.
#
#   scripts/bench.sh [--duration SECONDS] [--connections N] [--threads N] [--quick]
#                    [--repeat N] [--rows N] [--out DIR] [--record] [--no-build] [--ha]
#
# It builds the release binaries with the `bench` feature, then starts every service the
# scenarios need at once, each on a fresh database and free loopback ports (and a card-sim
# for in-flight, and one service on a SQLite file of its own for the SQLite rows), preloads
# the growth databases, and runs the scenarios with wrk and the Lua
# scripts in scripts/bench/ in rounds: one run of each scenario per round, each right after
# the one it is compared with, --repeat rounds. A row reports the scenario's median run and
# the median over the rounds of its ratio to its floor within a round, so that a round slowed
# down by other work on the machine slows both sides of a ratio. The reaper scenario runs
# last on a service of its own. Everything it started is stopped and dropped on success and on
# failure. Every scenario must finish with 0 errors (the 409s of in-flight are its expected
# answer) and pass its exactly-once checks: otherwise it exits non-zero.
#
# Writes $OUT/results.md (the table, the machine, the date, the command line),
# $OUT/results.tsv, $OUT/throughput.svg, the raw wrk output in $OUT/raw/ and the service logs
# in $OUT/logs/. With --record the chart is also copied to docs/benchmarks-throughput.svg.
#
# PostgreSQL and Redis are taken from BENCH_DATABASE_URL (a server URL without a database;
# default postgres://postgres@127.0.0.1:5432) and BENCH_REDIS_URL (default
# redis://127.0.0.1:6379). Only loopback addresses are used. The SQLite file lives in
# ${TMPDIR:-/tmp}/bench-sqlite-<pid>/ and is deleted with the rest.
set -Eeuo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/bench.sh [options]

  --duration SECONDS   length of each wrk run (default 10; 3 with --quick)
  --connections N      concurrent connections for the throughput runs (default 16)
  --threads N          wrk threads (default 2, never more than the connections)
  --quick              short runs, and 100,000 instead of 1,000,000 preloaded records
                       (about two minutes in all)
  --repeat N           measure each scenario N times, interleaved, and keep the median
                       run (default 1)
  --rows N             records preloaded for the growth and reaper scenarios
  --out DIR            where results go (default target/bench)
  --record             also copy the chart to docs/benchmarks-throughput.svg
  --no-build           use the release binaries already built
  --ha                 instead: capacity through the HA topology of scripts/ha/ (first-charge
                       and replay-db through HAProxy with one and three instances, and the
                       CPU per request of each kind of process; docs/DEPLOYMENT.md)
  -h, --help           this text
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_SCRIPTS="$ROOT/scripts/bench"
COMMAND_LINE="scripts/bench.sh$(printf ' %q' "$@")"
[[ $# -eq 0 ]] && COMMAND_LINE="scripts/bench.sh"

DURATION=""
CONNECTIONS=16
THREADS=2
REPEAT=1
QUICK=0
ROWS=""
OUT="$ROOT/target/bench"
RECORD=0
BUILD=1
HA=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) DURATION="${2:?--duration needs a value}"; shift 2 ;;
        --connections) CONNECTIONS="${2:?--connections needs a value}"; shift 2 ;;
        --threads) THREADS="${2:?--threads needs a value}"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --repeat) REPEAT="${2:?--repeat needs a value}"; shift 2 ;;
        --rows) ROWS="${2:?--rows needs a value}"; shift 2 ;;
        --out) OUT="${2:?--out needs a value}"; shift 2 ;;
        --record) RECORD=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --ha) HA=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -z $DURATION ]]; then
    if ((QUICK)); then DURATION=3; else DURATION=10; fi
fi
if ((QUICK)); then WARMUP=1; else WARMUP=3; fi
if [[ -z $ROWS ]]; then
    if ((QUICK)); then ROWS=100000; else ROWS=1000000; fi
fi
for value in "$DURATION" "$CONNECTIONS" "$THREADS" "$REPEAT" "$ROWS"; do
    [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "bench: '$value' is not a positive whole number" >&2; exit 2; }
done
((THREADS > CONNECTIONS)) && THREADS=$CONNECTIONS
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

PG_SERVER="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}"
PG_SERVER="${PG_SERVER%/}"
REDIS_URL="${BENCH_REDIS_URL:-redis://127.0.0.1:6379}"
# The bench build has unauthenticated floor endpoints (/bench/*): it goes to a target directory
# of its own, so target/release/payments-api is never that binary.
TARGET_DIR="${BENCH_TARGET_DIR:-$ROOT/target/bench-build}"
API_BIN="$TARGET_DIR/release/payments-api"
SIM_BIN="$TARGET_DIR/release/card-sim"
# The service sheds load above this many requests in flight; keep it clear of the load. Each
# tenant's rate (auth.rate_limit_per_sec) is lifted too: what is measured is the service, not
# its refusals.
MAX_IN_FLIGHT=$((CONNECTIONS * 2 > 512 ? CONNECTIONS * 2 : 512))
# Names of everything this run creates carry its process id, so a later run can tell the
# leftovers of a run that was killed (its process is gone) from those of a run still going.
RUN=$$
# Every process this run starts carries this mark, so a later run can stop those left behind
# by a run that was killed before its cleanup.
export BENCH_RUN=$RUN
PROCESSOR_LATENCY_MS=500
# Where the SQLite service's file goes (a directory per run).
SQLITE_ROOT="${TMPDIR:-/tmp}"
# The longest a reap may take under load before the run gives up on it.
REAP_LIMIT_SECS=900

log() { printf 'bench [%3ds]: %s\n' "$SECONDS" "$*" >&2; }
die() {
    printf '\nbench: FAILED: %s\n' "$*" >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------
# Cleanup: everything started or created is tracked here and undone on any exit.

PIDS=()
DATABASES=()
SQLITE_DIRS=()

alive() {
    local state
    state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
    [[ -n $state && $state != Z* ]]
}

stop_pid() {
    local pid=$1 i
    alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
}

psql_admin() { psql "$PG_SERVER/postgres" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_db() {
    local db=$1
    shift
    psql "$PG_SERVER/$db" -X -q -v ON_ERROR_STOP=1 "$@"
}
redis() { redis-cli -u "$REDIS_URL" "$@"; }

drop_database() {
    psql_admin -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" >/dev/null 2>&1 ||
        log "warning: could not drop database $1"
}

delete_redis_keys() {
    redis --scan --pattern "$1*" 2>/dev/null | xargs -r -d '\n' -n 500 redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
}

cleanup() {
    local status=$? pid db dir
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        stop_pid "$pid"
    done
    for db in "${DATABASES[@]}"; do
        drop_database "$db"
    done
    for dir in "${SQLITE_DIRS[@]}"; do
        rm -rf "$dir"
    done
    delete_redis_keys "bench:$RUN:"
    if ((status != 0)); then
        log "stopped everything this run started; logs are in $OUT/logs"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Whether the run with this process id is another run still going.
other_run_alive() {
    [[ $1 != "$RUN" ]] && alive "$1" && [[ "$({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null)" == *bench.sh* ]]
}

# Processes, databases and Redis keys of earlier runs whose process is gone (killed before
# its cleanup could run).
remove_leftovers() {
    local name pid environ run
    for environ in /proc/[0-9]*/environ; do
        run="$({ tr '\0' '\n' <"$environ"; } 2>/dev/null | sed -n 's/^BENCH_RUN=//p')" || continue
        [[ -n $run && $run != "$RUN" ]] || continue
        other_run_alive "$run" && continue
        pid="${environ#/proc/}"
        pid="${pid%/environ}"
        log "stopping process $pid left by an earlier run"
        kill -TERM "$pid" 2>/dev/null || true
    done
    while read -r name; do
        [[ -z $name ]] && continue
        pid="${name#bench_}"
        pid="${pid%%_*}"
        if ! other_run_alive "$pid"; then
            log "dropping database $name left by an earlier run"
            drop_database "$name"
        fi
    done < <(psql_admin -At -c "SELECT datname FROM pg_database WHERE datname ~ '^bench_[0-9]+_[0-9]+$'")
    while read -r pid; do
        [[ -z $pid ]] && continue
        if ! other_run_alive "$pid"; then
            delete_redis_keys "bench:$pid:"
        fi
    done < <(redis --scan --pattern 'bench:*' 2>/dev/null | sed -n 's/^bench:\([0-9][0-9]*\):[0-9][0-9]*:.*/\1/p' | sort -u)
    for name in "$SQLITE_ROOT"/bench-sqlite-[0-9]*; do
        [[ -d $name ]] || continue
        pid="${name##*-}"
        if ! other_run_alive "$pid"; then
            log "deleting $name left by an earlier run"
            rm -rf "$name"
        fi
    done
}

# ---------------------------------------------------------------------------------------------
# Tools.

install_packages() {
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    log "installing $* with apt-get"
    if ! "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null 2>&1; then
        "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 || true
        "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null || die "could not install $*"
    fi
}

ensure_tools() {
    local missing=() tool package
    for tool in wrk:wrk psql:postgresql-client redis-cli:redis-tools curl:curl python3:python3 sqlite3:sqlite3; do
        package="${tool#*:}"
        tool="${tool%%:*}"
        command -v "$tool" >/dev/null 2>&1 || missing+=("$package")
    done
    ((${#missing[@]} == 0)) || install_packages "${missing[@]}"
    psql_admin -At -c 'SELECT 1' >/dev/null 2>&1 ||
        die "PostgreSQL does not answer at $PG_SERVER (set BENCH_DATABASE_URL)"
    [[ "$(redis ping 2>/dev/null)" == PONG ]] ||
        die "Redis does not answer at $REDIS_URL (set BENCH_REDIS_URL)"
}

build() {
    if ((BUILD)); then
        log "building the release binaries (feature bench)"
        (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release -p payments-api --features payments-api/bench -p payments-card-sim) \
            >"$OUT/logs/build.log" 2>&1 || die "the build failed; see $OUT/logs/build.log"
    fi
    [[ -x $API_BIN && -x $SIM_BIN ]] || die "no release binaries in $TARGET_DIR/release (run without --no-build)"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---------------------------------------------------------------------------------------------
# Services, registered under an id. use_service makes one current: SVC_ID, SVC_URL, SVC_PID,
# SVC_DB, SVC_PREFIX and SVC_LOG.

SERVICE_N=0
declare -A S_URL S_METRICS S_PID S_DB S_PREFIX S_LOG S_RELAY

use_service() {
    SVC_ID=$1 SVC_URL=${S_URL[$1]} SVC_METRICS=${S_METRICS[$1]} SVC_PID=${S_PID[$1]} SVC_DB=${S_DB[$1]}
    SVC_PREFIX=${S_PREFIX[$1]} SVC_LOG=${S_LOG[$1]}
}

# start_service ID [NAME=VALUE...]: a fresh database, a free port, the environment given.
# A DATABASE_URL=sqlite://FILE among them runs the service on that SQLite file instead of a
# PostgreSQL database; its SVC_DB is then sqlite:FILE.
start_service() {
    local id=$1 attempt port metrics_port pid i db prefix log_file relay=1 url arg
    shift
    SERVICE_N=$((SERVICE_N + 1))
    db="bench_${RUN}_${SERVICE_N}"
    url="$PG_SERVER/$db"
    prefix="bench:$RUN:$SERVICE_N"
    log_file="$OUT/logs/service-$SERVICE_N-$id.log"
    [[ " $* " == *" PAYMENTS__REDIS__URL= "* ]] && relay=0
    for arg in "$@"; do
        [[ $arg == DATABASE_URL=sqlite://* ]] && url=${arg#DATABASE_URL=} db="sqlite:${arg#DATABASE_URL=sqlite://}"
    done
    if [[ $db != sqlite:* ]]; then
        DATABASES+=("$db")
        drop_database "$db"
    fi
    for attempt in 1 2 3; do
        port="$(free_port)"
        metrics_port="$(free_port)"
        # A clean environment: a REDIS_URL, RUST_LOG or PAYMENTS__* of the caller's shell
        # would otherwise change what is measured.
        env -i PATH="$PATH" HOME="${HOME:-/}" BENCH_RUN="$RUN" \
            DATABASE_URL="$url" \
            PAYMENTS__SERVER__BIND="127.0.0.1:$port" \
            PAYMENTS__SERVER__METRICS_BIND="127.0.0.1:$metrics_port" \
            PAYMENTS__SERVER__MAX_IN_FLIGHT="$MAX_IN_FLIGHT" \
            PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT="$MAX_IN_FLIGHT" \
            PAYMENTS__AUTH__RATE_LIMIT_PER_SEC=1000000000 \
            PAYMENTS__AUTH__RATE_LIMIT_BURST=1000000000 \
            PAYMENTS__LOG__FILTER=warn \
            PAYMENTS__REDIS__URL="$REDIS_URL" \
            PAYMENTS__REDIS__KEY_PREFIX="$prefix" \
            PAYMENTS__REDIS__CACHE_SECRET="bench-cache-secret-$RUN-0123456789abcdef" \
            PAYMENTS__REDIS__STREAM="$prefix:events" \
            "$@" "$API_BIN" >"$log_file" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        for ((i = 0; i < 600; i++)); do
            if curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz"; then
                S_URL[$id]="http://127.0.0.1:$port" S_METRICS[$id]="http://127.0.0.1:$metrics_port"
                S_PID[$id]=$pid S_DB[$id]=$db
                S_PREFIX[$id]=$prefix S_LOG[$id]=$log_file S_RELAY[$id]=$relay
                use_service "$id"
                log "service $id ready at $SVC_URL (database $db)"
                return 0
            fi
            alive "$pid" || break
            sleep 0.1
        done
        stop_pid "$pid"
        grep -qi 'address.*in use' "$log_file" || break
        log "port $port was taken meanwhile; trying another"
    done
    tail -20 "$log_file" >&2
    die "service $id did not become ready; see $log_file"
}

stop_service() {
    use_service "$1"
    stop_pid "$SVC_PID"
    [[ $SVC_DB == sqlite:* ]] || drop_database "$SVC_DB"
    delete_redis_keys "$SVC_PREFIX:"
}

# Starts a card-sim that holds every charge for PROCESSOR_LATENCY_MS; sets SIM_PID, SIM_URL.
start_card_sim() {
    local out="$OUT/logs/card-sim.out" i address
    env -i PATH="$PATH" HOME="${HOME:-/}" BENCH_RUN="$RUN" RUST_LOG=warn \
        CARD_SIM_BIND=127.0.0.1:0 CARD_SIM_LATENCY_MS="$PROCESSOR_LATENCY_MS" \
        "$SIM_BIN" >"$out" 2>"$OUT/logs/card-sim.log" &
    SIM_PID=$!
    PIDS+=("$SIM_PID")
    for ((i = 0; i < 100; i++)); do
        address="$(sed -n 's/.*listening address=\([0-9.:]*\).*/\1/p' "$out" | head -1)"
        if [[ -n $address ]]; then
            SIM_URL="http://$address"
            log "card-sim ready at $SIM_URL (latency ${PROCESSOR_LATENCY_MS} ms)"
            return 0
        fi
        alive "$SIM_PID" || break
        sleep 0.1
    done
    die "card-sim did not start; see $OUT/logs/card-sim.log"
}

service_alive() {
    alive "$SVC_PID" || {
        tail -20 "$SVC_LOG" >&2
        die "service $SVC_ID died during $1; see $SVC_LOG"
    }
}

# CPU time, from /proc: of the service process, and of the PostgreSQL backends serving its
# database (the processes that run its statements; not the WAL writer or the checkpointer).
# A service on SQLite runs its statements in its own process: its PostgreSQL column is "-".
CLK_TCK="$(getconf CLK_TCK)"

cpu_ticks() { # PID... -> "pid ticks" lines (user + system time)
    local pid
    for pid in "$@"; do
        { awk -v pid="$pid" '{ sub(/^.*\) /, ""); print pid, $12 + $13 }' "/proc/$pid/stat"; } 2>/dev/null || true
    done
}

backend_pids() {
    psql_admin -At -c "SELECT pid FROM pg_stat_activity WHERE datname = '$SVC_DB' AND backend_type = 'client backend'"
}

cpu_snapshot() { # -> CPU_SVC0, CPU_PG0
    CPU_SVC0="$(cpu_ticks "$SVC_PID")"
    # shellcheck disable=SC2046
    CPU_PG0="$(cpu_ticks $(backend_pids))"
}

# Microseconds of CPU per request since cpu_snapshot -> "service_us postgres_us". A backend
# that started after the snapshot counts whole.
cpu_per_request() { # REQUESTS
    local requests=$1 svc1 pg1
    svc1="$(cpu_ticks "$SVC_PID")"
    # shellcheck disable=SC2046
    pg1="$(cpu_ticks $(backend_pids))"
    awk -v n="$requests" -v tick_us="$((1000000 / CLK_TCK))" -v svc0="$CPU_SVC0" -v svc1="$svc1" \
        -v sqlite="$([[ $SVC_DB == sqlite:* ]] && echo 1 || echo 0)" \
        -v pg0="$CPU_PG0" -v pg1="$pg1" '
        function delta(before, after,    lines, i, f, base, sum) {
            split(before, lines, "\n")
            for (i in lines) if (split(lines[i], f, " ") == 2) base[f[1]] = f[2]
            split(after, lines, "\n")
            for (i in lines) if (split(lines[i], f, " ") == 2) sum += f[2] - ((f[1] in base) ? base[f[1]] : 0)
            return sum
        }
        BEGIN {
            if (n <= 0) { print "- -"; exit }
            if (sqlite) printf "%.0f -\n", delta(svc0, svc1) * tick_us / n
            else printf "%.0f %.0f\n", delta(svc0, svc1) * tick_us / n, delta(pg0, pg1) * tick_us / n
        }'
}

# ---------------------------------------------------------------------------------------------
# Requests and checks outside wrk.

CHARGE_BODY='{"amount":100,"currency":"usd","source":"tok_visa"}'

post_charge() { # KEY -> prints the response head, fails on a transport error
    curl -sS -D - -o /dev/null --max-time 10 \
        -H 'Authorization: Bearer sk_test_acme' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $1" -d "$CHARGE_BODY" "$SVC_URL/charges"
}

# Charges KEY once (201) and checks that a retry is a replay: the key the replay runs use.
prepare_replay_key() {
    local key=$1 head
    head="$(post_charge "$key")" || die "POST /charges failed"
    [[ $head == "HTTP/1.1 201"* ]] || die "the first charge of $key answered: ${head%%$'\r'*}"
    head="$(post_charge "$key")" || die "POST /charges failed"
    [[ $head == "HTTP/1.1 201"* ]] && grep -qi '^idempotent-replayed: true' <<<"$head" ||
        die "a retry of $key was not a replay: ${head%%$'\r'*}"
}

finish_batches() { # -> "FINISHES BATCHES": idempotency_finish_batch_size's sum and count (0 0 when absent)
    curl -fs --max-time 5 "$SVC_METRICS/metrics" |
        awk 'index($0, "idempotency_finish_batch_size_sum") == 1 { s = $NF }
             index($0, "idempotency_finish_batch_size_count") == 1 { c = $NF }
             END { printf "%d %d\n", s, c }'
}

metric() { # OUTCOME -> idempotency_outcomes_total for it (0 when absent)
    curl -fs --max-time 5 "$SVC_METRICS/metrics" |
        awk -v want="outcome=\"$1\"" 'index($0, "idempotency_outcomes_total{") == 1 && index($0, want) { n = $NF } END { printf "%d\n", n }'
}

# One query on the current service's database (PostgreSQL, or its SQLite file), rows as
# '|'-separated values.
sql_value() {
    if [[ $SVC_DB == sqlite:* ]]; then
        sqlite3 -batch -bail "${SVC_DB#sqlite:}" "$1"
    else
        psql_db "$SVC_DB" -At -c "$1"
    fi
}

# Waits until the relay has published every event, so that its work does not spill into the
# next scenario.
settle_outbox() {
    local i backlog
    for ((i = 0; i < 300; i++)); do
        backlog="$(sql_value "SELECT count(*) FROM outbox_events WHERE published_at IS NULL")"
        [[ $backlog == 0 ]] && return 0
        sleep 0.1
    done
    log "warning: $backlog events still unpublished after 30 s"
}

# Exactly once under load: every completed record of the run has exactly one charge, one
# ledger transaction and one event, no other record has any, and every answered request is
# one of the completed records. When wrk stops at the end of a run it closes its connections
# with up to one request each in flight; those requests are cancelled where they stand and
# leave their records pending (a crash, as far as the record can tell), for a retry or the
# completer to settle once the lock expires (the completer marks failed a record whose
# charge the processor never made). So at most one record per connection and run may be
# unfinished: pending, or failed without a charge.
verify_charges() {
    local name=$1 prefix=$2 answered=$3 most=$4 counts records completed unfinished
    local charges ledger events stray
    counts="$(sql_value "SELECT count(*), count(*) FILTER (WHERE r.state = 'completed'),
                                count(*) FILTER (WHERE r.state <> 'completed'),
                                count(c.id) FILTER (WHERE r.state = 'completed'),
                                count(l.id) FILTER (WHERE r.state = 'completed'),
                                count(o.id) FILTER (WHERE r.state = 'completed'),
                                count(c.id) FILTER (WHERE r.state <> 'completed')
                         FROM idempotency_records r
                         LEFT JOIN charges c ON c.id = r.resource_id
                         LEFT JOIN ledger_transactions l ON l.charge_id = c.id
                         LEFT JOIN outbox_events o ON o.aggregate_id = c.id
                         WHERE r.idempotency_key LIKE '$prefix%'")"
    IFS='|' read -r records completed unfinished charges ledger events stray <<<"$counts"
    if [[ $completed != "$charges" || $completed != "$ledger" || $completed != "$events" || $stray != 0 ]] ||
        ((completed < answered || unfinished > most)); then
        FAILURES+=("$name: $records keys: $completed completed, $unfinished unfinished; $charges charges, $ledger ledger transactions, $events events for the completed ones, $stray for the others; $answered answered requests")
    fi
}

# Exactly once for holds: every hold of the run (a charges.create record under PREFIX) that is
# captured was captured by exactly one completed capture record and posted exactly one ledger
# transaction; a hold not captured (its capture was in flight when wrk stopped) posted none; and
# at least every answered capture's hold is captured.
verify_holds() {
    local name=$1 prefix=$2 counts holds captured ledger captures
    counts="$(sql_value "SELECT count(*), count(*) FILTER (WHERE c.capture_status = 'captured'),
                                (SELECT count(*) FROM ledger_transactions l
                                 JOIN idempotency_records h ON h.resource_id = l.charge_id
                                 WHERE h.idempotency_key LIKE '$prefix%'
                                   AND h.operation = 'charges.create'),
                                (SELECT count(*) FROM idempotency_records k
                                 WHERE k.idempotency_key LIKE '$prefix%'
                                   AND k.operation = 'charges.capture' AND k.state = 'completed')
                         FROM idempotency_records r JOIN charges c ON c.id = r.resource_id
                         WHERE r.idempotency_key LIKE '$prefix%' AND r.operation = 'charges.create'")"
    IFS='|' read -r holds captured ledger captures <<<"$counts"
    if [[ $captured != "$ledger" || $captured != "$captures" ]] || ((holds < captured || captured == 0)); then
        FAILURES+=("$name: $holds holds, $captured captured, $ledger ledger transactions, $captures completed captures")
    fi
}

# A replay run executed nothing: the key still has exactly one charge.
verify_single_charge() {
    local name=$1 key=$2 charges
    charges="$(sql_value "SELECT count(*) FROM charges c JOIN idempotency_records r ON r.resource_id = c.id WHERE r.idempotency_key = '$key'")"
    [[ $charges == 1 ]] || FAILURES+=("$name: key $key has $charges charges after the replays")
}

# The replays came from where the scenario says: OUTCOME counted at least once per answer.
verify_outcome() {
    local name=$1 outcome=$2 before=$3 answered=$4 after
    after="$(metric "$outcome")"
    ((after - before >= answered)) ||
        FAILURES+=("$name: $((after - before)) '$outcome' outcomes for $answered answered requests")
}

# ---------------------------------------------------------------------------------------------
# wrk runs and the results they make.

declare -A RPS P50 P99 ERRORS CONNS REF RATIO TARGET MET NOTES SVC_US PG_US RANGE
ORDER=()
FAILURES=()

# Scenarios: the service each runs against, its load, its script and the script's argument
# (a key or a key prefix), and what its throughput is compared with.
SCENARIOS=()
declare -A SC_SERVICE SC_CONNS SC_THREADS SC_PATH SC_SCRIPT SC_ARG SC_REF SC_NOTE
declare -A ACC_RUNS ACC_ERRORS ACC_EXPECTED ACC_ANSWERED
# first-charge's finishes and the batches they were written in, over its measured runs.
ACC_FINISHES=0 ACC_BATCHES=0

# add_scenario NAME SERVICE CONNECTIONS PATH SCRIPT ARG REF NOTE
add_scenario() {
    local name=$1 threads=$THREADS
    (($3 < threads)) && threads=$3
    SCENARIOS+=("$name")
    SC_SERVICE[$name]=$2 SC_CONNS[$name]=$3 SC_THREADS[$name]=$threads SC_PATH[$name]=$4
    SC_SCRIPT[$name]=$5 SC_ARG[$name]=$6 SC_REF[$name]=$7 SC_NOTE[$name]=$8
    ACC_RUNS[$name]="" ACC_ERRORS[$name]=0 ACC_EXPECTED[$name]=0 ACC_ANSWERED[$name]=0
}

makes_keys() { [[ $1 == first-charge.lua || $1 == in-flight.lua || $1 == authorize-capture.lua ]]; }

# run_once SCENARIO ROUND: one wrk run (after a warm-up in the first round); its numbers are
# added to the scenario's.
run_once() {
    local name=$1 round=$2 raw arg script=${SC_SCRIPT[$1]} finishes batches
    use_service "${SC_SERVICE[$name]}"
    arg=${SC_ARG[$name]}
    raw="$OUT/raw/$name.txt"
    if ((REPEAT > 1)); then
        raw="$OUT/raw/$name.run$round.txt"
        # Key-making scripts get a prefix per round (still under the scenario's prefix).
        makes_keys "$script" && arg="$arg-r$round"
    fi
    ((round == 1)) && warm_up "$name" "$arg"
    [[ $name == first-charge ]] && read -r finishes batches < <(finish_batches)
    log "$name: wrk -t${SC_THREADS[$name]} -c${SC_CONNS[$name]} -d${DURATION}s --latency ${SC_PATH[$name]}$( ((REPEAT > 1)) && echo " (round $round of $REPEAT)")"
    cpu_snapshot
    LUA_PATH="$BENCH_SCRIPTS/?.lua;;" wrk -t"${SC_THREADS[$name]}" -c"${SC_CONNS[$name]}" -d"${DURATION}s" \
        --latency -s "$BENCH_SCRIPTS/$script" "$SVC_URL${SC_PATH[$name]}" -- "$arg" >"$raw" 2>&1 ||
        die "wrk failed in $name: $(tail -3 "$raw")"
    service_alive "$name"
    if [[ $name == first-charge ]]; then
        read -r W_finishes W_batches < <(finish_batches)
        ACC_FINISHES=$((ACC_FINISHES + W_finishes - finishes)) ACC_BATCHES=$((ACC_BATCHES + W_batches - batches))
    fi
    parse_wrk "$name" "$raw"
    cpu_per_request "$W_requests" >"$raw.cpu"
    ACC_RUNS[$name]+="$W_rps $raw"$'\n'
    ACC_ERRORS[$name]=$((ACC_ERRORS[$name] + W_errors))
    ACC_EXPECTED[$name]=$((ACC_EXPECTED[$name] + W_expected))
    ACC_ANSWERED[$name]=$((ACC_ANSWERED[$name] + W_requests))
    # The relay's publishing of this run's events should not spill into the next run.
    if [[ $script == first-charge.lua || $script == bench-charge.lua ]] && ((S_RELAY[$SVC_ID])); then
        settle_outbox
    fi
}

# Keeps the run with the median throughput: W_rps, W_p50_ms, ... from its BENCH line;
# W_errors, W_expected and W_answered summed over all the runs, since every run must be clean.
take_median() {
    local name=$1 median
    median="$(printf '%s' "${ACC_RUNS[$name]}" | sort -g | sed -n "$(((REPEAT + 1) / 2))p" | cut -d' ' -f2-)"
    parse_wrk "$name" "$median"
    read -r W_svc_us W_pg_us <"$median.cpu"
    ((REPEAT > 1)) && cp "$median" "$OUT/raw/$name.txt"
    W_errors=${ACC_ERRORS[$name]} W_expected=${ACC_EXPECTED[$name]} W_answered=${ACC_ANSWERED[$name]}
    W_range="$(printf '%s' "${ACC_RUNS[$name]}" | awk 'NR == 1 || $1 < lo { lo = $1 } NR == 1 || $1 > hi { hi = $1 }
        END { if (NR > 1) printf "%.0f %.0f", lo, hi }')"
}

# The median over the rounds of the ratio of two scenarios' throughputs in the same round:
# paired this way, a round slowed down by other work on the machine slows both sides.
paired_ratio() { # SCENARIO REF
    paste -d' ' <(printf '%s' "${ACC_RUNS[$1]}" | cut -d' ' -f1) <(printf '%s' "${ACC_RUNS[$2]}" | cut -d' ' -f1) |
        awk '$2 > 0 { r[++n] = $1 / $2 }
             END {
                 if (n == 0) exit
                 for (i = 2; i <= n; i++) for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
                 m = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
                 printf "%.2f", m
             }'
}

# The same load for WARMUP seconds, not measured: the service's pool connections, prepared
# statements and caches are warm when the measured run starts. Scripts that make keys get a
# prefix of their own, so the warm-up's records are not counted as the run's.
warm_up() { # SCENARIO ARG
    local name=$1 arg=$2
    ((WARMUP > 0)) || return 0
    makes_keys "${SC_SCRIPT[$name]}" && arg="warmup-$arg"
    LUA_PATH="$BENCH_SCRIPTS/?.lua;;" wrk -t"${SC_THREADS[$name]}" -c"${SC_CONNS[$name]}" -d"${WARMUP}s" \
        -s "$BENCH_SCRIPTS/${SC_SCRIPT[$name]}" "$SVC_URL${SC_PATH[$name]}" -- "$arg" \
        >"$OUT/raw/$name.warmup.txt" 2>&1 ||
        die "wrk failed in the warm-up of $name: $(tail -3 "$OUT/raw/$name.warmup.txt")"
}

parse_wrk() {
    local name=$1 raw=$2 line pair
    line="$(grep -m1 '^BENCH ' "$raw")" || die "no result line from wrk in $name; see $raw"
    for pair in ${line#BENCH }; do
        printf -v "W_${pair%%=*}" '%s' "${pair#*=}"
    done
    # Transport errors always count; a scenario that checks statuses itself counts the
    # unexpected ones, the others count every status of 400 or more.
    W_errors=$((W_connect + W_read + W_write + W_timeout))
    if ((W_expected + W_unexpected > 0)) || [[ $name == in-flight* ]]; then
        W_errors=$((W_errors + W_unexpected))
    else
        W_errors=$((W_errors + W_non2xx))
    fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "" }'; }
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
thousands() { # 1234567.8 -> 1,234,567
    local n=${1%.*} out=""
    while ((${#n} > 3)); do
        out=",${n: -3}$out"
        n=${n:0:${#n}-3}
    done
    printf '%s' "$n$out"
}

# record SCENARIO CONNECTIONS [REF] [NOTES]: stores the W_* numbers under SCENARIO, with its
# ratio to the throughput of REF when one is given.
record() {
    local name=$1 conns=$2 ref=${3:-} notes=${4:-}
    ORDER+=("$name")
    RPS[$name]=$W_rps P50[$name]=$W_p50_ms P99[$name]=$W_p99_ms ERRORS[$name]=$W_errors
    CONNS[$name]=$conns REF[$name]=$ref NOTES[$name]=$notes RATIO[$name]="" TARGET[$name]="" MET[$name]=""
    SVC_US[$name]=${W_svc_us:--} PG_US[$name]=${W_pg_us:--}
    RANGE[$name]=${W_range:-}
    if [[ -n $ref && -n ${RPS[$ref]:-} ]]; then
        if [[ -n ${ACC_RUNS[$name]:-} && -n ${ACC_RUNS[$ref]:-} ]]; then
            RATIO[$name]="$(paired_ratio "$name" "$ref")"
        else
            RATIO[$name]="$(ratio "$W_rps" "${RPS[$ref]}")"
        fi
    fi
    if ((W_errors > 0)); then
        FAILURES+=("$name: $W_errors errors (see $OUT/raw/$name.txt)")
    fi
    log "$name: $(printf '%.0f' "$W_rps") req/s, p50 $W_p50_ms ms, p99 $W_p99_ms ms, $W_errors errors"
}

skip() { # SCENARIO REASON
    ORDER+=("$1")
    RPS[$1]="" P50[$1]="" P99[$1]="" ERRORS[$1]="" CONNS[$1]="" REF[$1]="" RATIO[$1]="" SVC_US[$1]="" PG_US[$1]="" RANGE[$1]=""
    TARGET[$1]="" MET[$1]="" NOTES[$1]="skipped: $2"
    log "$1: skipped ($2)"
}

# target SCENARIO TEXT KIND VALUE LIMIT: KIND is min (VALUE >= LIMIT), max (VALUE <= LIMIT) or
# below (VALUE < LIMIT). A scenario may have several targets: they are listed in its row,
# separated by semicolons, and so is whether each was met.
target() {
    local name=$1 text=$2 kind=$3 value=$4 limit=$5 met
    [[ -n ${RPS[$name]:-} && -n $value ]] || return 0
    case $kind in
        min) at_least "$value" "$limit" && met=yes || met=NO ;;
        max) at_most "$value" "$limit" && met=yes || met=NO ;;
        below) awk -v a="$value" -v b="$limit" 'BEGIN { exit !(a < b) }' && met=yes || met=NO ;;
    esac
    TARGET[$name]="${TARGET[$name]:+${TARGET[$name]}; }$text"
    MET[$name]="${MET[$name]:+${MET[$name]}; }$met"
}

# The ratio of SCENARIO's throughput to OTHER's, paired within rounds as record() does, for a
# target against a scenario other than the one in its ratio column.
ratio_to() { # SCENARIO OTHER
    [[ -n ${RPS[$1]:-} && -n ${RPS[$2]:-} ]] || return 0
    if [[ -n ${ACC_RUNS[$1]:-} && -n ${ACC_RUNS[$2]:-} ]]; then
        paired_ratio "$1" "$2"
    else
        ratio "${RPS[$1]}" "${RPS[$2]}"
    fi
}

rows_label() { # 1000000 -> 1M, 100000 -> 100k
    if (($1 % 1000000 == 0)); then echo "$(($1 / 1000000))M"
    elif (($1 % 1000 == 0)); then echo "$(($1 / 1000))k"
    else echo "$1"; fi
}

# ---------------------------------------------------------------------------------------------
# The scenarios.

preload() { # expired(true|false): ROWS records into the current service's database
    local started=$SECONDS
    log "loading $(thousands "$ROWS") $([[ $1 == true ]] && echo expired || echo live) records into $SVC_DB"
    psql_db "$SVC_DB" -v rows="$ROWS" -v expired="$1" -f "$BENCH_SCRIPTS/preload.sql" >/dev/null ||
        die "the preload failed"
    log "loaded in $((SECONDS - started)) s"
}

# Starts the services, prepares the replay keys and declares the scenarios, in table order.
setup_scenarios() {
    local code label
    label="$(rows_label "$ROWS")"
    C=$CONNECTIONS

    start_service main
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$SVC_URL/bench/redis")" || code=000
    if [[ $code == 200 ]]; then
        HAVE_BENCH=1
    else
        HAVE_BENCH=0
        log "GET /bench/redis answered $code: the bench endpoints are not built in; their scenarios are skipped"
    fi
    CACHE_KEY="replay-$RUN-cache"
    prepare_replay_key "$CACHE_KEY"
    REDIS_REPLAY_KEY="$SVC_PREFIX:replay:{acme:charges.create:$CACHE_KEY}"
    REDIS_BYTES="$(redis memory usage "$REDIS_REPLAY_KEY")"
    REDIS_VALUE_BYTES="$(redis strlen "$REDIS_REPLAY_KEY")"

    # The same with no recent answers held in the service: its replays come from Redis.
    start_service no-memory PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=0
    REDIS_KEY="replay-$RUN-redis"
    prepare_replay_key "$REDIS_KEY"

    # The services whose replays are the database's hold no recent answers either.
    start_service no-redis PAYMENTS__REDIS__URL= PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=0
    DB_KEY="replay-$RUN-db"
    prepare_replay_key "$DB_KEY"

    start_card_sim
    start_service card-sim PAYMENTS__PROCESSOR__URL="$SIM_URL"

    start_service growth
    preload false
    read -r PG_ROWS PG_ROW_BYTES PG_HEAP PG_INDEX PG_TOTAL PG_PER_ROW < <(psql_db "$SVC_DB" -At -F' ' -f "$BENCH_SCRIPTS/footprint.sql")

    start_service growth-no-redis PAYMENTS__REDIS__URL= PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=0
    preload false
    GROWTH_KEY="replay-$RUN-growth"
    prepare_replay_key "$GROWTH_KEY"

    # The embedded backend: a SQLite file of its own, without Redis (as scripts/bench/backends.sh
    # runs it), so that its replays come from the file.
    SQLITE_DIR="$SQLITE_ROOT/bench-sqlite-$RUN"
    SQLITE_DIRS+=("$SQLITE_DIR")
    rm -rf "$SQLITE_DIR"
    mkdir -p "$SQLITE_DIR"
    start_service sqlite PAYMENTS__REDIS__URL= PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES=0 \
        DATABASE_URL="sqlite://$SQLITE_DIR/payments.db"
    SQLITE_KEY="replay-$RUN-sqlite"
    prepare_replay_key "$SQLITE_KEY"

    # A floor comes before the scenarios compared with it (a ratio needs its floor's numbers).
    #            name                  service          conns path                      script            arg                    ref            note
    add_scenario floor-http            main             "$C"  /healthz                  get.lua           ""                     ""             ""
    if ((HAVE_BENCH)); then
        add_scenario floor-redis       main             "$C"  /bench/redis              get.lua           ""                     floor-http     ""
        add_scenario floor-charge      main             "$C"  /bench/charge             bench-charge.lua  ""                     ""             ""
        add_scenario floor-charge-2    main             "$C"  /bench/charge-2           bench-charge.lua  ""                     floor-charge   "the floor's writes in two commits"
        add_scenario floor-pg-read     no-redis         "$C"  "/bench/read?key=$DB_KEY" get.lua           ""                     ""             "one primary-key SELECT of a record"
    fi
    add_scenario replay-cache          main             "$C"  /charges                  replay.lua        "$CACHE_KEY"           floor-redis    "from the service's recent answers"
    add_scenario replay-cache-c1       main             1     /charges                  replay.lua        "$CACHE_KEY"           ""             "one connection: latency"
    add_scenario replay-redis          no-memory        "$C"  /charges                  replay.lua        "$REDIS_KEY"           floor-redis    "from Redis: no recent answers held"
    add_scenario first-charge          main             "$C"  /charges                  first-charge.lua  "first-$RUN-main"      floor-charge   ""
    add_scenario first-charge-c1       main             1     /charges                  first-charge.lua  "first-$RUN-c1"        ""             "one connection: latency"
    add_scenario authorize-capture     main             "$C"  /charges                  authorize-capture.lua "hold-$RUN-main"   first-charge   "a hold, then its capture: each request an effect's flow"
    add_scenario replay-db             no-redis         "$C"  /charges                  replay.lua        "$DB_KEY"              floor-pg-read  ""
    add_scenario in-flight             card-sim         "$C"  /charges                  in-flight.lua     "inflight-$RUN"        floor-pg-read  ""
    add_scenario "first-charge-$label" growth           "$C"  /charges                  first-charge.lua  "first-$RUN-growth"    first-charge   "$(thousands "$ROWS") records preloaded"
    add_scenario "replay-db-$label"    growth-no-redis  "$C"  /charges                  replay.lua        "$GROWTH_KEY"          replay-db      "$(thousands "$ROWS") records preloaded"
    add_scenario first-charge-sqlite   sqlite           "$C"  /charges                  first-charge.lua  "first-$RUN-sqlite"    ""             "SQLite file, no Redis"
    add_scenario replay-sqlite         sqlite           "$C"  /charges                  replay.lua        "$SQLITE_KEY"          replay-db      "SQLite file, no Redis"

    # The order of the runs within a round: each scenario right after the one it is compared
    # with (or as near as several scenarios compared with one allow), so that both see the same
    # background load and follow similar work. first-charge is compared with floor-charge-2
    # too, which runs between the two.
    RUN_ORDER=()
    local name
    for name in floor-http floor-redis replay-cache replay-redis replay-cache-c1 floor-charge floor-charge-2 first-charge \
        authorize-capture "first-charge-$label" first-charge-c1 first-charge-sqlite floor-pg-read in-flight replay-db \
        "replay-db-$label" replay-sqlite; do
        [[ -n ${SC_SERVICE[$name]:-} ]] && RUN_ORDER+=("$name")
    done
    ((${#RUN_ORDER[@]} == ${#SCENARIOS[@]})) || die "the run order misses a scenario"

    # Outcome counters before any load, for the checks that the replays came from where the
    # scenario says.
    use_service main
    BEFORE_MEMORY="$(metric replayed_memory)"
    use_service no-memory
    BEFORE_CACHE="$(metric replayed_cache)"
    use_service no-redis
    BEFORE_DB="$(metric replayed_db)"
    use_service card-sim
    BEFORE_IN_FLIGHT="$(metric in_flight)"
    use_service growth-no-redis
    BEFORE_GROWTH_DB="$(metric replayed_db)"
    use_service sqlite
    BEFORE_SQLITE_DB="$(metric replayed_db)"
}

measure() {
    local round name
    for ((round = 1; round <= REPEAT; round++)); do
        for name in "${RUN_ORDER[@]}"; do
            run_once "$name" "$round"
        done
    done
    for name in "${SCENARIOS[@]}"; do
        take_median "$name"
        [[ $name == in-flight ]] &&
            SC_NOTE[$name]="$(thousands "$W_expected") of $(thousands "$W_answered") answers are the expected 409"
        [[ $name == first-charge ]] && ((ACC_BATCHES > 0)) &&
            SC_NOTE[$name]="$(awk -v f="$ACC_FINISHES" -v b="$ACC_BATCHES" 'BEGIN { printf "%.1f", f / b }') finishes a commit on average (idempotency_finish_batch_size)"
        record "$name" "${SC_CONNS[$name]}" "${SC_REF[$name]}" "${SC_NOTE[$name]}"
        if [[ $name == floor-http ]] && ((!HAVE_BENCH)); then
            skip floor-redis "no /bench/redis (build with --features bench)"
            skip floor-charge "no /bench/charge (build with --features bench)"
            skip floor-charge-2 "no /bench/charge-2 (build with --features bench)"
            skip floor-pg-read "no /bench/read (build with --features bench)"
        fi
    done
}

# Exactly once, and from where each scenario says, over all the rounds.
verify() {
    local label
    label="$(rows_label "$ROWS")"
    use_service main
    verify_outcome "replay-cache, replay-cache-c1" replayed_memory "$BEFORE_MEMORY" \
        $((ACC_ANSWERED[replay-cache] + ACC_ANSWERED[replay-cache-c1]))
    verify_single_charge replay-cache "$CACHE_KEY"
    verify_charges first-charge "first-$RUN-main" "${ACC_ANSWERED[first-charge]}" $((CONNECTIONS * REPEAT))
    verify_charges first-charge-c1 "first-$RUN-c1" "${ACC_ANSWERED[first-charge-c1]}" "$REPEAT"
    verify_holds authorize-capture "hold-$RUN-main"
    API_ROW_BYTES="$(sql_value "SELECT round(avg(pg_column_size(r.*))) FROM idempotency_records r WHERE idempotency_key LIKE 'first-$RUN-main%'")"
    API_KEY_CHARS="$(sql_value "SELECT round(avg(length(idempotency_key))) FROM idempotency_records WHERE idempotency_key LIKE 'first-$RUN-main%'")"
    use_service no-memory
    verify_outcome replay-redis replayed_cache "$BEFORE_CACHE" "${ACC_ANSWERED[replay-redis]}"
    verify_single_charge replay-redis "$REDIS_KEY"
    use_service no-redis
    verify_outcome replay-db replayed_db "$BEFORE_DB" "${ACC_ANSWERED[replay-db]}"
    verify_single_charge replay-db "$DB_KEY"
    use_service card-sim
    verify_outcome in-flight in_flight "$BEFORE_IN_FLIGHT" "${ACC_EXPECTED[in-flight]}"
    verify_charges in-flight "inflight-$RUN" 0 $((CONNECTIONS * REPEAT))
    use_service growth
    verify_charges "first-charge-$label" "first-$RUN-growth" "${ACC_ANSWERED[first-charge-$label]}" $((CONNECTIONS * REPEAT))
    use_service growth-no-redis
    verify_outcome "replay-db-$label" replayed_db "$BEFORE_GROWTH_DB" "${ACC_ANSWERED[replay-db-$label]}"
    verify_single_charge "replay-db-$label" "$GROWTH_KEY"
    use_service sqlite
    verify_charges first-charge-sqlite "first-$RUN-sqlite" "${ACC_ANSWERED[first-charge-sqlite]}" $((CONNECTIONS * REPEAT))
    verify_outcome replay-sqlite replayed_db "$BEFORE_SQLITE_DB" "${ACC_ANSWERED[replay-sqlite]}"
    verify_single_charge replay-sqlite "$SQLITE_KEY"
}

stop_services() {
    local id
    for id in main no-memory no-redis card-sim growth growth-no-redis sqlite; do
        [[ -n ${S_PID[$id]:-} ]] && stop_service "$id"
    done
    [[ -n ${SIM_PID:-} ]] && stop_pid "$SIM_PID"
    return 0
}

# The reaper deletes ROWS expired records (POST /bench/reap) while first-charge runs.
scenario_reaper() {
    local label prefix name reap_out reap_pid wrk_pid raw left
    label="$(rows_label "$ROWS")"
    name="first-charge-reap-$label"
    if ((!HAVE_BENCH)); then
        skip "$name" "no /bench/reap (build with --features bench)"
        return 0
    fi
    # The service's own reaper runs once at start-up (nothing to delete yet), then not again
    # during the run: only POST /bench/reap deletes. The reap is one request that may take
    # longer than the service's whole-request timeout, so that timeout is raised here.
    start_service reaper PAYMENTS__WORKERS__REAPER_INTERVAL_MS=86400000 \
        PAYMENTS__SERVER__REQUEST_TIMEOUT_MS=$((REAP_LIMIT_SECS * 1000))
    prefix="first-$RUN-reap"
    add_scenario "$name" reaper "$CONNECTIONS" /charges first-charge.lua "$prefix" first-charge ""
    warm_up "$name" "$prefix"
    preload true
    raw="$OUT/raw/$name.txt"
    reap_out="$OUT/raw/reap-$label.json"
    # wrk has a bound far past the reap and is stopped with SIGINT (on which it reports) as
    # soon as the reap answers.
    log "$name: POST /bench/reap while wrk -t$THREADS -c$CONNECTIONS runs first-charge"
    LUA_PATH="$BENCH_SCRIPTS/?.lua;;" wrk -t"$THREADS" -c"$CONNECTIONS" -d"${REAP_LIMIT_SECS}s" --latency \
        -s "$BENCH_SCRIPTS/first-charge.lua" "$SVC_URL/charges" -- "$prefix" >"$raw" 2>&1 &
    wrk_pid=$!
    PIDS+=("$wrk_pid")
    sleep 0.5
    curl -sS --max-time "$REAP_LIMIT_SECS" -X POST "$SVC_URL/bench/reap" -o "$reap_out" -w '%{http_code}' \
        >"$reap_out.status" &
    reap_pid=$!
    PIDS+=("$reap_pid")
    wait "$reap_pid" || die "POST /bench/reap failed: $(cat "$reap_out" 2>/dev/null)"
    kill -INT "$wrk_pid" 2>/dev/null || true
    wait "$wrk_pid" || die "wrk failed in $name: $(tail -3 "$raw")"
    [[ "$(cat "$reap_out.status")" == 200 ]] ||
        die "POST /bench/reap answered $(cat "$reap_out.status"): $(cat "$reap_out")"
    service_alive "$name"
    parse_wrk "$name" "$raw"
    W_answered=$W_requests W_svc_us="" W_pg_us="" W_range=""
    read -r REAP_DELETED REAP_MS REAP_STATEMENTS REAP_BATCH REAP_LONGEST_MS REAP_P50_MS REAP_P99_MS < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["deleted"], r["elapsed_ms"], r["statements"], r["batch"], r["longest_statement_ms"],
      r["p50_statement_ms"], r["p99_statement_ms"])' "$reap_out")
    REAP_ROWS_PER_S="$(awk -v n="$REAP_DELETED" -v ms="$REAP_MS" 'BEGIN { printf "%.0f", n / (ms / 1000) }')"
    record "$name" "$CONNECTIONS" first-charge \
        "during the reap of $(thousands "$REAP_DELETED") expired records ($(awk -v ms="$REAP_MS" 'BEGIN { printf "%.1f", ms / 1000 }') s)"
    ((REAP_DELETED == ROWS)) || FAILURES+=("$name: the reap deleted $REAP_DELETED of $ROWS expired records")
    left="$(sql_value "SELECT count(*) FROM idempotency_records WHERE expires_at <= now()")"
    [[ $left == 0 ]] || FAILURES+=("$name: $left expired records left after the reap")
    verify_charges "$name" "$prefix" "$W_answered" "$CONNECTIONS"
    REAP_LABEL=$label
    stop_service reaper
}

# ---------------------------------------------------------------------------------------------
# The report.

fmt_ms() { [[ -n $1 ]] && printf '%.3f' "$1"; }
fmt_rps() { [[ -n $1 ]] && thousands "$(printf '%.0f' "$1")"; }
human_bytes() { awk -v b="$1" 'BEGIN { if (b >= 1048576) printf "%.0f MiB", b / 1048576; else printf "%.0f KiB", b / 1024 }'; }

# Each target is checked on the scenario it is about; a ratio against the scenario's own
# reference is in its ratio column, another one is given in the target's text.
apply_targets() {
    local label two reap
    label="$(rows_label "$ROWS")"
    target replay-cache ">= 1.50 x floor-redis" min "${RATIO[replay-cache]:-}" 1.50
    target replay-redis ">= 0.80 x floor-redis" min "${RATIO[replay-redis]:-}" 0.80
    target replay-cache-c1 "p50 <= 0.15 ms" max "${P50[replay-cache-c1]:-}" 0.15
    target first-charge ">= 0.50 x floor-charge" min "${RATIO[first-charge]:-}" 0.50
    two="$(ratio_to first-charge floor-charge-2)"
    target first-charge ">= 0.80 x floor-charge-2 (${two:-?} x)" min "$two" 0.80
    target replay-db ">= 0.70 x floor-pg-read" min "${RATIO[replay-db]:-}" 0.70
    target in-flight ">= 0.70 x floor-pg-read" min "${RATIO[in-flight]:-}" 0.70
    target "first-charge-$label" ">= 0.90 x first-charge" min "${RATIO[first-charge-$label]:-}" 0.90
    target "replay-db-$label" ">= 0.90 x replay-db" min "${RATIO[replay-db-$label]:-}" 0.90
    # 5,108 req/s: the last recorded SQLite replay rate (scripts/bench/backends.sh, docs/BENCHMARKS.md).
    target replay-sqlite ">= 2 x 5,108 req/s (its last recorded rate)" min "${RPS[replay-sqlite]:-}" 10216
    reap="first-charge-reap-$label"
    target "$reap" ">= 0.90 x first-charge" min "${RATIO[$reap]:-}" 0.90
    if [[ -n ${REAP_LONGEST_MS:-} ]]; then
        target "$reap" "longest reaper statement < 100 ms ($(printf '%.1f' "$REAP_LONGEST_MS") ms)" below "$REAP_LONGEST_MS" 100
    fi
}

write_report() {
    local md="$OUT/results.md" tsv="$OUT/results.tsv" name ratio range lo hi cpu mem
    cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    mem="$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    {
        echo "# Benchmark results"
        echo
        echo "- Command: \`$COMMAND_LINE\`"
        echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "- Machine: $(nproc) cores ($cpu), $mem memory, $(uname -sr)"
        echo "- Software: PostgreSQL $(psql_admin -At -c 'SHOW server_version' | cut -d' ' -f1) ($(psql_admin -At -F' ' -c "SELECT 'shared_buffers ' || current_setting('shared_buffers') || ', synchronous_commit ' || current_setting('synchronous_commit')")), Redis $(redis info server | sed -n 's/^redis_version:\([^[:space:]]*\).*/\1/p'), $(wrk --version 2>&1 | head -1 | awk '{print $1, $2}'); commit $COMMIT"
        echo "- Other load on the machine: load average $LOAD_BEFORE (1, 5, 15 min) when the run started"
        echo "- Load: wrk with $CONNECTIONS connections and $THREADS threads for ${DURATION} s per scenario after a ${WARMUP} s warm-up$( ((REPEAT > 1)) && echo ", in $REPEAT rounds: each row is the scenario's median run, its range the lowest and highest run, its ratio the median of the ratios within a round") (the -c1 rows: one connection, one thread), on the same machine as the service, PostgreSQL and Redis; the service at its defaults (10 database connections)"
        echo
        echo "| scenario | conns | req/s | req/s range | p50 ms | p99 ms | errors | ratio | target | met | CPU µs/req: service | PostgreSQL | notes |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | --- |"
        for name in "${ORDER[@]}"; do
            ratio="" range=""
            [[ -n ${RATIO[$name]} ]] && ratio="${RATIO[$name]} x ${REF[$name]}"
            if [[ -n ${RANGE[$name]} ]]; then
                read -r lo hi <<<"${RANGE[$name]}"
                range="$(thousands "$lo")–$(thousands "$hi")"
            fi
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "${CONNS[$name]}" \
                "$(fmt_rps "${RPS[$name]}")" "$range" "$(fmt_ms "${P50[$name]}")" "$(fmt_ms "${P99[$name]}")" \
                "${ERRORS[$name]}" "$ratio" "${TARGET[$name]}" "${MET[$name]}" \
                "${SVC_US[$name]}" "${PG_US[$name]}" "${NOTES[$name]}"
        done
        echo
        if [[ -n ${REAP_DELETED:-} ]]; then
            echo "Reaper: deleted $(thousands "$REAP_DELETED") expired records in $(awk -v ms="$REAP_MS" 'BEGIN { printf "%.1f", ms / 1000 }') s ($(thousands "$REAP_ROWS_PER_S") rows/s, its pauses between batches included) in $(thousands "$REAP_STATEMENTS") statements of $(thousands "$REAP_BATCH"); statement time p50 $(printf '%.1f' "$REAP_P50_MS") ms, p99 $(printf '%.1f' "$REAP_P99_MS") ms, longest $(printf '%.1f' "$REAP_LONGEST_MS") ms; first-charge meanwhile: $(fmt_rps "${RPS[first-charge-reap-$REAP_LABEL]}") req/s, ${RATIO[first-charge-reap-$REAP_LABEL]} x first-charge on a small table."
            echo
        fi
        if [[ -n ${PG_ROWS:-} ]]; then
            echo "Footprint in PostgreSQL at $(thousands "$PG_ROWS") records: $(printf '%.0f' "$PG_ROW_BYTES") bytes per row (avg pg_column_size, 36-character keys); $(printf '%.0f' "$PG_PER_ROW") bytes per record in all (pg_total_relation_size / count: heap $(human_bytes "$PG_HEAP"), indexes $(human_bytes "$PG_INDEX"), total $(human_bytes "$PG_TOTAL")). Records written through the API in first-charge: ${API_ROW_BYTES:-?} bytes per row with ${API_KEY_CHARS:-?}-character keys."
            echo
        fi
        if [[ -n ${REDIS_BYTES:-} ]]; then
            echo "Footprint in Redis: $REDIS_BYTES bytes per cached replay (MEMORY USAGE of one replay key; the value is $REDIS_VALUE_BYTES bytes)."
            echo
        fi
    } >"$md"
    {
        printf 'scenario\tconnections\trps\tp50_ms\tp99_ms\terrors\tref\tref_rps\tratio\ttarget\tmet\tservice_cpu_us\tpostgres_cpu_us\tnotes\n'
        for name in "${ORDER[@]}"; do
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "${CONNS[$name]}" "${RPS[$name]}" \
                "${P50[$name]}" "${P99[$name]}" "${ERRORS[$name]}" "${REF[$name]}" \
                "${RPS[${REF[$name]:-none}]:-}" "${RATIO[$name]}" "${TARGET[$name]}" "${MET[$name]}" \
                "${SVC_US[$name]}" "${PG_US[$name]}" "${NOTES[$name]}"
        done
    } >"$tsv"
    python3 "$BENCH_SCRIPTS/chart.py" "$tsv" "$OUT/throughput.svg" \
        "$(nproc) cores, $mem; wrk $CONNECTIONS connections, ${DURATION} s per scenario; $(date -u '+%Y-%m-%d')" ||
        log "warning: no chart drawn"
    if ((RECORD)) && [[ -f $OUT/throughput.svg ]]; then
        cp "$OUT/throughput.svg" "$ROOT/docs/benchmarks-throughput.svg"
        log "chart copied to docs/benchmarks-throughput.svg"
    fi
}

# ---------------------------------------------------------------------------------------------

main() {
    local started=$SECONDS failure
    LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
    # The code measured is the code built now, whatever is committed while the run goes on.
    COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    [[ -n "$(git -C "$ROOT" status --porcelain -- crates migrations Cargo.toml Cargo.lock 2>/dev/null)" ]] &&
        COMMIT+=" with uncommitted changes to the code"
    mkdir -p "$OUT/raw" "$OUT/logs"
    rm -f "$OUT"/raw/* "$OUT"/logs/*
    ensure_tools
    remove_leftovers
    build
    if ((HA)); then
        # The capacity scenario: the topology of scripts/ha/ on these binaries, instead of the
        # single-machine scenarios.
        log "capacity through HAProxy with one and three instances (scripts/bench/ha-capacity.py)"
        HA_BIN="$TARGET_DIR/release" python3 "$BENCH_SCRIPTS/ha-capacity.py" --duration "$DURATION" \
            --connections "$CONNECTIONS" --repeat "$REPEAT" --out "$OUT/ha-capacity.md" ||
            die "the capacity scenario failed"
        log "done in $((SECONDS - started)) s; results in $OUT/ha-capacity.md"
        return
    fi
    HAVE_BENCH=0
    setup_scenarios
    measure
    verify
    stop_services
    scenario_reaper
    apply_targets
    write_report
    cat "$OUT/results.md"
    log "done in $((SECONDS - started)) s; results in $OUT/results.md, chart in $OUT/throughput.svg"
    if ((${#FAILURES[@]} > 0)); then
        printf '\nbench: FAILED: %d check(s) did not hold:\n' "${#FAILURES[@]}" >&2
        for failure in "${FAILURES[@]}"; do
            printf '  - %s\n' "$failure" >&2
        done
        exit 1
    fi
}

main
