"""Who ran and who graded a run, in the signed evidence (issue 36.7): each trial's worker (as the queue's record of
the trial names it) and the worker that graded the run go from the grading into summary.json, the test-result
statement's extension (derived from summary.json by its one rule, so ``benchseal verify`` holds a statement
naming other workers to it) and one line of the release body. A summary from before they were recorded has
none of them, and its statement and body are as they were. The two-worker run on PostgreSQL
(tests/infra/test_infra_scale.py) checks the same fields on a real split run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.contracts import Grading, TrialRecord, load_model
from pipeline.core.documents import SCORE_EXTENSION, ReleaseSummary, ResultStatement, load_document
from pipeline.core.errors import TestResultMismatch, ValidationError
from pipeline.core.layout import TEST_RESULT
from pipeline.evidence.artifacts import build_summary, write_summary
from pipeline.evidence.testresult import write_test_result
from pipeline.publish.body import facts_from_summary, markdown_cell, render_section
from pipeline.verify.testresult import check_test_result
from tests.fixtures.sigstore import make_inputs

RUNNER = "127.0.0.1:5055/acme/widget-runner@sha256:" + "a" * 64
API = "127.0.0.1:5055/acme/widget-api@sha256:" + "b" * 64
WORKERS = {"hello": "host-b-202", "fail": "host-a-101"}
GRADER = "host-a-101"


def _graded(*, workers: bool = True) -> tuple[Grading, ReleaseSummary]:
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    if workers:
        data = grading.model_dump(mode="json")
        data["trials"] = [{**t, "worker": WORKERS[t["task"]]} for t in data["trials"]]
        grading = load_model(Grading, {**data, "graded_by": GRADER}, "test grading")
    return grading, build_summary(grading, payload)


@pytest.fixture(autouse=True)
def _outside_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_RUN_ID", raising=False)  # no run URL in the statement


def test_each_trials_worker_and_the_grader_are_in_summary_the_statement_and_the_body(tmp_path: Path) -> None:
    _, summary = _graded()
    path = write_summary(tmp_path, summary)
    data = json.loads(path.read_text())
    assert {t["task"]: t["worker"] for t in data["timings"]["trials"]} == WORKERS
    assert data["graded_by"] == GRADER
    assert load_document(ReleaseSummary, path) == summary  # read back as written
    write_test_result(tmp_path, summary, path)
    extension = json.loads((tmp_path / TEST_RESULT).read_text())["predicate"][SCORE_EXTENSION]
    assert extension["workers"] == ["host-a-101", "host-b-202"] and extension["graded_by"] == GRADER
    assert check_test_result(tmp_path, summary).predicate.score.workers == ("host-a-101", "host-b-202")
    facts = facts_from_summary(summary, "v9.9.9")
    assert facts.workers == "host-a-101: 1 trial, host-b-202: 1 trial; graded by host-a-101"
    assert f"| Workers (trials run; grader) | {markdown_cell(facts.workers)} |" in render_section(facts)


@pytest.mark.parametrize("field, forged", [("workers", ["host-a-101"]), ("graded_by", "host-b-202")])
def test_a_statement_naming_other_workers_than_summary_json_is_refused(tmp_path: Path, field: str,
                                                                        forged: object) -> None:
    _, summary = _graded()
    path = write_summary(tmp_path, summary)
    write_test_result(tmp_path, summary, path)
    statement = json.loads((tmp_path / TEST_RESULT).read_text())
    statement["predicate"][SCORE_EXTENSION][field] = forged
    (tmp_path / TEST_RESULT).write_text(json.dumps(statement))
    with pytest.raises(TestResultMismatch, match=f"{field} is"):
        check_test_result(tmp_path, summary)


def test_a_summary_from_before_workers_were_recorded_has_none_anywhere(tmp_path: Path) -> None:
    _, summary = _graded(workers=False)
    path = write_summary(tmp_path, summary)
    data = json.loads(path.read_text())
    assert "graded_by" not in data and all("worker" not in t for t in data["timings"]["trials"])
    statement = ResultStatement.for_summary(summary, "0" * 64)
    assert statement.predicate.score.workers is None and statement.predicate.score.graded_by is None
    write_test_result(tmp_path, summary, path)
    extension = json.loads((tmp_path / TEST_RESULT).read_text())["predicate"][SCORE_EXTENSION]
    assert not {"workers", "graded_by"} & set(extension)
    assert "Workers" not in render_section(facts_from_summary(summary, "v9.9.9"))


@pytest.mark.parametrize("worker", ["", "w" * 256])
def test_a_worker_id_is_one_to_255_characters(worker: str) -> None:
    trial = {"task": "hello", "trial_name": "hello__x", "outcome": "resolved", "reward": 1.0, "agent_name": "oracle"}
    assert load_model(TrialRecord, {**trial, "worker": "w" * 255}, "trial").worker == "w" * 255
    with pytest.raises(ValidationError, match="worker"):
        load_model(TrialRecord, {**trial, "worker": worker}, "trial")
    grading, _ = make_inputs({"runner": RUNNER, "api": API})
    with pytest.raises(ValidationError, match="graded_by"):
        load_model(Grading, {**grading.model_dump(mode="json"), "graded_by": worker}, "grading")


@pytest.mark.parametrize("status", ["FAILED", "INFRA_ERROR"])
def test_a_run_ended_before_any_trial_ran_names_the_worker_that_decided_it(tmp_path: Path, status: str) -> None:
    """Refused at planning (another policy digest, a payload the policy no longer admits) or ended as INFRA_ERROR
    (attempts used up): no trial ran, and the worker that decided is in summary.json, the statement (held to it by
    verify) and the body."""
    grading, payload = make_inputs({"runner": RUNNER, "api": API})
    ended = load_model(Grading, {**grading.model_dump(mode="json"), "status": status, "score": None, "trials": [],
                                 "reason": "policy: the run was accepted under infra policy sha256:…",
                                 "counts": {"total": 0, "completed": 0, "resolved": 0, "unresolved": 0,
                                            "infra_errors": 0},
                                 "graded_by": GRADER}, "grading")
    summary = build_summary(ended, payload)
    path = write_summary(tmp_path, summary)
    data = json.loads(path.read_text())
    assert data["graded_by"] == GRADER and data["timings"]["trials"] == [] and data["status"] == status
    write_test_result(tmp_path, summary, path)
    score = check_test_result(tmp_path, summary).predicate.score
    assert score.graded_by == GRADER and score.workers is None
    assert facts_from_summary(summary, "v9.9.9").workers == f"no trial ran; graded by {GRADER}"
