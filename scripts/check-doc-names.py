#!/usr/bin/env python3
"""Fails when README.md or docs/*.md names, in backticks, a code name the code no longer has.

Documents describe the code by its names; when the code moves on and a document does not, the
document points readers at things that are gone. Checked, outside fenced code blocks:
  - a path (a `/`, or a known extension): it exists from the repository root, from the
    document's directory, or as the tail of an existing path (`routes/mod.rs`, `sqlite/`);
  - `file.rs::item`: the file exists and names the item;
  - `a::b::c`: `c` is in the code; if `b` is a type, so is `b`; if `b` is a module of the
    workspace, its own file (`b.rs`, `b/mod.rs`) names `c`;
  - `section.key` of a configuration section, or `PAYMENTS__SECTION__KEY`: `key` is in
    crates/api/src/config.rs or defaults.toml; other dotted names (log fields, event types,
    `Type.field`, `table.column`) appear in the code;
  - an identifier in CamelCase, with an `_`, or written as a call (`name()`, `name!`).
Skipped: text with spaces (commands, SQL), HTTP paths, URLs, headers, JSON, numbers,
placeholders (`<...>`, `$VAR`), ALL-CAPS words without `_` (SQL and Redis keywords).
"The code" is every *.rs, *.sql, *.toml, *.yaml, *.yml, *.sh, *.py and *.lua file outside
target/, without its whole-line comments: a name only a comment keeps alive still fails.
Prints `file:line: name` for each offender and exits 1 if there is any.
"""
import os
import re
import sys

# Deliberate exceptions: names that are right but cannot be found this way.
ALLOW = {
    ".sqlx/",  # sqlx's offline cache, which the project deliberately does not have
    "req/s",  # a unit
    # PostgreSQL's and sqlx's own names, in the benchmarks' and the lock order's explanations
    "pg_test_fsync", "max_wal_size", "pg_partman", "Close", "ReadyForQuery", "PoolConnection::return_to_pool",
    "deadlock_timeout",
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_EXT = (".rs", ".sql", ".toml", ".yaml", ".yml", ".sh", ".py", ".lua")
PATH_EXT = CODE_EXT + (".md", ".json", ".txt", ".svg")
COMMENT = {".rs": "//", ".sql": "--"}  # everything else comments with `#`
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

paths, code, module_text = set(), {}, {}
for top, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if d not in (".git", "target")]
    rel_dir = os.path.relpath(top, ROOT).replace(os.sep, "/")
    rel_dir = "" if rel_dir == "." else rel_dir + "/"
    paths.add(rel_dir)
    for name in files:
        rel = rel_dir + name
        paths.add(rel)
        ext = os.path.splitext(name)[1]
        if ext not in CODE_EXT or rel == "scripts/check-doc-names.py":
            continue
        with open(os.path.join(top, name), encoding="utf-8", errors="replace") as f:
            marker = COMMENT.get(ext, "#")
            code[rel] = "\n".join(l for l in f if not l.lstrip().startswith(marker))
ALL_CODE = "\n".join(code.values())
DEFAULTS = code.get("crates/api/src/defaults.toml", "")
CONFIG = code.get("crates/api/src/config.rs", "") + DEFAULTS
CONFIG_SECTIONS = set(re.findall(r"^\[(\w+)\]", DEFAULTS, re.M))
TABLES = set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", ALL_CODE))
for rel, text in code.items():  # a module's own file: `x.rs` or `x/mod.rs`
    parts = rel[:-3].split("/")
    if rel.endswith(".rs") and parts[-1] not in ("lib", "main"):
        name = parts[-2] if parts[-1] == "mod" else parts[-1]
        module_text[name] = module_text.get(name, "") + text
for rel in [r for r in code if r.endswith("Cargo.toml")]:  # crates: payments_api -> its lib.rs
    m = re.search(r'^name = "([\w-]+)"', code[rel], re.M)
    lib = rel.replace("Cargo.toml", "src/lib.rs")
    if m and lib in code:
        module_text[m.group(1).replace("-", "_")] = code[lib]
WORDS = {}  # the identifiers of each text searched, for fast look-ups


def in_code(name, text=ALL_CODE):
    if re.fullmatch(r"\w+", name):
        if id(text) not in WORDS:
            WORDS[id(text)] = set(re.findall(r"\w+", text))
        return name in WORDS[id(text)]
    return re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text) is not None


