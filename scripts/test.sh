#!/usr/bin/env bash
# The one test command. Checks that PostgreSQL and Redis answer, then formatting, the code names
# the documentation gives, the compose file, lints, and every test of the workspace: unit
# tests, the storage suite and the black-box suite (each test once on PostgreSQL and once on
# SQLite, a fresh database per test, the real service binary and card-sim processor), the
# embedded-mode and end-to-end tests, and last the contract test against openapi.yaml.
# Everything is built once with all features (the crash tests need the `failpoints` build);
# then the api crate once more without them, for the test of the build people deploy. The
# black-box suite includes a kill -9 soak of about 20 s per backend.
#
#   scripts/test.sh            # everything
#   TEST_DATABASE_URL=postgres://user@host:5432/postgres scripts/test.sh
#
# Safe to re-run: each test creates and drops its own database; leftovers of interrupted runs
# are dropped first.
set -euo pipefail
cd "$(dirname "$0")/.."

export TEST_DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'test.sh: %s\n' "$*" >&2; exit 1; }

step "Checking services"
# host:port out of the URL, for a dependency-free reachability check.
pg_hostport=$(sed -E 's#^[a-z]+://([^@/]*@)?([^/?]+).*#\2#' <<<"$TEST_DATABASE_URL")
pg_host=${pg_hostport%:*}
pg_port=${pg_hostport##*:}
[ "$pg_port" = "$pg_hostport" ] && pg_port=5432
if ! (exec 3<>"/dev/tcp/$pg_host/$pg_port") 2>/dev/null; then
    fail "PostgreSQL is not answering at $pg_host:$pg_port (TEST_DATABASE_URL=$TEST_DATABASE_URL).
  Start it (on Debian: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start)
  or point TEST_DATABASE_URL at a server whose user may create databases."
fi
echo "PostgreSQL answers at $pg_host:$pg_port"

export TEST_REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379}"
redis_hostport=$(sed -E 's#^[a-z]+://([^@/]*@)?([^/?]+).*#\2#' <<<"$TEST_REDIS_URL")
redis_host=${redis_hostport%:*}
redis_port=${redis_hostport##*:}
[ "$redis_port" = "$redis_hostport" ] && redis_port=6379
if ! (exec 3<>"/dev/tcp/$redis_host/$redis_port") 2>/dev/null; then
    fail "Redis is not answering at $redis_host:$redis_port (TEST_REDIS_URL=$TEST_REDIS_URL).
  Start it (redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no)
  or point TEST_REDIS_URL at one."
fi
command -v redis-server >/dev/null 2>&1 ||
    fail "redis-server is not installed: the Redis-outage tests start and stop their own (apt-get install redis-server)."
echo "Redis answers at $redis_host:$redis_port"
if command -v psql >/dev/null 2>&1; then
    # Databases left by interrupted runs (a test that is killed cannot drop its own).
    psql "$TEST_DATABASE_URL" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'payments_test_%'" |
        while read -r db; do
            [ -n "$db" ] && psql "$TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
        done
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

step "Tests (cargo test --workspace --all-features; database tests on PostgreSQL and SQLite)"
# The crash tests abort the service on purpose: no core files.
ulimit -c 0
cargo test --workspace --all-targets --all-features --locked

step "The engine's schedules (printed: how many, and the seed that replays them)"
# Already run above; again here with their output, so the log says what was explored.
cargo test -p payments-idempotency --all-features --locked --test engine_schedules -- --nocapture 2>&1 |
    grep -E '^(explored|test result|ENGINE_SEED)'

step "The deployed build (no failpoints): the crash, pause and fail variables do nothing"
# Rebuilds only the api crate without features; the contract step below uses this binary too.
cargo test -p payments-api --test api --locked -- without_failpoints::

step "Contract (schemathesis against openapi.yaml)"
bash scripts/contract.sh
