"""The infra policy admits a release's agent by repository, name and kind; its version is the tag's.

Checked by accept (and again by the worker and the seal job through ``check_payload``); the
payload's model binds the artifact to the payload's agent and commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DispatchPayload
from pipeline.core.errors import ValidationError
from pipeline.infra.intake.accept import validate_payload
from pipeline.infra.intake.policy import POLICY_PATH, AgentPolicy, InfraPolicy, load_policy

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
COMMIT = "0123456789abcdef0123456789abcdef01234567"
QWEN = {"name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "version": "1.2.3",
        "integrity": "sha512-pmexy/Nj+BKd3Un1ogqGQE8V4GJn5B6N9PQOrU1GH+lMR29kn6Bgf6YdbZa8hNIoTmAKT1LTPK+P8TibZRPPVg==",
        "source_commit": COMMIT}


def _qwen(make_payload: Callable[..., dict[str, Any]], **artifact: Any) -> dict[str, Any]:
    return make_payload(agent="qwen-code", agent_artifact={**QWEN, **artifact})


def test_a_release_agent_is_admitted_at_the_tags_version(make_payload: Callable[..., dict[str, Any]]) -> None:
    payload = validate_payload(_qwen(make_payload), load_policy())
    assert payload.agent_artifact is not None and payload.agent_artifact.version == "1.2.3"


@pytest.mark.parametrize(("artifact", "field", "needle"), [
    ({"version": "1.2.4"}, "payload.agent_artifact.version", "must be 1.2.3, the version of the release's tag v1.2.3"),
    ({"kind": "python"}, "payload.agent_artifact.kind", "must be npm"),
    ({"package": "@qwen-code/qwen-code-fork"}, "payload.agent_artifact.package", "must be @qwen-code/qwen-code"),
    ({"name": "hello-agent"}, "payload", "must be the payload's agent"),
    ({"source_commit": "f" * 40}, "payload", "source_commit must be the payload's source.commit"),
    ({"integrity": "sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA="}, "payload.agent_artifact.integrity", ""),
])
def test_an_artifact_that_is_not_the_policys_is_refused(make_payload: Callable[..., dict[str, Any]],
                                                        artifact: dict[str, Any], field: str, needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_payload(_qwen(make_payload, **artifact), load_policy())
    assert caught.value.field.startswith(field), caught.value.diagnostics()
    assert needle in caught.value.diagnostics()
    if field in ("payload.agent_artifact.version", "payload.agent_artifact.kind", "payload.agent_artifact.package"):
        assert caught.value.value == next(iter(artifact.values()))  # the one line shows what was given


def test_a_release_agent_needs_its_artifact(make_payload: Callable[..., dict[str, Any]]) -> None:
    with pytest.raises(ValidationError, match="is required: qwen-code is a release's agent") as caught:
        validate_payload(make_payload(agent="qwen-code"), load_policy())
    assert caught.value.field == "payload.agent_artifact"


def test_a_calibration_agent_carries_no_artifact(make_payload: Callable[..., dict[str, Any]]) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_payload(make_payload(agent="oracle", agent_artifact={**QWEN, "name": "oracle"}), load_policy())
    assert (caught.value.field, caught.value.rule) == (
        "payload.agent_artifact", "agent oracle is not a release's agent in the policy: it carries no artifact")


def test_a_release_agent_is_admitted_only_for_its_repositories(tmp_path: Path,
                                                              make_payload: Callable[..., dict[str, Any]]) -> None:
    policy_text = POLICY_PATH.read_text(encoding="utf-8")
    narrowed = policy_text.replace("  - name: qwen-code\n    kind: npm\n    package: \"@qwen-code/qwen-code\"\n"
                                   "    repositories: [benchseal-examples/qwen-code, acme/widget]",
                                   "  - name: qwen-code\n    kind: npm\n    package: \"@qwen-code/qwen-code\"\n"
                                   "    repositories: [benchseal-examples/qwen-code, acme/other]")
    assert narrowed != policy_text
    path = tmp_path / "infra.yaml"
    path.write_text(narrowed, encoding="utf-8")
    with pytest.raises(ValidationError,
                       match="admitted for benchseal-examples/qwen-code, acme/other, not acme/widget") as caught:
        validate_payload(_qwen(make_payload), load_policy(path))
    assert (caught.value.field, caught.value.value) == ("payload.agent", "qwen-code")


@pytest.mark.parametrize(("entry", "needle"), [
    ("  - name: mine\n    kind: cargo\n    package: x\n    repositories: [acme/widget]\n", "agents"),
    ("  - name: mine\n    kind: npm\n    package: x\n    repositories: []\n", "repositories"),
    ("  - name: mine\n    kind: npm\n    package: x\n    repositories: [not a repo]\n", "repositories"),
    ("  - name: mine\n    kind: npm\n    package: x\n    repositories: [acme/widget]\n    version: \"1\"\n", "version"),
])
def test_release_agent_entries_are_strict(tmp_path: Path, entry: str, needle: str) -> None:
    text = POLICY_PATH.read_text(encoding="utf-8")
    path = tmp_path / "infra.yaml"
    path.write_text(text.replace("agents:\n", "agents:\n" + entry, 1), encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        load_policy(path)
    assert needle in caught.value.diagnostics()


def test_the_payload_travels_without_null_fields(make_payload: Callable[..., dict[str, Any]]) -> None:
    # A calibration payload is byte-for-byte what it was before the field existed (idempotency keys).
    payload = DispatchPayload.model_validate(make_payload())
    assert "agent_artifact" not in payload.to_json_dict()
    with_artifact = DispatchPayload.model_validate(_qwen(make_payload))
    assert with_artifact.to_json_dict()["agent_artifact"] == QWEN


def test_infra_accept_refuses_a_wrong_version_in_one_line(tmp_path: Path,
                                                          make_payload: Callable[..., dict[str, Any]]) -> None:
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(_qwen(make_payload, version="9.9.9")))
    done = subprocess.run([BENCHSEAL, "infra", "accept", "--payload", str(path), "--db", str(tmp_path / "q.sqlite3")],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "payload.agent_artifact.version" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "q.sqlite3").exists() or "run-" not in done.stdout


def _policy_with(**changes: Any) -> InfraPolicy:
    # The shipped policy, changed in memory (no file: the model's own rules are under test).
    data = yaml.safe_load(POLICY_PATH.read_text(encoding="utf-8"))
    data.update(changes)
    return InfraPolicy.model_validate(data)


def test_only_a_model_agent_gets_the_suites_model() -> None:
    # Mutation testing (issue 39.3): a model-backed agent is given the suite's endpoint and key, an agent
    # without `model: true` never is, and a test agent is no entry at all.
    policy = _policy_with(agents=["oracle", {"name": "plain", "version": "1.0"},
                                  {"name": "terminus-2", "version": "0.26.0", "model": True}])
    plain, no_model = policy.agent("plain", "smoke")
    assert isinstance(plain, AgentPolicy) and plain.name == "plain" and no_model is None
    entry, model = policy.agent("terminus-2", "smoke")
    assert isinstance(entry, AgentPolicy) and model is not None and model == policy.suites["smoke"].model
    assert policy.agent("oracle", "smoke") == (None, None)


@pytest.mark.parametrize("suite", ["smoke", "absent"])
def test_a_model_agent_without_a_suite_model_is_refused_naming_the_rule(suite: str) -> None:
    shipped = load_policy()
    suites = {name: s.model_dump(mode="json", exclude_none=True) for name, s in shipped.suites.items()}
    suites["smoke"].pop("model")
    policy = _policy_with(suites=suites)
    with pytest.raises(ValidationError) as caught:
        policy.agent("terminus-2", suite, "payload.agent")
    assert (caught.value.field, caught.value.value) == ("payload.agent", "terminus-2")
    assert caught.value.rule == (f"agent terminus-2 needs a model, and suite {suite!r} configures none "
                                 "(suites.<suite>.model in policies/infra.yaml)")


def test_an_unlisted_agent_is_refused_naming_field_rule_and_value() -> None:
    policy = load_policy()
    with pytest.raises(ValidationError) as caught:
        policy.agent("ghost", "smoke")
    assert (caught.value.field, caught.value.value) == ("payload.agent", "ghost")
    assert caught.value.rule == f"agent not allowed by policy (allowed: {', '.join(policy.agent_names)})"
    assert ", oracle" not in caught.value.rule and "oracle, nop" in caught.value.rule
