#!/usr/bin/env bash
# What a first charge sends to PostgreSQL, counted rather than read from the code: runs a
# payments-api binary with one database connection and no Redis, warms its statement cache
# with a few charges, then makes CHARGES first charges one after the other while strace
# records every write of the service to its PostgreSQL socket. Prints, per charge:
#   - statement round trips: writes of a statement to PostgreSQL (sqlx writes each statement
#     in one go and then waits for its answer);
#   - of them with a Parse: those that start with an extended-protocol Parse message (`P`);
#     0 when every statement was prepared before and came from sqlx's statement cache (the
#     connection is made with sslmode=disable so that the messages can be read);
#   - pool release pings: the round trip (a lone Sync, answered by ReadyForQuery) that sqlx
#     makes on every connection it takes back into its pool, after the statement's answer;
#   - transactions: what PostgreSQL committed for the service's database (pg_stat_database);
#     each autocommit statement is one, a read-only one included.
#
#   scripts/bench/round-trips.sh [BINARY] [CHARGES]   # target/release/payments-api, 200
#
# Needs strace, psql and curl, and PostgreSQL at BENCH_DATABASE_URL
# (postgres://postgres@127.0.0.1:5432). Safe to re-run: the service is stopped and its
# database dropped when it ends.
set -euo pipefail
BIN=${1:-target/release/payments-api}
CHARGES=${2:-200}
SERVER=${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}
for tool in strace psql curl python3; do
    command -v "$tool" >/dev/null || { echo "round-trips.sh: $tool is required" >&2; exit 1; }
done
[[ -x $BIN ]] || { echo "round-trips.sh: no binary at $BIN (cargo build --release -p payments-api)" >&2; exit 1; }

db="round_trips_$$"
work="$(mktemp -d)"
pid=""
cleanup() {
    [[ -n $pid ]] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
    psql "$SERVER/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    [[ -n ${KEEP_TRACE:-} ]] && cp "$work/trace" "$KEEP_TRACE"; rm -rf "$work"
}
trap cleanup EXIT
psql "$SERVER/postgres" -qc "CREATE DATABASE $db"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# One connection, so every statement goes down one socket; workers that would add statements
# of their own during the measurement run once at start and then not for an hour.
env -i PATH="$PATH" DATABASE_URL="$SERVER/$db?sslmode=disable" PAYMENTS__DATABASE__MAX_CONNECTIONS=1 \
    PAYMENTS__SERVER__BIND="127.0.0.1:$port" PAYMENTS__SERVER__METRICS_BIND= PAYMENTS__LOG__FILTER=warn \
    PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS=3600000 PAYMENTS__WORKERS__REAPER_INTERVAL_MS=3600000 \
    "$BIN" >"$work/service.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
    curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" && break
    sleep 0.1
done
curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/readyz" ||
    { echo "round-trips.sh: the service did not start: $(cat "$work/service.log")" >&2; exit 1; }

charge() {
    local status
    status="$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sk_test_acme' \
        -H 'Content-Type: application/json' -H "Idempotency-Key: round-trips-$1" \
        -d '{"amount":100,"currency":"usd","source":"tok_visa"}' "http://127.0.0.1:$port/charges")"
    [[ $status == 201 ]] || { echo "round-trips.sh: charge $1 answered $status" >&2; exit 1; }
}
commits() {
    # An idle backend reports its statistics to pg_stat_database within 10 s.
    sleep 11
    psql "$SERVER/postgres" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'"
}

for i in $(seq 1 20); do charge "warm-$i"; done
# The one connection's socket: the service's TCP connection to PostgreSQL's port.
pg_port="$(python3 -c "import urllib.parse as u; print(u.urlparse('$SERVER').port or 5432)")"
inode="$(python3 - "$pid" "$pg_port" <<'EOF'
import sys
pid, port = sys.argv[1], int(sys.argv[2])
for line in open("/proc/net/tcp").readlines()[1:] + open("/proc/net/tcp6").readlines()[1:]:
    fields = line.split()
    if int(fields[2].split(":")[1], 16) == port:
        inode = fields[9]
        import os
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    print(fd)
            except OSError:
                pass
EOF
)"
[[ $(wc -l <<<"$inode") == 1 && -n $inode ]] || { echo "round-trips.sh: expected one PostgreSQL socket, found: $inode" >&2; exit 1; }
fd=$inode

before="$(commits)"
strace -f -qq -p "$pid" -e trace=write,sendto,writev,read,recvfrom -s 1 -o "$work/trace" &
tracer=$!
sleep 0.5
for i in $(seq 1 "$CHARGES"); do charge "measured-$i"; done
sleep 0.5
kill "$tracer"; wait "$tracer" 2>/dev/null || true
after="$(commits)"

python3 - "$work/trace" "$fd" "$CHARGES" "$before" "$after" <<'EOF'
import re, sys
path, fd, charges, before, after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
statements = pings = parses = 0
for line in open(path):
    m = re.search(r'\b(write|sendto|writev|read|recvfrom)\(' + fd + r', (?:\[\{iov_base=)?"(.)"\.*, (\d+)', line)
    if not m or "EAGAIN" in line:
        continue
    kind = "read" if m.group(1) in ("read", "recvfrom") else "write"
    if kind == "write":
        # sqlx writes a statement in one go (Bind, Execute, Close, Sync; a Parse first when the
        # statement is not cached) and then waits for its answer. A lone Sync (5 bytes) is its
        # ping of a connection it takes back into the pool.
        if m.group(2) == "S" and m.group(3) == "5":
            pings += 1
        else:
            statements += 1
            parses += m.group(2) == "P"
print(f"charges {charges}, per charge: {statements / charges:.2f} statement round trips, "
      f"{parses / charges:.2f} of them with a Parse, {pings / charges:.2f} pool release pings, "
      f"{(after - before) / charges:.2f} transactions")
EOF
