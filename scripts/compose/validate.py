#!/usr/bin/env python3
"""Validates a Compose file: the Compose Specification schema, then the cross-references the
schema cannot express.

    python scripts/compose/validate.py [COMPOSE_FILE]      # default: docker-compose.yml

Checks, all reported together (each error names its place in the file):

  1. YAML: parses, has no duplicate keys in a mapping (PyYAML would keep the last one
     silently; Compose rejects the file), and is a mapping at the top.
  2. Schema: the file is valid against compose-spec.json beside this script (the Compose
     Specification's JSON schema, vendored and checked against its sha256; README.md says
     where it comes from). Unknown keys are errors, as they are for Compose.
  3. Every service has an `image`, or a `build` with a context.
  4. Every `depends_on` entry (list or mapping form) names another service of the file, with a
     condition among service_started, service_healthy and service_completed_successfully; a
     service_healthy dependency has a healthcheck here (with a test, not disabled); there is
     no dependency cycle; and a service outside every profile does not require one that is
     only in a profile (`up` would fail as soon as that profile is off).
  5. Every named volume a service mounts is declared under the top-level `volumes`.
  6. Services that build the same `image` name build it the same way (otherwise the last
     build would silently overwrite the other's image).

Needs Python 3.11+, jsonschema and PyYAML (scripts/compose/requirements.txt; run it through
scripts/check-compose.sh, which installs them). Values are checked as written: `${VAR}`
interpolation is not performed. Exit status: 0 valid, 1 invalid, 2 could not check (missing
file, unreadable schema, internal error).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().with_name("compose-spec.json")
# The vendored schema byte for byte as published (README.md: where from, how to update). A
# copy that was edited or reformatted by accident is refused rather than trusted.
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


class CannotCheck(Exception):
    """The file could not be checked at all (exit 2), as opposed to being invalid (exit 1)."""


# --- YAML ---------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping. Keys brought in by a `<<` merge
    may be overridden, as YAML intends; only keys written twice are errors."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {first.start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_compose(path: Path) -> dict[str, Any]:
    """The parsed file; raises CannotCheck if it cannot be read, ValueError if it is not a
    YAML mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CannotCheck(f"cannot read {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text: {error}") from error
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        message = str(error).replace('"<unicode string>"', f'"{path}"')
        raise ValueError(f"not valid YAML: {message}") from error
    if not isinstance(document, dict):
        kind = "empty" if document is None else f"a {type(document).__name__}"
        raise ValueError(f"the top level must be a mapping (services:, volumes:, ...), found {kind}")
    return document


# --- schema -------------------------------------------------------------------------------


def load_validator() -> jsonschema.protocols.Validator:
    try:
        raw = SCHEMA_PATH.read_bytes()
    except OSError as error:
        raise CannotCheck(f"cannot read the schema {SCHEMA_PATH}: {error.strerror or error}") from error
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SCHEMA_SHA256:
        raise CannotCheck(
            f"{SCHEMA_PATH.name} has sha256 {digest}, not the vendored {SCHEMA_SHA256}: it was "
            "changed; restore it, or update SCHEMA_SHA256 and README.md after a deliberate upgrade"
        )
    try:
        schema = json.loads(raw)
    except ValueError as error:
        raise CannotCheck(f"cannot parse the schema {SCHEMA_PATH}: {error}") from error
    # The draft named by its $schema (2020-12). No check_schema() against the metaschema on
    # every run: the bytes are pinned above, and that copy was checked when it was vendored.
    return jsonschema.validators.validator_for(schema)(schema)


def where(path) -> str:
    """`services.payments-api.ports[0]` for the path ("services", "payments-api", "ports", 0)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _leaves(error: jsonschema.ValidationError):
    """The innermost errors under a oneOf/anyOf failure: "is not valid under any of the given
    schemas" alone does not say what is wrong. A branch that failed only because the value
    has another shape (a list where a mapping was given) says nothing useful either, and is
    left out when a branch of the right shape explains the failure."""
    leaves = []

    def walk(e):
        if not e.context:
            leaves.append(e)
        for sub in e.context:
            walk(sub)

    walk(error)
    useful = [
        leaf for leaf in leaves
        if not (leaf.validator == "type" and list(leaf.absolute_path) == list(error.absolute_path))
    ]
    return useful or leaves


def _known_keys(fragment: Any, root: dict[str, Any], seen: set[int] | None = None):
    """Property names and patterns that a schema fragment (with its allOf/anyOf/oneOf/$ref
    parts, refs local to the root schema) can evaluate."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    patterns: list[str] = []
    if not isinstance(fragment, dict) or id(fragment) in seen:
        return names, patterns
    seen.add(id(fragment))
    names.update(fragment.get("properties", {}))
    patterns.extend(fragment.get("patternProperties", {}))
    parts = []
    for key in ("allOf", "anyOf", "oneOf"):
        parts.extend(fragment.get(key, []))
    parts.extend(fragment[key] for key in ("if", "then", "else") if key in fragment)
    parts.extend(fragment.get("dependentSchemas", {}).values())
    ref = fragment.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for token in ref[2:].split("/"):
            token = token.replace("~1", "/").replace("~0", "~")
            target = target.get(token) if isinstance(target, dict) else None
        parts.append(target)
    for part in parts:
        more_names, more_patterns = _known_keys(part, root, seen)
        names |= more_names
        patterns.extend(more_patterns)
    return names, patterns


