#!/usr/bin/env bash
# Proves scripts/compose/validate.py can fail: writes deliberately broken copies of the
# compose file to a temporary directory, one fault each, and requires the validator to reject
# every copy (exit 1, with the message that names that fault) and to accept the real file
# (exit 0). A broken copy that passes, or fails for another reason, means the check is blind
# to that fault: exit 1.
#
#   scripts/compose/selftest.sh [COMPOSE_FILE]     # default docker-compose.yml
#
# scripts/check-compose.sh runs it with the Python of target/compose-venv (it has jsonschema
# and PyYAML); set COMPOSE_VENV to use another venv.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${COMPOSE_VENV:-$root/target/compose-venv}
python=$venv/bin/python
validator=$root/scripts/compose/validate.py
compose=${1:-$root/docker-compose.yml}
fail() { printf 'selftest.sh: %s\n' "$*" >&2; exit 1; }

[ -x "$python" ] || fail "$python is missing: run scripts/check-compose.sh, which creates the venv"
[ -f "$compose" ] || fail "$compose does not exist"

work=$(mktemp -d "${TMPDIR:-/tmp}/compose-selftest.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Each case: <name>.yml (the broken copy) and <name>.expect (text the rejection must contain).
# The faults are put on whatever services of the real file fit, so the cases follow the file
# as it changes; a file that offers no place for a fault fails here, loudly.
"$python" - "$compose" "$work" <<'PY' || fail "could not write the broken copies"
import copy
import sys
from pathlib import Path

import yaml

source, out = Path(sys.argv[1]), Path(sys.argv[2])
text = source.read_text(encoding="utf-8")
original = yaml.safe_load(text)
services = original["services"]


def need(found, what):
    if not found:
        sys.exit(f"selftest: {source} has no {what}; adapt this case in scripts/compose/selftest.sh")
    return found[0]


def deps(service):
    d = service.get("depends_on") or {}
    return {name: {"condition": "service_started"} for name in d} if isinstance(d, list) else d


with_build = need([n for n, s in services.items() if isinstance(s.get("build"), dict)], "service with a build mapping")
with_ports = need([n for n, s in services.items() if s.get("ports")], "service with ports")
with_volume = need(
    [(n, i, v.split(":")[0]) for n, s in services.items() for i, v in enumerate(s.get("volumes") or [])
     if isinstance(v, str) and ":" in v and not v.startswith(("/", ".", "~", "$"))],
    "service that mounts a named volume (short syntax)",
)
healthy = need(
    [(n, t) for n, s in services.items() for t, spec in deps(s).items()
     if isinstance(spec, dict) and spec.get("condition") == "service_healthy"],
    "service_healthy dependency",
)
always_on = need([n for n, s in services.items() if not s.get("profiles")], "service outside every profile")
any_dependency = need([(n, t) for n, s in services.items() for t in deps(s)], "depends_on entry")
shared_image = [
    (a, b) for a in services for b in services
    if a < b and services[a].get("build") and services[b].get("build")
    and services[a].get("image") and services[a].get("image") == services[b].get("image")
]

cases = {}


def case(name, expect, mutate):
    doc = copy.deepcopy(original)
    mutate(doc)
    cases[name] = (yaml.safe_dump(doc, sort_keys=False), expect)


def add_dep(doc, service, target, spec):
    s = doc["services"][service]
    d = deps(s)
    d[target] = spec
    s["depends_on"] = d


case("depends-on-missing-service", "no service named 'ghost-service' is defined",
     lambda d: add_dep(d, always_on, "ghost-service", {"condition": "service_started"}))
case("depends-on-missing-service-list-form", "no service named 'ghost-list' is defined",
     lambda d: d["services"][always_on].__setitem__("depends_on", ["ghost-list"]))
case("neither-build-nor-image", f"services.{with_build}: has neither build nor image",
     lambda d: [d["services"][with_build].pop(k, None) for k in ("build", "image")])
case("build-without-context", f"services.{with_build}.build: has no context",
     lambda d: d["services"][with_build]["build"].pop("context"))
case("ports-as-a-string", f"services.{with_ports}.ports: '8080' is not of type 'array'",
     lambda d: d["services"][with_ports].__setitem__("ports", "8080"))
case("unknown-top-level-key", "(top level): unknown key(s) 'bogus'",
     lambda d: d.__setitem__("bogus", {"enabled": True}))
case("unknown-service-key", f"services.{with_ports}: unknown key(s) 'restart_policy'",
     lambda d: d["services"][with_ports].__setitem__("restart_policy", "always"))
case("condition-not-in-the-enum", "'service_ready' is not one of",
     lambda d: add_dep(d, healthy[0], healthy[1], {"condition": "service_ready"}))
case("service-healthy-without-healthcheck",
     f"services.{healthy[0]}.depends_on.{healthy[1]}: waits for service_healthy, but '{healthy[1]}' has no healthcheck",
     lambda d: d["services"][healthy[1]].pop("healthcheck", None))
case("dependency-cycle", "depends_on has a cycle",
     lambda d: add_dep(d, any_dependency[1], any_dependency[0], {"condition": "service_started"}))


def depend_on_profile_only(doc):
    doc["services"]["profiled-helper"] = {"image": "busybox", "profiles": ["extra"]}
    add_dep(doc, always_on, "profiled-helper", {"condition": "service_started"})


case("always-on-service-requires-a-profile-only-one",
     f"services.{always_on}.depends_on.profiled-helper: '{always_on}' is in no profile", depend_on_profile_only)
case("undeclared-named-volume",
     f"services.{with_volume[0]}.volumes[{with_volume[1]}]: mounts the named volume '{with_volume[2]}', which is not declared",
     lambda d: d.pop("volumes", None))
case("undeclared-named-volume-long-syntax",
     f"services.{with_volume[0]}.volumes[1]: mounts the named volume 'ghost-volume', which is not declared",
     lambda d: d["services"][with_volume[0]].__setitem__(
         "volumes", [d["services"][with_volume[0]]["volumes"][0],
                     {"type": "volume", "source": "ghost-volume", "target": "/ghost"}]))
if shared_image:
    a, b = shared_image[0]
    case("one-image-built-two-ways", f"builds image '{original['services'][a]['image']}' differently",
         lambda d: d["services"][b].__setitem__("build", {"context": "./elsewhere"}))

# Text-level faults, which a parsed-and-dumped copy cannot carry.
cases["duplicate-key"] = (text + "\nservices:\n  extra:\n    image: busybox\n", "found duplicate key 'services'")
cases["not-yaml"] = ("services:\n  api:\n    image: [unclosed\n", "not valid YAML")

for name, (body, expect) in cases.items():
    (out / f"{name}.yml").write_text(body, encoding="utf-8")
    (out / f"{name}.expect").write_text(expect, encoding="utf-8")
print(f"wrote {len(cases)} broken copies of {source.name}")
PY

failures=0
cases=0
for broken in "$work"/*.yml; do
    name=$(basename "$broken" .yml)
    expect=$(cat "$work/$name.expect")
    cases=$((cases + 1))
    set +e
    output=$("$python" "$validator" "$broken" 2>&1)
    status=$?
    set -e
    if [ "$status" = 1 ] && grep -qF -- "$expect" <<<"$output"; then
        printf '  rejected as expected: %s\n' "$name"
    else
        failures=$((failures + 1))
        if [ "$status" = 0 ]; then
            printf '  NOT REJECTED: %s (the validator accepted it)\n' "$name" >&2
        else
            printf '  WRONG REJECTION: %s (exit %s; expected exit 1 with: %s)\n' "$name" "$status" "$expect" >&2
        fi
        sed 's/^/      | /' <<<"$output" >&2
    fi
done

set +e
output=$("$python" "$validator" "$compose" 2>&1)
status=$?
set -e
if [ "$status" != 0 ]; then
    sed 's/^/      | /' <<<"$output" >&2
    fail "the real file $compose is rejected (exit $status), so the cases above prove nothing"
fi
echo "  accepted as expected: $(basename "$compose")"

[ "$failures" = 0 ] || fail "$failures of $cases broken copies were not rejected as expected (above): the validator is blind to them"
echo "selftest: OK: all $cases broken copies rejected, each for its own fault, and the real file accepted"
