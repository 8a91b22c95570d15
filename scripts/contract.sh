#!/usr/bin/env bash
# Contract test: the real service against openapi.yaml, with schemathesis.
#
#  1. Installs the pinned schemathesis (scripts/contract/requirements.txt) into a Python venv
#     at target/contract-venv, or reuses it when it is up to date.
#  2. Creates a fresh PostgreSQL database and starts the built target/debug/payments-api on a
#     random port (building it only if it is missing), with its Redis keys under a private
#     prefix.
#  3. Runs schemathesis against openapi.yaml with every check (status codes documented,
#     response schemas, content types, response headers, no server errors, negative data
#     rejected, valid data accepted, missing headers and auth, unsupported methods...), a
#     bounded, deterministic set of cases, and a fresh Idempotency-Key per request
#     (scripts/contract/hooks.py, scripts/contract/schemathesis.toml). It must pass.
#  4. Runs the same command against a deliberately broken copy of the spec
#     (scripts/contract/prove-it-fails.sh). It must fail, or the check is blind.
#  Then stops the service and drops the database and the Redis keys, also on failure or ^C.
#
#   scripts/contract.sh
#   CONTRACT_MAX_EXAMPLES=300 scripts/contract.sh    # more cases per operation (default 100)
#
# Uses TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres; its user must
# be allowed to create databases) and TEST_REDIS_URL (default redis://127.0.0.1:6379), like
# scripts/test.sh. Logs and reports go to target/contract-run/. Safe to re-run: databases
# left by interrupted runs are dropped first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