def _unknown_keys(error: jsonschema.ValidationError, root: dict[str, Any]) -> list[str]:
    """For an `unevaluatedProperties: false` failure, the keys the schema really does not
    know. When one part of an allOf fails (say ports has the wrong type), every key of that
    part counts as unevaluated too; those are reported where they fail, not as unknown."""
    names, patterns = _known_keys(error.schema, root)
    instance = error.instance if isinstance(error.instance, dict) else {}
    return [
        key for key in instance
        if key not in names and not any(re.search(p, key) for p in patterns)
    ]


def schema_errors(validator, document: dict[str, Any]) -> tuple[list[str], set[str]]:
    """One line per schema error, and the paths they cover."""
    errors = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    lines: list[str] = []
    covered: set[str] = set()
    for error in errors:
        here = where(error.absolute_path)
        if error.validator == "unevaluatedProperties" and error.validator_value is False:
            unknown = _unknown_keys(error, validator.schema)
            if not unknown:
                continue  # only keys whose own errors are reported below or above
            lines.append(f"{here}: unknown key(s) {', '.join(map(repr, unknown))}")
            covered.update(f"{here}.{key}" for key in unknown)
            continue
        if error.validator == "additionalProperties" and error.validator_value is False:
            known = error.schema.get("properties", {})
            patterns = list(error.schema.get("patternProperties", {}))
            instance = error.instance if isinstance(error.instance, dict) else {}
            unknown = [k for k in instance if k not in known and not any(re.search(p, k) for p in patterns)]
            if unknown:
                hint = f" (extension keys must match {', '.join(patterns)})" if patterns else ""
                lines.append(f"{here}: unknown key(s) {', '.join(map(repr, unknown))}{hint}")
                covered.update(f"{here}.{key}" for key in unknown)
                continue
        line = f"{here}: {error.message}"
        covered.add(here)
        details = []
        for leaf in _leaves(error):
            if leaf is error:
                continue
            detail = f"{where(leaf.absolute_path)}: {leaf.message}"
            covered.add(where(leaf.absolute_path))
            if detail not in details:
                details.append(detail)
        if details:
            shown = details[:6]
            more = len(details) - len(shown)
            line += "".join(f"\n      - {d}" for d in shown)
            if more:
                line += f"\n      - ... {more} more"
        lines.append(line)
    return lines, covered


# --- cross-references ---------------------------------------------------------------------


def _is_path(source: str) -> bool:
    """A bind-mount source (a path), as Compose tells it from a volume name. A source that
    starts with `$` is only known after interpolation, which this script does not do: it is
    treated as a path, i.e. not checked."""
    return (
        source.startswith(("/", ".", "~", "$", "\\\\"))
        or (len(source) >= 3 and source[0].isalpha() and source[1] == ":" and source[2] in "\\/")
    )


def _named_volume(mount: Any) -> str | None:
    """The named volume a service's `volumes` entry mounts, or None for a bind mount, an
    anonymous volume, a tmpfs or anything else."""
    if isinstance(mount, str):
        if _is_path(mount):
            return None  # "./x:/y", "/x:/y", "C:\\x:/y": bind mounts; "${VAR}:/y": unknown
        parts = mount.split(":")
        if len(parts) < 2 or not parts[0]:
            return None  # "/data" alone is an anonymous volume
        return parts[0]
    if isinstance(mount, dict) and mount.get("type") == "volume":
        source = mount.get("source")
        if isinstance(source, str) and source and not _is_path(source):
            return source
    return None


