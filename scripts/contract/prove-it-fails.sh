#!/usr/bin/env bash
# Proves the contract test can fail: copies openapi.yaml, breaks the copy on purpose (the
# charge's `amount` becomes a string, so every 201 from POST /charges and every charge that
# GET /charges and GET /charges/{id} return violates it), runs the same schemathesis command
# against the running service with the copy, and succeeds only if schemathesis reports that
# response-schema failure. A broken spec that passes means the check is blind: exit 1.
#
#   scripts/contract/prove-it-fails.sh BASE_URL     # scripts/contract.sh runs it for you
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 BASE_URL (a running payments-api; scripts/contract.sh starts one and runs this)" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
base_url=$1
venv=${CONTRACT_VENV:-$root/target/contract-venv}
work_dir=${CONTRACT_RUN_DIR:-$root/target/contract-run}/prove-it-fails
fail() { printf 'prove-it-fails.sh: %s\n' "$*" >&2; exit 1; }

rm -rf "$work_dir"
mkdir -p "$work_dir"
broken="$work_dir/openapi-broken.yaml"
log="$work_dir/schemathesis.log"

# The venv's Python has PyYAML (a schemathesis dependency).
"$venv/bin/python" - "$root/openapi.yaml" "$broken" <<'EOF' || fail "could not write a broken copy of openapi.yaml"
import sys
import yaml

source, target = sys.argv[1], sys.argv[2]
with open(source) as f:
    spec = yaml.safe_load(f)
try:
    amount = spec["components"]["schemas"]["Charge"]["properties"]["amount"]
except KeyError:
    sys.exit("components.schemas.Charge.properties.amount is not in openapi.yaml: update prove-it-fails.sh")
if amount.get("type") != "integer":
    sys.exit(f"Charge.amount is expected to be an integer in openapi.yaml, found {amount!r}")
spec["components"]["schemas"]["Charge"]["properties"]["amount"] = {"type": "string"}
with open(target, "w") as f:
    yaml.safe_dump(spec, f, sort_keys=False, allow_unicode=True)
print(f"broken copy: {target} (components.schemas.Charge.properties.amount: integer -> string)")
EOF

echo "running schemathesis against the broken copy; it must fail (output in $log)"
set +e
bash "$root/scripts/contract/run-schemathesis.sh" "$broken" "$base_url" "$work_dir" >"$log" 2>&1
status=$?
set -e

expected='Schema at /components/schemas/Charge/properties/amount'
case $status in
    0)
        tail -n 25 "$log" >&2
        fail "the broken spec PASSED: schemathesis did not notice that every charge's amount is
  an integer while the spec says string. The contract test cannot fail as it is; see $log" ;;
    1)
        if grep -q "Response violates schema" "$log" && grep -qF "$expected" "$log"; then
            grep -E '^(_+ .* _+|- ST[0-9]+ )' "$log" | sed 's/^/  /' || true
            echo "OK: schemathesis rejected the broken spec (response schema violation on Charge.amount)"
            exit 0
        fi
        tail -n 40 "$log" >&2
        fail "schemathesis failed, but not on the broken Charge.amount; see $log" ;;
    *)
        tail -n 40 "$log" >&2
        fail "schemathesis could not run (exit $status); see $log" ;;
esac
