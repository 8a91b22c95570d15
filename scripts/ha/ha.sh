#!/usr/bin/env bash
# The highly available topology, as processes on this machine's loopback interface:
#
#   etcd (Patroni's store)
#   three PostgreSQL nodes under Patroni, synchronous_mode on
#   HAProxy: the PostgreSQL primary (checked through Patroni's /primary) and the instances
#   Redis: a master, a replica and three Sentinels
#   card-sim, and three payments-api instances behind HAProxy
#
#   scripts/ha/ha.sh install         # installs what is missing, from Debian's packages
#   scripts/ha/ha.sh up              # what scripts/ha/up.sh runs
#   scripts/ha/ha.sh down            # what scripts/ha/down.sh runs
#   scripts/ha/ha.sh status          # one line per process
#   scripts/ha/ha.sh running         # exits 0 when a topology is up in HA_RUN_DIR
#   scripts/ha/ha.sh primary         # the PostgreSQL node holding the leader key (pg1..pg3)
#   scripts/ha/ha.sh redis-master    # the Redis node the Sentinels name (redis1, redis2)
#   scripts/ha/ha.sh sentinels-agree # the master's port, once every Sentinel names it
#   scripts/ha/ha.sh kill|stop|cont <node>   # SIGKILL, SIGSTOP, SIGCONT: pg1..pg3,
#                                            # redis1, redis2, api1..api3
#   scripts/ha/ha.sh start <node>    # starts a node again (a PostgreSQL node rejoins as a
#                                    # standby, a Redis node as a replica of the master)
#   scripts/ha/ha.sh hold-wal        # SIGSTOP of the primary's WAL senders
#   scripts/ha/ha.sh wait-healthy    # until there is one primary with a synchronous standby,
#                                    # a Redis master with a replica, and every instance ready
#
# The service is reached at http://127.0.0.1:25080 (HAProxy), PostgreSQL's primary at
# 127.0.0.1:25000. docs/DEPLOYMENT.md describes the topology and every setting that matters.
#
# Environment: HA_RUN_DIR (default /tmp/payments-ha: data, logs, pid files), HA_BIN (the
# directory of payments-api and card-sim, default target/debug, built when missing),
# HA_SYNCHRONOUS_MODE (default true; false only to measure the failure mode it prevents),
# HA_MAXIMUM_LAG_ON_FAILOVER (bytes, default 1048576: how far behind a standby may be and still
# be promoted when synchronous_mode is off), HA_CARD_SIM_LATENCY_MS (default 20), HA_REDIS
# (default on; off: the instances use no Redis, so every replay is read from PostgreSQL, as the
# capacity benchmark wants).
set -euo pipefail
HA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HA_HOME/../.." && pwd)
RUN=${HA_RUN_DIR:-/tmp/payments-ha}
BIN=${HA_BIN:-$ROOT/target/debug}
SYNCHRONOUS_MODE=${HA_SYNCHRONOUS_MODE:-true}

ETCD_PORT=25379
PG_FRONT=25000
API_FRONT=25080
CARD_SIM_PORT=25090
PG_NODES=(pg1 pg2 pg3)
REDIS_NODES=(redis1 redis2)
SENTINEL_PORTS=(26381 26382 26383)
API_NODES=(api1 api2 api3)
SENTINEL_MASTER=payments
# Shared by the instances: a cache entry written by one is checked by the others.
CACHE_SECRET_FILE=$RUN/cache-secret

