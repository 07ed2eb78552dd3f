"""``benchseal infra accept``: validate a dispatch payload, then enqueue it exactly once.

Order of checks: size bound (before parsing) -> strict JSON (ASCII only, no
duplicate keys, no NaN) -> JSON Schema (policies/payload.schema.json) ->
pydantic model (pipeline.contracts.DispatchPayload, which re-runs the shared
digest validator) -> policy (allowed registries/repositories, suites, agents).
Every rejection is a ValidationError naming the field (exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pipeline.contracts import DispatchPayload, load_model
from pipeline.digests import parse_ref
from pipeline.errors import ValidationError
from pipeline.infra.policy import SCHEMA_PATH, InfraPolicy, load_policy
from pipeline.infra.queue import open_queue


@dataclass(frozen=True)
class AcceptResult:
    run_id: str
    created: bool


@cache
def _schema_validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="ascii"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValidationError(f"payload.{key}", "duplicate key")
        seen[key] = value
    return seen


def _reject_constant(name: str) -> None:
    raise ValidationError("payload", f"{name} is not valid JSON")


def parse_payload_bytes(data: bytes, max_bytes: int) -> object:
    if len(data) > max_bytes:
        raise ValidationError("payload", f"must be at most {max_bytes} bytes (got {len(data)})")
    if not data.isascii():
        index = next(i for i, b in enumerate(data) if b > 0x7F)
        raise ValidationError("payload", f"must be ASCII JSON (non-ASCII byte at offset {index})")
    try:
        return json.loads(data.decode("ascii"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError("payload", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ValidationError("payload", "nested too deeply") from None


def _path(parts: Any) -> str:
    return "payload" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def validate_payload(data: bytes | dict[str, Any], policy: InfraPolicy | None = None) -> DispatchPayload:
    """Return the validated payload or raise ValidationError naming the offending field."""
    policy = policy or load_policy()
    obj: object
    if isinstance(data, bytes | bytearray):
        obj = parse_payload_bytes(bytes(data), policy.max_payload_bytes)
    elif isinstance(data, dict):
        encoded = json.dumps(data, ensure_ascii=False, default=str).encode("utf-8")
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
    roles: tuple[Literal["runner", "api"], ...] = ("runner", "api")
    for role in roles:
        policy.check_image(role, parse_ref(getattr(payload, role), f"payload.{role}"), field=f"payload.{role}")
    if payload.suite not in policy.suites:
        raise ValidationError("payload.suite", f"suite not allowed by policy (allowed: {', '.join(sorted(policy.suites))})", payload.suite)
    if payload.agent not in policy.agents:
        raise ValidationError("payload.agent", f"agent not allowed by policy (allowed: {', '.join(policy.agents)})", payload.agent)
    return payload


def accept_payload(
    data: bytes | dict[str, Any], *, db: Path | None = None, policy: InfraPolicy | None = None
) -> AcceptResult:
    """Validate ``data`` and enqueue it once; a redelivery returns the existing run (created=False)."""
    policy = policy or load_policy()
    payload = validate_payload(data, policy)
    with open_queue(db) as queue:
        # A redelivery with a different payload is refused (and recorded as refused) by enqueue.
        run_id, created = queue.enqueue(payload, max_attempts=policy.max_attempts)
    return AcceptResult(run_id=run_id, created=created)
