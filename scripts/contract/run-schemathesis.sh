#!/usr/bin/env bash
# Runs schemathesis, with every check, against SPEC at BASE_URL: the one place the command is
# written, so scripts/contract.sh (the real spec) and scripts/contract/prove-it-fails.sh (a
# deliberately broken copy) run exactly the same test.
#
#   scripts/contract/run-schemathesis.sh SPEC BASE_URL WORK_DIR
#
# WORK_DIR receives the JUnit report and Hypothesis' scratch files (nothing lands in the
# checkout). Expects the venv that scripts/contract.sh creates. Exits with schemathesis' code:
# 0 no failures, 1 failures found, anything else an error of the run itself.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 SPEC BASE_URL WORK_DIR (scripts/contract.sh runs it for you)" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
spec=$(realpath "$1")
base_url=$2
mkdir -p "$3"
work_dir=$(realpath "$3")
venv=${CONTRACT_VENV:-$root/target/contract-venv}

if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "run-schemathesis.sh: no schemathesis in $venv; run scripts/contract.sh, which installs it" >&2
    exit 2
fi

# Hypothesis keeps a scratch directory in the working directory: keep it out of the checkout.
cd "$work_dir"
export HYPOTHESIS_STORAGE_DIRECTORY="$work_dir/.hypothesis"
# Fresh Idempotency-Key per request, integer-literal amounts: see the hook file.
export SCHEMATHESIS_HOOKS="$root/scripts/contract/hooks.py"
# The bearer key, read by scripts/contract/schemathesis.toml (the demo tenant `acme`).
export CONTRACT_API_KEY="${CONTRACT_API_KEY:-sk_test_acme}"
export CONTRACT_OPERATOR_KEY="${CONTRACT_OPERATOR_KEY:-sk_test_contract_operator}"

cmd=(
    "$venv/bin/schemathesis"
    --config-file "$root/scripts/contract/schemathesis.toml"
    run "$spec"
    --url "$base_url"
    --checks all
    --max-examples "${CONTRACT_MAX_EXAMPLES:-100}"
    --generation-deterministic
    --workers 1
    --request-timeout 30
    --no-color
    --report junit
    --report-junit-path "$work_dir/junit.xml"
)
printf '+ SCHEMATHESIS_HOOKS=%s %s\n' "$SCHEMATHESIS_HOOKS" "${cmd[*]}"
exec "${cmd[@]}"
