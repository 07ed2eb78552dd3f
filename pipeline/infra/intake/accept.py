"""``benchseal infra accept``: validate a dispatch payload, then enqueue it exactly once.

Order of checks: size bound (before parsing) -> strict JSON (ASCII only, no
BOM, no duplicate keys, no NaN/Infinity, no number literal longer than
``MAX_NUMBER_CHARS``, nesting at most ``MAX_DEPTH``, an object at the top) ->
JSON Schema (policies/payload.schema.json) -> pydantic model
(pipeline.core.contracts.DispatchPayload, which re-runs the shared digest validator)
-> policy (source repository listed, its allowed image repositories, suites,
agents). Every rejection is a ValidationError naming the field and the rule
(exit 2), never a traceback; the error hierarchy escapes whatever it echoes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from pipeline.core.contracts import DispatchPayload, load_model
from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError
from pipeline.infra.intake.policy import SCHEMA_PATH, InfraPolicy, load_policy
from pipeline.infra.queue.sql import open_queue


@dataclass(frozen=True)
class AcceptResult:
    run_id: str
    created: bool


@cache
def _schema_validator() -> Any:

    schema = json.loads(SCHEMA_PATH.read_text(encoding="ascii"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# The payload holds no numbers at all and is two levels deep; these bounds only keep a
# hostile literal or nesting from reaching int(), float() or a recursive validator.
MAX_NUMBER_CHARS = 32
MAX_DEPTH = 8
_BOMS = ((b"\xef\xbb\xbf", "UTF-8"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValidationError(f"payload.{key}", "duplicate key (each key may appear once per object)")
        seen[key] = value
    return seen


def _reject_constant(name: str) -> None:
    raise ValidationError("payload", f"{name} is not valid JSON (NaN and Infinity literals are refused)")


def _parse_int(text: str) -> int:
    # Python's int() refuses more than 4300 digits with a ValueError: bound it first.
    if len(text) > MAX_NUMBER_CHARS:
        raise ValidationError("payload", f"number literal longer than {MAX_NUMBER_CHARS} characters", text[:20] + "...")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValidationError("payload", f"number literal longer than {MAX_NUMBER_CHARS} characters", text[:20] + "...")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # 1e999 overflows to infinity: the same as an Infinity literal.
        raise ValidationError("payload", "number literal out of range (overflows to infinity)", text)
    return value


def _check_shape(obj: object) -> None:
    """Depth bound, without recursion, before any recursive code (schema, pydantic) sees it."""
    stack: list[tuple[object, int, str]] = [(obj, 1, "payload")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise ValidationError(where, f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(node, dict):
                for key, child in node.items():
                    if not isinstance(key, str):
                        raise ValidationError(where, "object keys must be strings", type(key).__name__)
                    stack.append((child, depth + 1, f"{where}.{key}"))
            else:
                stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) >= 10**MAX_NUMBER_CHARS:
            raise ValidationError(where, f"integer longer than {MAX_NUMBER_CHARS} digits")
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValidationError(where, "NaN and Infinity are not valid JSON")


def parse_payload_bytes(data: bytes, max_bytes: int) -> object:
    if len(data) > max_bytes:
        raise ValidationError("payload", f"must be at most {max_bytes} bytes (got {len(data)})")
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise ValidationError("payload", f"must be ASCII JSON without a byte order mark (starts with a {encoding} BOM)")
    if not data.isascii():
        index = next(i for i, b in enumerate(data) if b > 0x7F)
        raise ValidationError("payload", f"must be ASCII JSON (non-ASCII byte at offset {index})")
    try:
        obj = json.loads(data.decode("ascii"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                         parse_int=_parse_int, parse_float=_parse_float)
    except json.JSONDecodeError as exc:
        raise ValidationError("payload", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValidationError("payload", f"not valid JSON: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # anything else the decoder refuses (never a traceback)
        raise ValidationError("payload", f"not valid JSON: {type(exc).__name__}") from None
    _check_shape(obj)
    return obj


def _path(parts: Any) -> str:
    return "payload" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def validate_payload(data: bytes | dict[str, Any], policy: InfraPolicy | None = None) -> DispatchPayload:
    """Return the validated payload or raise ValidationError naming the offending field."""
    policy = policy or load_policy()
    obj: object
    if isinstance(data, bytes | bytearray):
        obj = parse_payload_bytes(bytes(data), policy.max_payload_bytes)
    elif isinstance(data, dict):
        _check_shape(data)
        try:
            encoded = json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as exc:
            raise ValidationError("payload", f"must be JSON data ({type(exc).__name__}: not serialisable)") from None
        if len(encoded) > policy.max_payload_bytes:
            raise ValidationError("payload", f"must be at most {policy.max_payload_bytes} bytes (got {len(encoded)})")
        obj = data
    else:
        raise ValidationError("payload", "must be a JSON object (bytes or dict)", type(data).__name__)
    if not isinstance(obj, dict):
        raise ValidationError("payload", "must be a JSON object", type(obj).__name__)

    errors = sorted(_schema_validator().iter_errors(obj), key=lambda e: (list(e.absolute_path), e.validator))
    if errors:
        first = errors[0]
        if first.validator == "additionalProperties":
            extra = sorted(set(first.instance) - set(first.schema.get("properties", {})))
            raise ValidationError(_path([*first.absolute_path, extra[0]]), "unknown key (additionalProperties is false)")
        if list(first.absolute_path) in (["runner"], ["api"]):
            # The shared validator states the precise rule (tag, hex length, case, ...).
            parse_ref(first.instance, _path(first.absolute_path))
        if first.validator == "required":
            raise ValidationError(_path(first.absolute_path), first.message)
        raise ValidationError(_path(first.absolute_path), f"schema rule {first.validator!r}: {first.message[:200]}", first.instance)

    try:
        payload = load_model(DispatchPayload, obj, "payload")
    except ValidationError as exc:
        raise ValidationError(exc.field.replace("payload: ", "payload.", 1), exc.rule, exc.value) from None
    policy.check_payload(payload)
    if payload.suite not in policy.suites:
        raise ValidationError("payload.suite", f"suite not allowed by policy (allowed: {', '.join(sorted(policy.suites))})", payload.suite)
    policy.agent(payload.agent, payload.suite)  # admitted by name; a model-backed agent needs the suite's model
    return payload


def accept_payload(
    data: bytes | dict[str, Any], *, db: Path | None = None, policy: InfraPolicy | None = None,
    policy_digest: str | None = None,
) -> AcceptResult:
    """Validate ``data`` and enqueue it once; a redelivery returns the existing run (created=False).
    ``policy_digest``: the digest ``policy`` was checked to have (``policy_home``), recorded with the run."""
    policy = policy or load_policy()
    payload = validate_payload(data, policy)
    with open_queue(db) as queue:
        # A redelivery with a different payload is refused (and recorded as refused) by enqueue.
        run_id, created = queue.enqueue(payload, max_attempts=policy.max_attempts, policy_digest=policy_digest)
    return AcceptResult(run_id=run_id, created=created)