def _dependencies(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """depends_on in its long form: {name: {condition, required, ...}}."""
    depends_on = service.get("depends_on")
    if isinstance(depends_on, list):
        return {name: {"condition": "service_started"} for name in depends_on if isinstance(name, str)}
    if isinstance(depends_on, dict):
        return {
            name: (spec if isinstance(spec, dict) else {})
            for name, spec in depends_on.items()
            if isinstance(name, str)
        }
    return {}


def _has_usable_healthcheck(service: dict[str, Any]) -> bool:
    check = service.get("healthcheck")
    if not isinstance(check, dict) or check.get("disable") is True:
        return False
    test = check.get("test")
    if isinstance(test, list):
        return bool(test) and test[0] != "NONE"
    return isinstance(test, str) and bool(test.strip())


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt in graph and nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def reference_errors(document: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    services = document.get("services")
    if not isinstance(services, dict) or not services:
        return ["services: the file defines no service"]
    declared_volumes = document.get("volumes")
    declared_volumes = set(declared_volumes) if isinstance(declared_volumes, dict) else set()

    graph: dict[str, list[str]] = {}
    builds_by_image: dict[str, list[tuple[str, Any]]] = {}

    for name, service in services.items():
        here = f"services.{name}"
        if not isinstance(service, dict):
            errors.append(f"{here}: a service must be a mapping")
            continue

        # 3. something to run
        build = service.get("build")
        if isinstance(build, dict):
            context = build.get("context")
            if not (isinstance(context, str) and context.strip()):
                errors.append(f"{here}.build: has no context (the directory to build from)")
        elif isinstance(build, str) and not build.strip():
            errors.append(f"{here}.build: is an empty context")
        if build is None and not service.get("image"):
            errors.append(f"{here}: has neither build nor image, so there is nothing to run")
        image = service.get("image")
        if build is not None and isinstance(image, str) and image:
            builds_by_image.setdefault(image, []).append((name, build))

        # 4. dependencies
        graph[name] = []
        for target, spec in _dependencies(service).items():
            dep_here = f"{here}.depends_on.{target}"
            graph[name].append(target)
            if target == name:
                errors.append(f"{dep_here}: a service cannot depend on itself")
                continue
            if target not in services:
                known = ", ".join(sorted(services))
                errors.append(f"{dep_here}: no service named {target!r} is defined (services: {known})")
                continue
            condition = spec.get("condition", "service_started")
            if condition not in CONDITIONS:
                errors.append(f"{dep_here}.condition: {condition!r} is not one of {', '.join(CONDITIONS)}")
            target_service = services[target]
            if not isinstance(target_service, dict):
                continue
            if condition == "service_healthy" and not _has_usable_healthcheck(target_service):
                errors.append(
                    f"{dep_here}: waits for service_healthy, but {target!r} has no healthcheck "
                    "with a test in this file (it would never become healthy)"
                )
            if (
                not service.get("profiles")
                and target_service.get("profiles")
                and spec.get("required", True) is not False
            ):
                errors.append(
                    f"{dep_here}: {name!r} is in no profile but requires {target!r}, which is only "
                    f"in profiles {target_service.get('profiles')}: it fails whenever they are off"
                )

        # 5. named volumes
        mounts = service.get("volumes")
        for index, mount in enumerate(mounts if isinstance(mounts, list) else []):
            volume = _named_volume(mount)
            if volume is not None and volume not in declared_volumes:
                errors.append(
                    f"{here}.volumes[{index}]: mounts the named volume {volume!r}, which is not "
                    "declared under the top-level volumes"
                )

    cycle = _find_cycle(graph)
    if cycle:
        errors.append(f"services: depends_on has a cycle: {' -> '.join(cycle)}")

    # 6. one image name, one way to build it
    for image, builds in sorted(builds_by_image.items()):
        first_name, first_build = builds[0]
        for other_name, other_build in builds[1:]:
            if _normalise_build(other_build) != _normalise_build(first_build):
                errors.append(
                    f"services.{other_name}.build: builds image {image!r} differently from "
                    f"services.{first_name}.build; one build would overwrite the other"
                )
    return errors


def _normalise_build(build: Any) -> Any:
    return {"context": build} if isinstance(build, str) else build


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = Path(argv[0] if argv else "docker-compose.yml")
    validator = load_validator()
    try:
        document = load_compose(path)
    except ValueError as error:
        print(f"{path}: INVALID\n  - {error}", file=sys.stderr)
        return 1

    lines, covered = schema_errors(validator, document)
    problems = [f"schema: {line}" for line in lines]
    # A reference error at a place the schema already reported (a condition outside the
    # enum, say) would only repeat it.
    problems += [e for e in reference_errors(document) if e.split(": ", 1)[0] not in covered]
    if problems:
        print(f"{path}: INVALID, {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1

    services = document["services"]
    profiled = sorted(n for n, s in services.items() if s.get("profiles"))
    volumes = sorted(document.get("volumes") or {})
    print(
        f"{path}: OK: valid against {SCHEMA_PATH.name}; {len(services)} services "
        f"({', '.join(services)}), profile-only: {', '.join(profiled) or 'none'}, "
        f"named volumes: {', '.join(volumes) or 'none'}; every depends_on, healthcheck and "
        "volume reference resolves"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CannotCheck as error:
        print(f"validate.py: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception:  # noqa: BLE001 (a bug here must not look like an invalid file)
        traceback.print_exc()
        print("validate.py: internal error (above); the file was not checked", file=sys.stderr)
        sys.exit(2)