pg_port() { echo $((25431 + ${1#pg})); }   # pg1 -> 25432
rest_port() { echo $((25007 + ${1#pg})); } # pg1 -> 25008
redis_port() { echo $((26378 + ${1#redis})); } # redis1 -> 26379
api_port() { echo $((25080 + ${1#api})); } # api1 -> 25081

say() { printf 'ha: %s\n' "$*"; }
fail() { printf 'ha.sh: %s\n' "$*" >&2; exit 1; }

# Prefixes a command so that it runs as the postgres user when this script runs as root:
# PostgreSQL refuses to run as root.
AS_POSTGRES=()
[ "$(id -u)" = 0 ] && AS_POSTGRES=(setpriv --reuid postgres --regid postgres --init-groups --)

# Starts a command in a session of its own, in the background, and records its pid. A signal
# to the pid's process group then reaches the process and whatever it started in that group.
spawn() {
    local name=$1
    shift
    setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN/$name.pid"
}

pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }
alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

# Writes the template `from` to `to` with each @NAME@ replaced by the value of a NAME=value
# argument (values may span lines).
render() {
    local from=$1 to=$2 text assignment
    shift 2
    text=$(<"$from")
    for assignment in "$@"; do
        text=${text//"@${assignment%%=*}@"/"${assignment#*=}"}
    done
    printf '%s\n' "$text" >"$to"
}

http_code() { curl -s -o /dev/null -m 1 -w '%{http_code}' "$1" 2>/dev/null || true; }

wait_for() {
    local what=$1 seconds=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        [ $SECONDS -lt $deadline ] || fail "timed out after ${seconds}s waiting for $what"
        sleep 0.2
    done
}

install_missing() {
    local missing=()
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    command -v patroni >/dev/null 2>&1 || missing+=(patroni)
    # Patroni's client of etcd's v2 API (conf/patroni.yml says why not etcd3).
    /usr/bin/python3 -c 'import etcd' >/dev/null 2>&1 || missing+=(python3-etcd)
    command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
    command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || missing+=(postgresql)
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" != 0 ]; then
        fail "missing: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}"
    fi
    say "installing ${missing[*]} from Debian"
    apt-get update -qq >/dev/null
    # Nothing is started by the packages (no init system runs them here); the topology starts
    # its own processes on its own ports.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

binaries() {
    if [ ! -x "$BIN/payments-api" ] || [ ! -x "$BIN/card-sim" ]; then
        [ -z "${HA_BIN:-}" ] || fail "HA_BIN=$BIN holds no payments-api and card-sim"
        say "building payments-api and card-sim"
        (cd "$ROOT" && cargo build --locked -p payments-api -p payments-card-sim --bins)
    fi
}

# --- etcd -----------------------------------------------------------------------------------
start_etcd() {
    mkdir -p "$RUN/etcd"
    spawn etcd etcd --name ha --data-dir "$RUN/etcd/data" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-cluster "ha=http://127.0.0.1:$((ETCD_PORT + 1))" \
        --enable-v2=true
    wait_for etcd 20 etcd_healthy
}
etcd_healthy() { [ "$(http_code "http://127.0.0.1:$ETCD_PORT/health")" = 200 ]; }

# --- PostgreSQL under Patroni ---------------------------------------------------------------
start_pg() {
    local node=$1 dir="$RUN/$1" pg_bin
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    mkdir -p "$dir"
    render "$HA_HOME/conf/patroni.yml" "$dir/patroni.yml" NAME="$node" \
        REST_PORT="$(rest_port "$node")" PG_PORT="$(pg_port "$node")" ETCD_PORT="$ETCD_PORT" \
        DIR="$dir" PG_BIN="$pg_bin" SYNCHRONOUS_MODE="$SYNCHRONOUS_MODE" \
        MAXIMUM_LAG="${HA_MAXIMUM_LAG_ON_FAILOVER:-1048576}"
    [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
    # The data directory must be the postgres user's alone.
    chmod 700 "$dir"
    # From the node's own directory: the postgres user may not enter the caller's (Patroni's
    # helpers, initdb and pg_rewind all start where it was started).
    (cd "$dir" && spawn "$node" "${AS_POSTGRES[@]}" patroni "$dir/patroni.yml")
}
# The postmaster runs in a session of its own (Patroni starts it so): its pid file names it.
postmaster_pid() { head -n 1 "$RUN/$1/data/postmaster.pid" 2>/dev/null || true; }
pg_role() { # primary, replica, sync (the synchronous standby) or down
    local port
    port=$(rest_port "$1")
    if [ "$(http_code "http://127.0.0.1:$port/primary")" = 200 ]; then echo primary
    elif [ "$(http_code "http://127.0.0.1:$port/synchronous")" = 200 ]; then echo sync
    elif [ "$(http_code "http://127.0.0.1:$port/replica")" = 200 ]; then echo replica
    else echo down
    fi
}
# The primary's WAL senders: stopped, they send the standbys nothing more, while the primary
# goes on committing. (Stopping the standbys' receivers instead would lose nothing: what the
# senders already wrote waits in the sockets' buffers.)
wal_senders() {
    local postmaster
    postmaster=$(postmaster_pid "$(primary)")
    [ -n "$postmaster" ] && pgrep -P "$postmaster" -f walsender
}
primary() {
    local node
    for node in "${PG_NODES[@]}"; do
        [ "$(pg_role "$node")" = primary ] && { echo "$node"; return 0; }
    done
    return 1
}
pg_healthy() {
    local node role primaries=0 syncs=0 replicas=0
    for node in "${PG_NODES[@]}"; do
        role=$(pg_role "$node")
        case $role in
            primary) primaries=$((primaries + 1)) ;;
            sync) syncs=$((syncs + 1)) ;;
            replica) replicas=$((replicas + 1)) ;;
        esac
    done
    [ $primaries = 1 ] || return 1
    if [ "$SYNCHRONOUS_MODE" = true ]; then
        [ $syncs = 1 ] && [ $((syncs + replicas)) = $((${#PG_NODES[@]} - 1)) ]
    else
        [ $((syncs + replicas)) = $((${#PG_NODES[@]} - 1)) ]
    fi
}

# --- Redis and its Sentinels ----------------------------------------------------------------
start_redis() { # node [master-port]
    local node=$1 port
    port=$(redis_port "$node")
    mkdir -p "$RUN/$node"
    local replica_of=()
    [ -n "${2:-}" ] && replica_of=(--replicaof 127.0.0.1 "$2")
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
        --dir "$RUN/$node" --pidfile "$RUN/$node.pid.redis" --logfile "$RUN/$node.log" \
        "${replica_of[@]}"
    wait_for "$node" 10 redis-cli -p "$port" ping
    cp "$RUN/$node.pid.redis" "$RUN/$node.pid"
}
start_sentinel() {
    local i=$1 port=${SENTINEL_PORTS[$1]} master_port=$2
    cat >"$RUN/sentinel$i.conf" <<CONF
port $port
bind 127.0.0.1
daemonize yes
pidfile $RUN/sentinel$i.pid
logfile $RUN/sentinel$i.log
dir $RUN
sentinel monitor $SENTINEL_MASTER 127.0.0.1 $master_port 2
sentinel down-after-milliseconds $SENTINEL_MASTER 1000
sentinel failover-timeout $SENTINEL_MASTER 5000
sentinel parallel-syncs $SENTINEL_MASTER 1
CONF
    redis-sentinel "$RUN/sentinel$i.conf"
}
redis_master_port() {
    local port
    for port in "${SENTINEL_PORTS[@]}"; do
        redis-cli -p "$port" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null |
            sed -n 2p | grep . && return 0
    done
    return 1
}
redis_master() {
    local port node
    port=$(redis_master_port) || return 1
    for node in "${REDIS_NODES[@]}"; do
        [ "$(redis_port "$node")" = "$port" ] && { echo "$node"; return 0; }
    done
    return 1
}
# The port of the master every Sentinel names; fails while they disagree or one does not answer.
sentinels_agree() {
    local port sentinel named
    port=$(redis_master_port) || return 1
    for sentinel in "${SENTINEL_PORTS[@]}"; do
        named=$(redis-cli -p "$sentinel" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null |
            sed -n 2p)
        [ "$named" = "$port" ] || return 1
    done
    echo "$port"
}
# The Sentinels agree on a master that says it is one and has a replica connected.
redis_healthy() {
    local port
    port=$(sentinels_agree) || return 1
    redis-cli -p "$port" INFO replication 2>/dev/null | grep -q '^role:master' || return 1
    redis-cli -p "$port" INFO replication | grep -q '^connected_slaves:[1-9]' || return 1
}

# --- card-sim and the instances -------------------------------------------------------------
start_card_sim() {
    spawn card-sim env CARD_SIM_LATENCY_MS="${HA_CARD_SIM_LATENCY_MS:-20}" \
        "$BIN/card-sim" --bind "127.0.0.1:$CARD_SIM_PORT"
    wait_for card-sim 10 card_sim_healthy
}
card_sim_healthy() { [ "$(http_code "http://127.0.0.1:$CARD_SIM_PORT/healthz")" = 200 ]; }

sentinel_list() {
    local port list=""
    for port in "${SENTINEL_PORTS[@]}"; do list="$list${list:+,}127.0.0.1:$port"; done
    echo "$list"
}
start_api() {
    local node=$1 port
    port=$(api_port "$node")
    local redis_settings=(
        PAYMENTS__REDIS__SENTINEL_MASTER="$SENTINEL_MASTER"
        PAYMENTS__REDIS__SENTINELS="$(sentinel_list)"
        PAYMENTS__REDIS__CACHE_SECRET="$(cat "$CACHE_SECRET_FILE")"
    )
    [ "${HA_REDIS:-on}" = off ] && redis_settings=()
    # A lock of 5 s (and a processor bound below it) so that a frozen instance's keys are
    # taken over within a soak; production keeps the 30 s default. Each instance's sessions
    # carry its name (application_name), so the soak can tell them apart in pg_stat_activity.
    spawn "$node" env -u DATABASE_URL -u REDIS_URL \
        PAYMENTS__SERVER__BIND="127.0.0.1:$port" \
        PAYMENTS__SERVER__METRICS_BIND="" \
        PAYMENTS__DATABASE__URL="postgres://postgres@127.0.0.1:$PG_FRONT/payments?application_name=$node" \
        PAYMENTS__DATABASE__MAX_CONNECTIONS=20 \
        PAYMENTS__PROCESSOR__URL="http://127.0.0.1:$CARD_SIM_PORT" \
        PAYMENTS__PROCESSOR__TIMEOUT_MS=2000 \
        PAYMENTS__PROCESSOR__SETTLE_AFTER_MS=3000 \
        PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS=5 \
        "${redis_settings[@]}" \
        PAYMENTS__LOG__FILTER="${HA_LOG_FILTER:-warn}" \
        "$BIN/payments-api"
}
front_ready() { [ "$(http_code "http://127.0.0.1:$API_FRONT/readyz")" = 200 ]; }
api_ready() { [ "$(http_code "http://127.0.0.1:$(api_port "$1")/readyz")" = 200 ]; }
apis_ready() {
    local node
    for node in "${API_NODES[@]}"; do api_ready "$node" || return 1; done
}

start_haproxy() {
    local pg_servers="" api_servers="" node
    for node in "${PG_NODES[@]}"; do
        pg_servers+="    server $node 127.0.0.1:$(pg_port "$node") check port $(rest_port "$node")"$'\n'
    done
    for node in "${API_NODES[@]}"; do
        api_servers+="    server $node 127.0.0.1:$(api_port "$node") check"$'\n'
    done
    render "$HA_HOME/conf/haproxy.cfg" "$RUN/haproxy.cfg" RUN="$RUN" PG_FRONT="$PG_FRONT" \
        API_FRONT="$API_FRONT" PG_SERVERS="${pg_servers%$'\n'}" API_SERVERS="${api_servers%$'\n'}"
    haproxy -c -q -f "$RUN/haproxy.cfg" || fail "the HAProxy configuration is invalid"
    spawn haproxy haproxy -W -db -f "$RUN/haproxy.cfg"
}

# --- the commands ---------------------------------------------------------------------------
start_node() {
    local node=$1
    case $node in
        pg*) start_pg "$node" ;;
        redis*)
            local master
            master=$(redis_master_port) || fail "no Sentinel names a Redis master"
            start_redis "$node" "$master"
            ;;
        api*) start_api "$node"; wait_for "$node" 60 api_ready "$node" ;;
        *) fail "unknown node $node" ;;
    esac
}

# Signals a node's processes: a PostgreSQL node is Patroni and its postmaster's session.
signal_node() {
    local signal=$1 node=$2 pid
    pid=$(pid_of "$node")
    [ -n "$pid" ] || fail "$node has no pid file"
    case $node in
        pg*)
            local postmaster
            postmaster=$(postmaster_pid "$node")
            kill -s "$signal" -- "-$pid" 2>/dev/null || true
            if [ -n "$postmaster" ]; then
                kill -s "$signal" -- "-$postmaster" 2>/dev/null || true
            fi
            ;;
        api*) kill -s "$signal" -- "-$pid" 2>/dev/null || true ;;
        *) kill -s "$signal" "$pid" 2>/dev/null || true ;;
    esac
}

healthy() { pg_healthy && redis_healthy && apis_ready; }

up() {
    install_missing
    binaries
    if alive etcd; then fail "a topology is already running in $RUN (scripts/ha/down.sh stops it)"; fi
    rm -rf "$RUN"
    mkdir -p "$RUN"
    chmod 755 "$RUN"
    python3 -c 'import secrets; print(secrets.token_hex(32))' >"$CACHE_SECRET_FILE"
    say "etcd"
    start_etcd
    say "PostgreSQL under Patroni (synchronous_mode: $SYNCHRONOUS_MODE)"
    start_pg pg1
    wait_for "pg1 to bootstrap the cluster" 60 eval '[ "$(pg_role pg1)" = primary ]'
    start_pg pg2
    start_pg pg3
    say "Redis, its replica and three Sentinels"
    start_redis redis1
    start_redis redis2 "$(redis_port redis1)"
    local i
    for i in 0 1 2; do start_sentinel "$i" "$(redis_port redis1)"; done
    start_card_sim
    start_haproxy
    wait_for "the standbys and their synchronous one" 90 pg_healthy
    wait_for "Redis to have its replica and Sentinels" 30 redis_healthy
    say "payments-api instances"
    # The first instance creates the database and migrates it; the others then start at once.
    start_api api1
    wait_for api1 60 api_ready api1
    start_api api2
    start_api api3
    wait_for "the instances" 60 apis_ready
    wait_for "HAProxy to send requests to the instances" 30 front_ready
    say "up: the service at http://127.0.0.1:$API_FRONT, the primary at 127.0.0.1:$PG_FRONT," \
        "PostgreSQL primary $(primary), Redis master $(redis_master) (logs in $RUN)"
}

down() {
    [ -d "$RUN" ] || { say "nothing is running in $RUN"; return 0; }
    local node
    for node in "${API_NODES[@]}" card-sim haproxy; do
        alive "$node" && signal_node CONT "$node"
        alive "$node" && kill -TERM -- "-$(pid_of "$node")" 2>/dev/null || true
    done
    for node in "${PG_NODES[@]}"; do
        [ -f "$RUN/$node.pid" ] || continue
        signal_node CONT "$node"
        signal_node KILL "$node"
    done
    for node in "${REDIS_NODES[@]}"; do
        alive "$node" && { kill -CONT "$(pid_of "$node")"; kill -KILL "$(pid_of "$node")"; } || true
    done
    for node in sentinel0 sentinel1 sentinel2 etcd; do
        alive "$node" && kill -KILL -- "$(pid_of "$node")" 2>/dev/null || true
    done
    # Whatever the pid files missed: every process started from this run directory.
    pkill -KILL -f "$RUN/" 2>/dev/null || true
    sleep 0.5
    rm -rf "$RUN"
    say "down"
}

status() {
    local node
    for node in etcd "${PG_NODES[@]}" "${REDIS_NODES[@]}" sentinel0 sentinel1 sentinel2 \
        card-sim haproxy "${API_NODES[@]}"; do
        if alive "$node"; then
            case $node in
                pg*) printf '%-10s up (%s)\n' "$node" "$(pg_role "$node")" ;;
                *) printf '%-10s up\n' "$node" ;;
            esac
        else
            printf '%-10s down\n' "$node"
        fi
    done
}

command=${1:-}
case $command in
    install) install_missing ;;
    up) up ;;
    down) down ;;
    status) status ;;
    running) alive etcd ;;
    primary) primary ;;
    redis-master) redis_master ;;
    sentinels-agree) sentinels_agree ;;
    kill) signal_node KILL "${2:?node}" ;;
    stop) signal_node STOP "${2:?node}" ;;
    cont) signal_node CONT "${2:?node}" ;;
    start) start_node "${2:?node}" ;;
    hold-wal) kill -STOP $(wal_senders) ;;
    wait-healthy) wait_for "the topology to be healthy" "${2:-90}" healthy ;;
    -h | --help | "") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) fail "unknown command $command (try --help)" ;;
esac