def path_exists(p, doc_dir):
    p = p[2:] if p.startswith("./") else p
    here = os.path.normpath(doc_dir + p).replace(os.sep, "/")
    return any(x in paths or x + "/" in paths for x in (p.rstrip("/"), here)) or any(
        x.endswith("/" + p) for x in paths)  # the tail of a path: `routes/mod.rs`, `sqlite/`


def expand(s):  # `a/{b,c}/d` -> `a/b/d`, `a/c/d`
    m = re.search(r"\{([^{}]*)\}", s)
    return [s] if not m else [t for alt in m.group(1).split(",") for t in expand(s[:m.start()] + alt + s[m.end():])]


def rust_path_ok(s):
    segs = [x for x in s.split("::") if x and x != ".."]
    if "{" in s or ".." in s or s.endswith("::"):  # a module prefix, or tests generated per backend
        return all(in_code(x) for x in segs if "{" not in x)
    parent, last = segs[-2], segs[-1]
    if not in_code(last) or parent[0].isupper() and not in_code(parent):
        return False
    return in_code(last, module_text[parent]) if parent in module_text else True


def dotted_ok(s):
    first, last = s.split(".")[0], s.split(".")[-1]
    return (in_code(s)  # log fields, event types, operation names appear whole
            or first in CONFIG_SECTIONS and in_code(last, CONFIG)  # a setting
            or (first[0].isupper() or first in TABLES) and in_code(first) and in_code(last))  # Type.field, table.column


def ok(s, doc_dir):
    if s in ALLOW or path_exists(s, doc_dir):
        return True
    if m := re.fullmatch(rf"({IDENT})<([^<>]*)>", s):  # `Idempotent<O>`: the type and its CamelCase arguments
        return all(in_code(t) for t in [m.group(1)] + re.findall(r"\b[A-Z][a-z]\w*", m.group(2)))
    if re.search(r"\s|^/|://|[$<>=\"'|+@]|^[\d.:-]+$", s):  # commands, HTTP paths, URLs, JSON, numbers
        return True
    s = re.sub(r"(\(\)|!|\[\])$", "", s).replace("[]", "")
    if m := re.fullmatch(rf"({IDENT})\{{.*\}}", s):  # `metric{label="x"}`
        s = m.group(1)
    if m := re.fullmatch(r"([\w/.-]+\.rs)::(.+)", s):  # `routes/mod.rs::app`
        files = [p for p in code if p == m.group(1) or p.endswith("/" + m.group(1))]
        return any(in_code(m.group(2).split("::")[-1], code[f]) for f in files)
    if re.fullmatch(rf"{IDENT}(::({IDENT}|\{{[\w,]+\}}|\.\.))+(::)?", s):
        return rust_path_ok(s)
    s = s.rstrip(".")  # `re_...`
    if "/" in s or s.endswith(PATH_EXT):
        if s.startswith(("target/", "data/", "./data/")):  # build output and the service's data
            return True
        return all(path_exists(p, doc_dir) for p in expand(s))
    if m := re.fullmatch(r"PAYMENTS__([A-Z]+)__([A-Z_]+)", s):
        s = f"{m.group(1).lower()}.{m.group(2).lower()}"
    if re.fullmatch(rf"{IDENT}(\.{IDENT})+", s):
        return dotted_ok(s)
    if not re.fullmatch(IDENT, s) or re.fullmatch(r"[A-Z0-9]+", s):
        return True
    if "_" in s or re.search(r"[a-z][A-Z]", s) or re.fullmatch(r"[A-Z][a-z]\w*", s):
        return in_code(s)
    return True


def spans(text):
    """Each inline code span outside fenced blocks, with its line number."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            line = ""
        lines.append("" if fenced else line)
    body = "\n".join(lines)
    for m in re.finditer(r"`([^`]+)`", body):
        yield body.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


offenders = []
docs = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
for doc in docs:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        for line, name in spans(f.read()):
            if not ok(name, os.path.dirname(doc) + "/" if "/" in doc else ""):
                offenders.append(f"{doc}:{line}: {name}")
print("\n".join(offenders) or f"check-doc-names: every code name in {len(docs)} documents exists")
sys.exit(1 if offenders else 0)
