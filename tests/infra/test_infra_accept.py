"""`benchseal infra accept`: hostile payloads are rejected naming the field; redelivery is idempotent."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contracts import DispatchPayload
from pipeline.errors import ValidationError
from pipeline.infra.accept import accept_payload, validate_payload
from pipeline.infra.policy import SCHEMA_PATH

HEX = "0123456789abcdef" * 4
RUNNER = "127.0.0.1:5055/benchseal/runner"

# (description, path to the field, value, expected field named in the error)
HOSTILE: list[tuple[str, tuple[str, ...], Any, str]] = [
    ("tag instead of digest", ("runner",), f"{RUNNER}:latest", "payload.runner"),
    ("tag and digest", ("runner",), f"{RUNNER}:v1@sha256:{HEX}", "payload.runner"),
    ("short hex", ("runner",), f"{RUNNER}@sha256:{HEX[:63]}", "payload.runner"),
    ("long hex", ("runner",), f"{RUNNER}@sha256:{HEX}0", "payload.runner"),
    ("uppercase hex", ("runner",), f"{RUNNER}@sha256:{HEX.upper()}", "payload.runner"),
    ("other algorithm", ("runner",), f"{RUNNER}@sha512:{HEX}", "payload.runner"),
    ("other registry", ("runner",), f"ghcr.io/benchseal/runner@sha256:{HEX}", "payload.runner"),
    ("other repository", ("runner",), f"127.0.0.1:5055/evil/runner@sha256:{HEX}", "payload.runner"),
    ("runner repo as api", ("api",), f"{RUNNER}@sha256:{HEX}", "payload.api"),
    ("implied docker hub", ("runner",), f"benchseal/runner@sha256:{HEX}", "payload.runner"),
    ("traversal in repo", ("runner",), f"127.0.0.1:5055/benchseal/../runner@sha256:{HEX}", "payload.runner"),
    ("whitespace", ("runner",), f" {RUNNER}@sha256:{HEX}", "payload.runner"),
    ("trailing newline", ("runner",), f"{RUNNER}@sha256:{HEX}\n", "payload.runner"),
    ("unicode digit", ("runner",), f"{RUNNER}@sha256:{HEX[:63]}\u0661", "payload.runner"),
    ("homoglyph host", ("runner",), f"127.0.0.1:5055/benchsеal/runner@sha256:{HEX}", "payload.runner"),
    ("not a string", ("runner",), 12345, "payload.runner"),
    ("null", ("api",), None, "payload.api"),
    ("unknown suite", ("suite",), "full", "payload.suite"),
    ("traversal suite", ("suite",), "../etc", "payload.suite"),
    ("unknown agent", ("agent",), "claude-code", "payload.agent"),
    ("uppercase agent", ("agent",), "Oracle", "payload.agent"),
    ("correlation with space", ("correlation_id",), "release v1", "payload.correlation_id"),
    ("correlation too short", ("correlation_id",), "abc", "payload.correlation_id"),
    ("correlation too long", ("correlation_id",), "a" * 129, "payload.correlation_id"),
    ("correlation newline", ("correlation_id",), "release-v1.2.3\n", "correlation_id"),
    ("short commit", ("source", "commit"), "0123456", "payload.source.commit"),
    ("uppercase commit", ("source", "commit"), "0123456789ABCDEF0123456789abcdef01234567", "payload.source.commit"),
    ("tag with space", ("source", "tag"), "v1 2", "payload.source.tag"),
    ("oversized tag", ("source", "tag"), "v" * 129, "payload.source.tag"),
    ("repository traversal", ("source", "repository"), "../../etc", "payload.source.repository"),
    ("wrong schema", ("schema",), "benchseal.dispatch/v2", "payload.schema"),
    ("extra top-level key", ("extra",), "x", "payload.extra"),
    ("extra nested key", ("source", "extra"), "x", "payload.source.extra"),
]


def _with(payload: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    target = payload
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return payload


@pytest.mark.parametrize(("case", "path", "value", "field"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_payload_rejected_naming_field(make_payload, queue_db, case, path, value, field):
    bad = _with(make_payload(), path, value)
    with pytest.raises(ValidationError) as info:
        accept_payload(bad, db=queue_db)
    assert field in info.value.field, (case, info.value.diagnostics())
    # Also rejected as bytes (the CLI path), and nothing was enqueued.
    with pytest.raises(ValidationError):
        accept_payload(json.dumps(bad).encode("ascii"), db=queue_db)
    if queue_db.exists():
        count = sqlite3.connect(queue_db).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        assert count == 0


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        (b"[]", "JSON object"),
        (b"{", "not valid JSON"),
        (b'{"schema": NaN}', "not valid JSON"),
        ('{"schema": "benchseal.dispatch/v1", "suite": "sm\u00f6ke"}'.encode(), "ASCII"),
        (b'{"schema": "a", "schema": "b"}', "duplicate key"),
        (b"[" * 100000 + b"]" * 100000, "bytes"),
        (b" " * 20000, "bytes"),
    ],
)
def test_malformed_bytes_rejected(queue_db, raw, rule):
    with pytest.raises(ValidationError) as info:
        accept_payload(raw, db=queue_db)
    assert rule in info.value.rule


def test_schema_and_model_agree_on_valid_payload(make_payload):
    schema = json.loads(SCHEMA_PATH.read_text())
    payload = make_payload()
    jsonschema.Draft202012Validator(schema).validate(payload)
    assert DispatchPayload.model_validate(payload).correlation_id == payload["correlation_id"]
    # Every string in the schema is bounded.
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string":
                assert "maxLength" in node, node
            for child in node.values():
                walk(child)
    walk(schema)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["source"]["additionalProperties"] is False


def test_redelivery_is_idempotent(make_payload, queue_db):
    first = accept_payload(make_payload(), db=queue_db)
    second = accept_payload(json.dumps(make_payload()).encode(), db=queue_db)
    assert first.created and not second.created
    assert first.run_id == second.run_id
    rows = sqlite3.connect(queue_db).execute("SELECT run_id, state FROM runs").fetchall()
    assert rows == [(first.run_id, "QUEUED")]
    run_json = json.loads((queue_db.parent / "runs" / first.run_id / "run.json").read_text())
    assert run_json["state"] == "QUEUED" and run_json["correlation_id"] == make_payload()["correlation_id"]


def test_same_correlation_different_payload_is_refused(make_payload, queue_db):
    accept_payload(make_payload(), db=queue_db)
    with pytest.raises(ValidationError) as info:
        accept_payload(make_payload(agent="nop"), db=queue_db)
    assert info.value.field == "payload.correlation_id"


def test_cli_accept_exit_codes(make_payload, tmp_path, queue_db):
    good = tmp_path / "payload.json"
    good.write_text(json.dumps(make_payload()))
    cmd = [sys.executable, "-m", "pipeline", "infra", "accept", "--db", str(queue_db)]
    first = subprocess.run([*cmd, "--payload", str(good), "--json"], capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["created"] is True
    again = subprocess.run([*cmd, "--payload", "-"], input=good.read_text(), capture_output=True, text=True, check=False)
    assert again.returncode == 0 and again.stdout.strip() == result["run_id"]
    bad = subprocess.run([*cmd, "--payload", "-"], input=json.dumps(make_payload(runner=f"{RUNNER}:latest")),
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "payload.runner" in bad.stderr and "tags are not accepted" in bad.stderr


# --- property tests ------------------------------------------------------------

_ref_chars = st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=120)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_ref_chars, where=st.sampled_from(["suffix", "prefix", "replace_digest", "replace_name"]))
def test_mutated_runner_refs_never_accepted_unless_valid(make_payload, infra_policy, mutation, where):
    valid = make_payload()["runner"]
    name, _, digest = valid.partition("@")
    mutated = {
        "suffix": valid + mutation,
        "prefix": mutation + valid,
        "replace_digest": f"{name}@{mutation}",
        "replace_name": f"{mutation}@{digest}",
    }[where]
    try:
        payload = validate_payload(make_payload(runner=mutated), infra_policy)
    except ValidationError as exc:
        assert "runner" in exc.field
        return
    # Accepted only when it is exactly an allowed runner pinned by a well-formed digest.
    assert payload.runner.startswith(RUNNER + "@sha256:")
    assert len(payload.runner) == len(RUNNER) + 8 + 64
    assert all(c in "0123456789abcdef" for c in payload.runner[-64:])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1, max_size=40), value=st.one_of(st.text(max_size=40), st.integers(), st.none()))
def test_unknown_keys_always_rejected(make_payload, infra_policy, key, value):
    payload = make_payload()
    if key in payload:
        return
    payload[key] = value
    with pytest.raises(ValidationError):
        validate_payload(payload, infra_policy)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_arbitrary_bytes_rejected_cleanly(queue_db, raw):
    with pytest.raises(ValidationError):
        accept_payload(raw, db=queue_db)


def test_payload_file_read_is_bounded(tmp_path, make_payload, queue_db):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (10 * 1024 * 1024) + json.dumps(make_payload()).encode())
    result = subprocess.run([sys.executable, "-m", "pipeline", "infra", "accept", "--db", str(queue_db),
                             "--payload", str(big)], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "at most" in result.stderr
    assert Path(big).stat().st_size > 10 * 1024 * 1024


def test_cli_validate_checks_without_enqueueing(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "BENCHSEAL_HOME": str(tmp_path / "home")}
    good = json.dumps(make_payload(correlation_id="validate-only-0001"))
    cli = [sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-"]
    ok = subprocess.run(cli, input=good, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "validate-only-0001"
    assert not (tmp_path / "home" / "infra" / "queue.sqlite3").exists(), "validate must not enqueue"
    bad = subprocess.run(cli, input=good.replace("@sha256:", ":latest@sha256:"), capture_output=True, text=True,
                         env=env, check=False, timeout=60)
    assert bad.returncode == 2 and "payload.api" in bad.stderr and "must not carry a tag" in bad.stderr
