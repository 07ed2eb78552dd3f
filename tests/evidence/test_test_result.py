"""Issue 26.1: the run's result as in-toto's standard test-result attestation (``test-result.intoto.json``).

The statement a real sealed release carries (``signed_release``: write_evidence with the private
Sigstore instance) has the spec's field names and nothing of its own outside benchseal's URI-named
extension (in-toto/attestation spec/predicates/test-result.md, test-result v0.1: ``result``
PASSED|WARNED|FAILED, ``configuration`` ResourceDescriptors, ``url``, ``passedTests``,
``warnedTests``, ``failedTests``); it is signed as DSSE over its exact bytes; and its content follows
summary.json by one rule (``ResultStatement.for_summary``): the result, the tests and the
configuration for each kind of run.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.attest.images import agent_dependency
from pipeline.core.contracts import AgentArtifact, load_model
from pipeline.core.documents import (
    SCHEMA_DIR,
    SCORE_EXTENSION,
    TEST_RESULT,
    Comparison,
    ReleaseSummary,
    ResultStatement,
    TaskCounts,
    dump_document,
    load_document,
    result_verdict,
    task_outcomes,
)
from pipeline.core.fsutil import sha256_file
from pipeline.evidence.artifacts import build_summary
from pipeline.evidence.testresult import result_statement
from pipeline.verify.external import image_command_lines
from tests.fixtures.sigstore import make_inputs

RUNNER = "127.0.0.1:5055/acme/widget-runner@sha256:" + "a" * 64
API = "127.0.0.1:5055/acme/widget-api@sha256:" + "b" * 64
# in-toto v1 ResourceDescriptor's fields, and test-result v0.1's (spec/v1/resource_descriptor.md,
# spec/predicates/test-result.md).
DESCRIPTOR_FIELDS = {"name", "uri", "digest", "content", "downloadLocation", "mediaType", "annotations"}
PREDICATE_FIELDS = {"result", "configuration", "url", "passedTests", "warnedTests", "failedTests"}


def _summary(**update: Any) -> ReleaseSummary:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    summary = build_summary(grading, payload)
    return summary.model_copy(update=update) if update else summary


# --- the statement a sealed release carries --------------------------------------------------------

def test_the_release_statement_has_the_spec_shape(signed_release: Path) -> None:
    data = json.loads((signed_release / "test-result.intoto.json").read_text())
    assert set(data) == {"_type", "subject", "predicateType", "predicate"}
    assert data["_type"] == "https://in-toto.io/Statement/v1"
    assert data["predicateType"] == TEST_RESULT == "https://in-toto.io/attestation/test-result/v0.1"
    predicate = data["predicate"]
    # Only the spec's fields, plus one extension named by a URI.
    assert set(predicate) - PREDICATE_FIELDS == {SCORE_EXTENSION}
    assert SCORE_EXTENSION.startswith("https://")
    assert {"result", "configuration"} <= set(predicate)  # the spec's required fields
    assert predicate["result"] in ("PASSED", "WARNED", "FAILED")
    for name in ("passedTests", "warnedTests", "failedTests"):
        assert isinstance(predicate[name], list) and all(isinstance(t, str) for t in predicate[name])
    assert [d["name"] for d in predicate["configuration"]] == ["suite", "dataset", "agent"]
    for descriptor in predicate["configuration"]:
        assert set(descriptor) <= DESCRIPTOR_FIELDS, descriptor
        assert {"uri", "digest", "content"} & set(descriptor)  # a descriptor names something
    # The fixture's run: task hello resolved, task fail not; SUCCEEDED, no comparison.
    assert (predicate["result"], predicate["passedTests"], predicate["warnedTests"], predicate["failedTests"]) == \
        ("PASSED", ["hello"], [], ["fail"])
    extension = predicate[SCORE_EXTENSION]
    summary = json.loads((signed_release / "summary.json").read_text())
    for key in ("status", "score", "interval", "counts", "tasks", "run_id", "source"):
        assert extension[key] == summary[key], key
    assert extension["gated"] is False
    # The dataset's digest is summary.json's: the content digest of the dataset the trials ran from.
    dataset = predicate["configuration"][1]
    assert "sha256:" + dataset["digest"]["sha256"] == summary["dataset"]["digest"]
    # Subjects: the runner image by manifest digest, and summary.json by its sha256.
    runner = summary["images"]["runner"]
    assert data["subject"] == [
        {"name": runner["name"], "digest": {"sha256": runner["digest"].removeprefix("sha256:")}},
        {"name": "summary.json", "digest": {"sha256": sha256_file(signed_release / "summary.json")}},
    ]
    # Outside Actions there is no run URL to name: absent (never null).
    assert "url" not in predicate


def test_the_statement_matches_its_committed_schema(signed_release: Path) -> None:
    schema = json.loads((SCHEMA_DIR / "test-result.schema.json").read_text())
    jsonschema.validate(json.loads((signed_release / "test-result.intoto.json").read_text()), schema)


def test_it_is_signed_as_dsse_over_its_exact_bytes(signed_release: Path) -> None:
    statement = (signed_release / "test-result.intoto.json").read_bytes()
    bundle = json.loads((signed_release / "test-result.intoto.json.sigstore.json").read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    envelope = bundle["dsseEnvelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(envelope["payload"]) == statement
    listed = {line.split("  ")[1] for line in (signed_release / "SHA256SUMS").read_text().splitlines()}
    assert {"test-result.intoto.json", "test-result.intoto.json.sigstore.json"} <= listed


def test_the_writer_follows_the_rule_verify_checks(signed_release: Path) -> None:
    summary = load_document(ReleaseSummary, signed_release / "summary.json")
    written = load_document(ResultStatement, signed_release / "test-result.intoto.json")
    assert written == ResultStatement.for_summary(summary, sha256_file(signed_release / "summary.json"))


# --- the rules -------------------------------------------------------------------------------------

def _comparison(gated: bool) -> Comparison:
    return Comparison(previous=None, score_delta=None, changed=(), gate=None, gated=gated,
                      reasons=("task hello resolved before and fails now",) if gated else ())


@pytest.mark.parametrize(("status", "gated", "result"), [
    ("SUCCEEDED", None, "PASSED"),
    ("SUCCEEDED", False, "PASSED"),
    ("SUCCEEDED", True, "FAILED"),
    ("FAILED", None, "FAILED"),
    ("INFRA_ERROR", None, "FAILED"),
])
def test_result_is_passed_only_for_a_succeeded_run_the_gate_let_through(status: str, gated: bool | None,
                                                                        result: str) -> None:
    update: dict[str, Any] = {"status": status, "comparison": None if gated is None else _comparison(gated)}
    if status != "SUCCEEDED":
        update.update(score=None, interval=None, reason="the agent crashed")
    summary = _summary(**update)
    assert result_verdict(summary) == result
    statement = ResultStatement.for_summary(summary, "c" * 64)
    assert statement.predicate.result == result
    assert statement.predicate.score.gated is bool(gated)
    assert statement.predicate.score.status == status


def test_tasks_pass_warn_or_fail_by_their_attempts() -> None:
    tasks = {"all": TaskCounts(attempts=3, completed=3, resolved=3),
             "some": TaskCounts(attempts=3, completed=3, resolved=1),
             "none": TaskCounts(attempts=3, completed=2, resolved=0),
             "a-single": TaskCounts(attempts=1, completed=1, resolved=1),
             "broken": TaskCounts(attempts=1, completed=0, resolved=0)}
    assert task_outcomes(tasks) == {"PASSED": ("a-single", "all"), "WARNED": ("some",), "FAILED": ("broken", "none")}
    assert task_outcomes(None) == {"PASSED": (), "WARNED": (), "FAILED": ()}
    predicate = ResultStatement.for_summary(_summary(tasks=tasks), "c" * 64).predicate
    assert (predicate.passedTests, predicate.warnedTests, predicate.failedTests) == \
        (("a-single", "all"), ("some",), ("broken", "none"))


def test_the_releases_own_agent_is_named_by_package_url_and_integrity() -> None:
    artifact = load_model(AgentArtifact, {
        "name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "version": "0.24.4",
        "integrity": "sha512-" + base64.b64encode(bytes(range(64))).decode(), "source_commit": "d" * 40,
    }, "test agent")
    summary = _summary()
    summary = summary.model_copy(update={"agent": summary.agent.model_copy(update={"release": artifact})})
    agent = ResultStatement.for_summary(summary, "c" * 64).predicate.configuration[2]
    assert agent.uri == "pkg:npm/%40qwen-code/qwen-code@0.24.4"
    assert agent.digest == {"sha512": bytes(range(64)).hex()}
    assert agent.annotations is not None
    assert (agent.annotations["integrity"], agent.annotations["sourceCommit"]) == (artifact.integrity, "d" * 40)
    # One package URL rule: the runner's SLSA provenance names the agent the same way.
    assert agent_dependency(artifact)["uri"] == agent.uri


def test_the_url_is_the_actions_run_sealing_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    summary_path.write_text("{}")
    for name, value in (("GITHUB_SERVER_URL", "https://github.com"), ("GITHUB_REPOSITORY", "acme/bench-infra"),
                        ("GITHUB_RUN_ID", "4242"), ("GITHUB_RUN_ATTEMPT", "2")):
        monkeypatch.setenv(name, value)
    statement = result_statement(_summary(), summary_path)
    assert statement.predicate.url == "https://github.com/acme/bench-infra/actions/runs/4242/attempts/2"
    monkeypatch.delenv("GITHUB_RUN_ID")
    assert result_statement(_summary(), summary_path).predicate.url is None


def test_the_body_prints_the_runners_line_only_for_a_passed_result(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """release.yml attaches the test result only after a successful, ungated benchmark (a failed or gated
    run fails its dispatch): the body's image block prints the runner's test-result line exactly then."""
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))  # no local root: plain public-good lines
    failed = _summary(status="FAILED", score=None, interval=None, reason="the agent crashed")
    for name, summary, printed in (("passed", _summary(), True), ("gated", _summary(comparison=_comparison(True)), False),
                                   ("failed", failed, False)):
        release = tmp_path / name
        release.mkdir()
        dump_document(summary, release / "summary.json")
        (release / "test-result.intoto.json").write_text("{}")
        lines = image_command_lines(release, "acme/widget", "v9.9.9", binary="cosign", profile="local")
        result_lines = [line for line in lines if f"--type {TEST_RESULT}" in line]
        assert len(result_lines) == (1 if printed else 0), (name, lines)
        assert len(lines) == 6 + len(result_lines)
        if printed:
            assert result_lines[0].startswith("cosign verify-attestation --new-bundle-format ")
            assert result_lines[0].endswith(f" --allow-http-registry {RUNNER}")


def test_the_score_extension_is_named_once() -> None:
    from pipeline.core.documents import SCORE_EXTENSION, ResultPredicate

    assert ResultPredicate.model_fields["score"].alias == SCORE_EXTENSION
