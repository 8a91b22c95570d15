#!/usr/bin/env bash
# Checks docker-compose.yml without Docker (no engine, no compose plugin needed):
#
#  1. Installs the pinned jsonschema and PyYAML (scripts/compose/requirements.txt) into a
#     Python venv at target/compose-venv, or reuses it when it is up to date (a stamp in the
#     venv holds the sha256 of requirements.txt).
#  2. Validates the compose file with scripts/compose/validate.py: the Compose Specification
#     JSON schema (vendored in scripts/compose/compose-spec.json), then what the schema cannot
#     express: every service has an image or a build context, every depends_on names a
#     defined service with a valid condition (and a healthcheck behind service_healthy), no
#     dependency cycle, every mounted named volume is declared.
#  3. Runs scripts/compose/selftest.sh: broken copies of the file, one fault each, must all be
#     rejected, or the check is blind.
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

# --- 1. jsonschema and PyYAML in a venv, pinned -------------------------------------------
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp=$venv/.requirements.sha256
if [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] &&
    "$venv/bin/python" -c 'import jsonschema, yaml' 2>/dev/null; then
    say "reusing $venv (requirements unchanged)"
else
    if ! { [ -x "$venv/bin/python" ] &&
        "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }; then
        command -v "$python" >/dev/null 2>&1 ||
            fail "$python not found: the validator needs Python 3.11 or newer (set COMPOSE_PYTHON)"
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            fail "$python is $("$python" -V 2>&1); the validator needs 3.11 or newer (set COMPOSE_PYTHON)"
        say "creating $venv with $("$python" -V 2>&1)"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        "$python" -m venv "$venv" ||
            fail "could not create a venv with $python (on Debian: apt-get install python3-venv)"
    fi
    say "installing $(grep -E '^(jsonschema|PyYAML)==' "$requirements" | paste -sd' ') and their pinned dependencies"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements" ||
        fail "pip could not install $requirements into $venv (is PyPI reachable?)"
    echo "$wanted" >"$stamp"
fi

# --- 2. the real file ---------------------------------------------------------------------
say "validating $compose against the Compose Specification schema and its cross-references"
"$venv/bin/python" scripts/compose/validate.py "$compose" ||
    fail "$compose is not valid (problems above)"

# --- 3. the check can fail ----------------------------------------------------------------
say "self-test: broken copies of $compose must all be rejected"
COMPOSE_VENV=$venv bash scripts/compose/selftest.sh "$compose" ||
    fail "the self-test failed (above): the validator cannot be trusted as it is"

say "OK: $compose is valid, and the validator rejects every broken copy"
