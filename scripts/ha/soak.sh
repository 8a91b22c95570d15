#!/usr/bin/env bash
# The HA soak (scripts/ha/soak.py): brings the topology up, runs load through HAProxy while
# PostgreSQL's primary, the Redis master and instances are killed and frozen in turn, checks
# the exact counts, and takes the topology down again however it ends. About two minutes.
#
#   scripts/ha/soak.sh
#   scripts/ha/soak.sh --asynchronous   # the failure mode synchronous_mode prevents, measured
#                                       # (docs/DEPLOYMENT.md); its checks are expected to fail
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if bash "$here/ha.sh" running; then
    echo "soak.sh: a topology is already running (scripts/ha/down.sh stops it)" >&2
    exit 1
fi
run=${HA_RUN_DIR:-/tmp/payments-ha}
logs=$(cd "$here/../.." && pwd)/target/ha-soak-logs
finish() {
    local status=$?
    if [ $status != 0 ] && [ -d "$run" ]; then
        # Kept for whoever reads the failure: every process's log, PostgreSQL's included.
        rm -rf "$logs"
        mkdir -p "$logs"
        (cd "$run" && find . -name '*.log' -exec cp --parents {} "$logs" \;) || true
        echo "soak.sh: the topology's logs are in $logs" >&2
    fi
    bash "$here/down.sh" >/dev/null 2>&1 || true
    exit $status
}
trap finish EXIT
if [ "${1:-}" = --asynchronous ]; then
    # Off, and any standby may be promoted however far behind: the availability-first setup.
    export HA_SYNCHRONOUS_MODE=false HA_MAXIMUM_LAG_ON_FAILOVER=1073741824
fi
bash "$here/up.sh"
python3 "$here/soak.py" "$@"
