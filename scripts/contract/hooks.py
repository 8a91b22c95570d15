"""Schemathesis hooks for the payments contract test (loaded through SCHEMATHESIS_HOOKS).

Two adjustments to each request just before it is sent (`before_call`):

1. A fresh Idempotency-Key. POST /charges and POST /charges/{id}/refunds are idempotent per
   key: a key already used with another body answers `422 idempotency_key_reused`.
   Schemathesis draws header values from the spec's pattern and examples, so the same key
   would come back with different bodies and later requests would test the replay path
   instead of the operation. Every request carrying
   a key the service would ACCEPT gets a never-used key of the same form (bare or RFC 8941
   quoted). Missing and invalid keys are left alone on purpose: they are the negative cases
   (`400 idempotency_key_missing` / `idempotency_key_invalid`) the contract must cover, and
   they never claim a key.
2. A whole-number `amount` sent as an integer literal; see `_integer_literal_amount`.
3. A work-around for a schemathesis quoting bug on path parameters; see `_unmangle_key_path`.
"""

import uuid
from urllib.parse import unquote

import schemathesis

HEADER = "idempotency-key"


def _unquote(rest):
    """The body of an RFC 8941 string after its opening quote, or None (mirrors key.rs)."""
    out = []
    i = 0
    while i < len(rest):
        c = rest[i]
        if c == "\\":
            if i + 1 < len(rest) and rest[i + 1] in "\"\\":
                out.append(rest[i + 1])
                i += 2
                continue
            return None
        if c == '"':
            return "".join(out) if i == len(rest) - 1 else None
        out.append(c)
        i += 1
    return None


def service_accepts(raw, header=True):
    """Whether the service would parse this value as a key (crates/idempotency/src/key.rs).

    HTTP strips leading and trailing spaces and tabs from a header field value before the
    service sees it, so they are stripped here too (not from a path segment).
    """
    if not isinstance(raw, str):
        return False
    value = raw.strip(" \t") if header else raw
    key = _unquote(value[1:]) if value.startswith('"') else value
    if not key or len(key) > 255:
        return False
    return all(0x21 <= ord(ch) <= 0x7E for ch in key)


def _integer_literal_amount(case):
    """Sends a whole-number float `amount` (`2500.0`) as the integer literal `2500`.

    JSON Schema (OpenAPI 3.1) counts `2500.0` as an integer, so schemathesis sends it as valid
    data; the service accepts only an integer literal and answers 400 invalid_request, as the
    spec's prose for `amount` says. JSON Schema cannot express that rule, so it is applied here.
    Delete this function if the service starts accepting whole-number floats.
    """
    if case.method.upper() != "POST" or case.path not in ("/charges", "/charges/{id}/refunds", "/payouts"):
        return
    body = case.body
    if isinstance(body, dict):
        amount = body.get("amount")
        if isinstance(amount, float) and amount.is_integer() and abs(amount) < 2**53:
            body["amount"] = int(amount)


def _unmangle_key_path(case):
    """Keeps a valid generated key valid on its way into GET /idempotency-keys/{key}.

    Schemathesis percent-decodes a generated path value before encoding it (to keep already
    encoded input as it is), so a valid key that happens to contain `%13` or `%22` reaches the
    service as the control character 0x13 or a quote: an invalid key, answered with 400, and
    reported as "schema-valid request rejected". Only in positive mode, where a value the
    service refuses can only come from that mangling, such a value is replaced by a valid,
    never-used key (404).
    """
    if case.method.upper() != "GET" or case.path != "/idempotency-keys/{key}":
        return
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    params = case.path_parameters
    value = params.get("key") if params else None
    if isinstance(value, str) and not service_accepts(unquote(value), header=False):
        params["key"] = f"contract-unknown-{uuid.uuid4()}"


@schemathesis.hook
def before_call(context, case, **kwargs):
    _integer_literal_amount(case)
    _unmangle_key_path(case)
    headers = case.headers
    if not headers:
        return
    for name in list(headers):
        if name.lower() != HEADER:
            continue
        raw = headers[name]
        if service_accepts(raw):
            fresh = f"contract-{uuid.uuid4()}"
            headers[name] = f'"{fresh}"' if raw.strip(" \t").startswith('"') else fresh
