#!/usr/bin/env bash
# Checks docker-compose.yml with real tools:
#
#  1. Installs the pinned check-jsonschema and PyYAML (scripts/compose/requirements.txt) into a
#     Python venv at target/compose-venv, or reuses it when it is up to date (a stamp in the
#     venv holds the sha256 of requirements.txt).
#  2. Validates the file: with a Docker engine, `docker compose config -q` (or v1's
#     `docker-compose config -q`); without one, `check-jsonschema --builtin-schema
#     vendor.compose-spec`.
#  3. Checks what neither tool does (scripts/compose/references.py): every depends_on names a
#     service, and a dependency with a healthcheck is waited for with it.
#  4. Proves the check can fail: three broken copies of the file must each be rejected.
#  5. Checks that the Dockerfile's dependency layer copies the manifest of every workspace member
#     (a member it misses fails the image build, late), and that a copy missing one is rejected.
#
#   scripts/check-compose.sh                    # docker-compose.yml
#   scripts/check-compose.sh other-compose.yml
#
# Safe to re-run. COMPOSE_PYTHON names the Python (3.11 or newer) the venv is created with
# (default python3).
set -euo pipefail
case "${1:-}" in
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
# A compose file named on the command line is relative to where the script was started.
case "${1:-}" in
    "" | -* | /*) ;;
    *) set -- "$PWD/$1" "${@:2}" ;;
esac
cd "$(dirname "$0")/.."

say() { printf 'check-compose: %s\n' "$*"; }
fail() { printf 'check-compose.sh: %s\n' "$*" >&2; exit 1; }

[ $# -le 1 ] || fail "too many arguments (try --help)"
case "${1:-}" in -*) fail "unknown option: $1 (try --help)" ;; esac
compose=${1:-docker-compose.yml}
[ -f "$compose" ] || fail "$compose does not exist"

venv=target/compose-venv
python=${COMPOSE_PYTHON:-python3}
requirements=scripts/compose/requirements.txt

# --- 1. the tools, pinned, in a venv -----------------------------------------------------
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp=$venv/.requirements.sha256
if [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] && [ -x "$venv/bin/check-jsonschema" ]; then
    say "reusing $venv (requirements unchanged)"
else
    command -v "$python" >/dev/null 2>&1 ||
        fail "$python not found: the check needs Python 3.11 or newer (set COMPOSE_PYTHON)"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        fail "$python is $("$python" -V 2>&1); the check needs 3.11 or newer (set COMPOSE_PYTHON)"
    say "creating $venv with $("$python" -V 2>&1)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv" ||
        fail "could not create a venv with $python (on Debian: apt-get install python3-venv)"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements" ||
        fail "pip could not install $requirements into $venv (is PyPI reachable?)"
    echo "$wanted" >"$stamp"
fi

# Which tool validates: the engine's own compose when an engine answers, else the schema.
if docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    tool="docker compose config -q"
    validate() { docker compose -f "$1" config -q; }
elif docker info >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; then
    tool="docker-compose config -q"
    validate() { docker-compose -f "$1" config -q; }
else
    tool="check-jsonschema --builtin-schema vendor.compose-spec"
    validate() { "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$1"; }
fi
check() { validate "$1" && "$venv/bin/python" scripts/compose/references.py "$1"; }

# --- 2 and 3. the real file ----------------------------------------------------------------
say "validating $compose with $tool, then its references"
check "$compose" || fail "$compose is not valid (problems above)"

# --- 4. the check can fail ----------------------------------------------------------------
broken=$(mktemp -d)
trap 'rm -rf "$broken"' EXIT
# A copy with one line replaced (sed expression), which the check must reject.
must_reject() {
    local what=$1 edit=$2 copy
    copy="$broken/$(tr ' ' '-' <<<"$what").yml"
    sed -E "$edit" "$compose" >"$copy"
    cmp -s "$compose" "$copy" && fail "self-test: the edit for '$what' changed nothing"
    if check "$copy" >/dev/null 2>&1; then
        fail "self-test: a file where $what was accepted"
    fi
    say "self-test: rejected a file where $what"
}
must_reject "a service has a key the specification does not know" \
    '0,/^    image: /s//    imagee: /'
must_reject "payments-api no longer waits for the PostgreSQL healthcheck" \
    '0,/condition: service_healthy/s//condition: service_started/'
must_reject "payments-api depends on a service that does not exist" \
    '0,/^      postgres:$/s//      postgresql:/'
say "OK: $compose is valid, and the check rejects every broken copy"

# --- 5. the Dockerfile copies every member's manifest -------------------------------------
# The members, as the workspace's Cargo.toml lists them on its `members` line.
members=$(sed -n 's/^members *= *\[\(.*\)\]/\1/p' Cargo.toml | tr -d '" ' | tr ',' ' ')
[ -n "$members" ] || fail "no members line in Cargo.toml"
# The members whose manifest the Dockerfile `$1` does not copy, one per line.
uncopied() {
    local member
    for member in $members; do
        grep -qx "COPY $member/Cargo.toml $member/" "$1" || echo "$member"
    done
}
missing=$(uncopied Dockerfile)
[ -z "$missing" ] || fail "the Dockerfile copies no manifest of: $(echo $missing) (add COPY <member>/Cargo.toml <member>/)"
sed '0,/^COPY crates\/.*\/Cargo.toml/{//d}' Dockerfile >"$broken/Dockerfile"
[ -n "$(uncopied "$broken/Dockerfile")" ] ||
    fail "self-test: a Dockerfile missing a member's manifest was accepted"
say "OK: the Dockerfile copies every member's manifest ($(echo $members | wc -w)), and one missing is found"