say() { printf 'contract: %s\n' "$*"; }
fail() { printf 'contract.sh: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    "") ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown argument: $1 (try --help)" ;;
esac

admin_url=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
redis_url=${TEST_REDIS_URL:-redis://127.0.0.1:6379}
target_dir=${CARGO_TARGET_DIR:-$root/target}
venv=$root/target/contract-venv
run_dir=$root/target/contract-run
python=${CONTRACT_PYTHON:-python3}
export CONTRACT_VENV=$venv CONTRACT_RUN_DIR=$run_dir

command -v psql >/dev/null 2>&1 ||
    fail "psql is not installed: it creates and drops the test database (apt-get install postgresql-client)"
[[ $admin_url =~ ^(postgres(ql)?://[^/?]+) ]] ||
    fail "TEST_DATABASE_URL=$admin_url is not a postgres:// URL"
server_url=${BASH_REMATCH[1]}

# --- 1. schemathesis in a venv, pinned ------------------------------------------------------
requirements=scripts/contract/requirements.txt
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp=$venv/.requirements.sha256
if [ -x "$venv/bin/schemathesis" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ]; then
    say "reusing $venv ($("$venv/bin/schemathesis" --version))"
else
    if ! { [ -x "$venv/bin/python" ] &&
        "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; }; then
        command -v "$python" >/dev/null 2>&1 ||
            fail "$python not found: schemathesis needs Python 3.11 or newer (set CONTRACT_PYTHON)"
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            fail "$python is $("$python" -V 2>&1); schemathesis needs 3.11 or newer (set CONTRACT_PYTHON)"
        say "creating $venv with $("$python" -V 2>&1)"
        rm -rf "$venv"
        "$python" -m venv "$venv" ||
            fail "could not create a venv with $python (on Debian: apt-get install python3-venv)"
    fi
    say "installing $(grep -m1 '^schemathesis==' "$requirements") and its pinned dependencies"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements" ||
        fail "pip could not install $requirements into $venv (is PyPI reachable?)"
    echo "$wanted" >"$stamp"
    say "installed $("$venv/bin/schemathesis" --version)"
fi

# --- 2. a fresh database and the service ----------------------------------------------------
bin=$target_dir/debug/payments-api
if [ ! -x "$bin" ]; then
    say "$bin is missing; building it (cargo build -p payments-api)"
    cargo build -p payments-api || fail "cargo build -p payments-api failed"
fi

# Databases of interrupted runs: payments_contract_<pid>_<n>, whose process is gone.
psql "$admin_url" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'payments_contract_%'" 2>/dev/null |
    while read -r old; do
        pid=${old#payments_contract_}
        pid=${pid%%_*}
        if [ -n "$old" ] && ! kill -0 "$pid" 2>/dev/null; then
            psql "$admin_url" -qc "DROP DATABASE IF EXISTS \"$old\" WITH (FORCE)" >/dev/null 2>&1 || true
        fi
    done

id="$$_$RANDOM"
db="payments_contract_$id"
redis_prefix="contract:$id"
service_pid=""
db_created=""

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$service_pid" ] && kill -0 "$service_pid" 2>/dev/null; then
        kill "$service_pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$service_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$service_pid" 2>/dev/null || true
    fi
    [ -n "$service_pid" ] && wait "$service_pid" 2>/dev/null || true
    if [ -n "$db_created" ]; then
        psql "$admin_url" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 ||
            echo "contract.sh: could not drop database $db; drop it by hand" >&2
    fi
    if command -v redis-cli >/dev/null 2>&1; then
        redis-cli -u "$redis_url" --scan --pattern "$redis_prefix:*" 2>/dev/null |
            xargs -r -d '\n' redis-cli -u "$redis_url" DEL >/dev/null 2>&1 || true
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

psql "$admin_url" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE \"$db\"" >/dev/null ||
    fail "could not create database $db at $admin_url: is PostgreSQL running and may its user create databases?"
db_created=1

mkdir -p "$run_dir"
log=$run_dir/service.log
say "starting $bin (database $db, Redis prefix $redis_prefix); log: $log"
# An operator key for the operator endpoints, configured as its hash like any key.
operator_key=${CONTRACT_OPERATOR_KEY:-sk_test_contract_operator}
operator_config=$run_dir/operator.toml
printf '[[auth.operator_keys]]\nkey_sha256 = "%s"\nname = "contract"\n' \
    "$(printf %s "$operator_key" | sha256sum | cut -d' ' -f1)" >"$operator_config"
service_env=(
    PAYMENTS_CONFIG="$operator_config"
    DATABASE_URL="$server_url/$db"
    REDIS_URL="$redis_url"
    PAYMENTS__SERVER__BIND=127.0.0.1:0
    PAYMENTS__SERVER__METRICS_BIND=127.0.0.1:0
    PAYMENTS__REDIS__CACHE_SECRET="contract-cache-secret-$redis_prefix"
    PAYMENTS__REDIS__STREAM="$redis_prefix:events"
    PAYMENTS__REDIS__KEY_PREFIX="$redis_prefix"
    PAYMENTS__LOG__FORMAT=text
    RUST_LOG=info
    NO_COLOR=1
)
env -u PAYMENTS_CRASH_AT -u PAYMENTS_PAUSE_AT "${service_env[@]}" "$bin" >"$log" 2>&1 &
service_pid=$!

address=""
for _ in $(seq 1 600); do
    address=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o -m1 'listening address=[0-9.]*:[0-9]*' || true)
    [ -n "$address" ] && break
    if ! kill -0 "$service_pid" 2>/dev/null; then
        tail -n 30 "$log" >&2
        fail "payments-api exited before it was listening (log above, in $log)"
    fi
    sleep 0.1
done
if [ -z "$address" ]; then
    tail -n 30 "$log" >&2
    fail "payments-api printed no 'listening address=' line within 60 s (log above, in $log)"
fi
base_url="http://${address#listening address=}"
say "service is listening at $base_url"

# --- 3. the real spec must pass -------------------------------------------------------------
say "schemathesis against openapi.yaml (must pass)"
real_ok=1
bash scripts/contract/run-schemathesis.sh openapi.yaml "$base_url" "$run_dir/real" || real_ok=0

# --- 4. a broken copy must fail -------------------------------------------------------------
say "schemathesis against a deliberately broken copy of openapi.yaml (must fail)"
proof_ok=1
bash scripts/contract/prove-it-fails.sh "$base_url" || proof_ok=0

if [ "$real_ok" = 1 ] && [ "$proof_ok" = 1 ]; then
    say "OK: the service conforms to openapi.yaml, and a broken spec is caught"
    exit 0
fi
[ "$real_ok" = 1 ] ||
    printf 'contract.sh: schemathesis found failures against openapi.yaml (above; JUnit report %s, service log %s)\n' \
        "$run_dir/real/junit.xml" "$log" >&2
[ "$proof_ok" = 1 ] ||
    printf 'contract.sh: the proof that the check can fail did not hold (above; %s)\n' "$run_dir/prove-it-fails" >&2
exit 1
