"""A run of a subset of its suite's tasks (issue 36.4): the payload's ``tasks`` (typed, one spelling), the
worker's rule against the staged dataset (``select_tasks``: an unknown name refused naming it), the subset in
summary.json, and the history key that keeps subset runs apart from full-suite runs (and from other subsets).
The worker running a subset end to end, split over two workers: tests/infra/test_infra_scale.py."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pipeline.core.contracts import DispatchPayload, parse_subset
from pipeline.core.documents import Dataset, HistoryEntry, TaskCounts
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.history import baseline, check_comparison, compare
from pipeline.core.paths import REPO_ROOT
from pipeline.evidence.artifacts import build_summary
from pipeline.infra.intake.accept import validate_payload
from pipeline.publish.body import facts_from_summary
from pipeline.runner.plan import discover_tasks, select_tasks
from tests.fixtures.sigstore import make_inputs

IMAGES = {"runner": "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64,
          "api": "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64}


# --- the payload ------------------------------------------------------------------------------------

def test_the_payloads_subset_has_one_spelling(make_payload: Any, infra_policy: Any) -> None:
    """Sorted, each name once; an empty list is the whole suite (absent), so neither makes a history key of its own."""
    payload = validate_payload(make_payload(tasks=["fix-mean", "cli-flag"]), infra_policy)
    assert payload.tasks == ("cli-flag", "fix-mean") and payload.to_json_dict()["tasks"] == ["cli-flag", "fix-mean"]
    whole = validate_payload(make_payload(tasks=[]), infra_policy)
    assert whole.tasks is None and "tasks" not in whole.to_json_dict()
    assert validate_payload(make_payload(), infra_policy).tasks is None


@pytest.mark.parametrize(("tasks", "field", "said"), [
    (["cli-flag", "cli-flag"], "payload.tasks", "uniqueItems"),
    (["Cli-Flag"], "payload.tasks[0]", "pattern"),
    (["../smoke"], "payload.tasks[0]", "pattern"),
    ("cli-flag", "payload.tasks", "type"),
    (["t"] * 1001, "payload.tasks", "maxItems"),
])
def test_a_malformed_subset_is_refused_naming_the_field(make_payload: Any, infra_policy: Any, tasks: Any, field: str,
                                                        said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_payload(make_payload(tasks=tasks), infra_policy)
    assert caught.value.field == field and said in caught.value.rule


def test_the_model_refuses_what_the_schema_refuses(make_payload: Any) -> None:
    """Both layers hold the rule (accept checks the schema, then the model; the worker re-reads the model)."""
    for bad in (["a", "a"], ["A"], ["t"] * 1001):
        with pytest.raises(Exception, match="tasks"):
            DispatchPayload.model_validate(make_payload(tasks=bad))
    schema = json.loads((REPO_ROOT / "policies" / "payload.schema.json").read_text())
    jsonschema.validate(make_payload(tasks=["a", "b"]), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(make_payload(tasks=["a", "a"]), schema)


@pytest.mark.parametrize(("override", "line"), [
    ({"suite": "ghost"}, "benchseal: error: invalid payload.suite: suite not allowed by policy (allowed: "),
    ({"tasks": ["cli-flag", "cli-flag"]}, "benchseal: error: invalid payload.tasks: schema rule 'uniqueItems'"),
])
def test_infra_validate_refuses_a_suite_its_policy_does_not_name_in_one_line(
        make_payload: Any, tmp_path: Path, override: dict[str, Any], line: str) -> None:
    """What benchmark.yml's accept job runs on the dispatched payload (its suite comes from release.yml's input)."""
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(make_payload(**override)))
    argv = [sys.executable, "-m", "pipeline", "infra", "validate", "--payload", str(payload), "--policy",
            str(REPO_ROOT / "policies" / "infra.yaml")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(line), done.stderr
    payload.write_text(json.dumps(make_payload(tasks=["fix-mean", "cli-flag"])))
    admitted = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert admitted.returncode == 0, admitted.stderr


def test_the_cli_list_is_parsed_into_the_same_spelling() -> None:
    assert parse_subset("fix-mean, cli-flag,") == ("cli-flag", "fix-mean")
    assert parse_subset("") is None and parse_subset(" , ") is None
    with pytest.raises(ValidationError, match="twice"):
        parse_subset("a,a")
    with pytest.raises(ValidationError) as caught:
        parse_subset("a,B/c")
    assert (caught.value.field, caught.value.value) == ("--tasks", "B/c")


# --- the worker's rule --------------------------------------------------------------------------------

def test_the_plan_takes_only_the_subset_in_the_datasets_order() -> None:
    tasks = discover_tasks(REPO_ROOT / "suites" / "smoke")
    assert select_tasks(tasks, None) == tasks
    assert select_tasks(tasks, ("fix-mean", "cli-flag")) == ["cli-flag", "fix-mean"]


def test_a_task_the_staged_dataset_lacks_is_refused_naming_it() -> None:
    tasks = discover_tasks(REPO_ROOT / "suites" / "smoke")
    with pytest.raises(ValidationError) as caught:
        select_tasks(tasks, ("cli-flag", "humaneval-0"))
    assert (caught.value.field, caught.value.value) == ("payload.tasks", "humaneval-0")
    assert "\n" not in caught.value.diagnostics()


def test_release_local_refuses_an_unknown_task_in_one_line_before_building(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline", "release", "v0.0.1", "--local", "--tasks",
                           "cli-flag,no-such-task", "--dist", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == ["benchseal: error: invalid --tasks: is not a task of the suite's dataset (its task directories) "
                      "(got 'no-such-task')"], done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing built, run or published


# --- summary.json and the history key -----------------------------------------------------------------

def test_summary_json_records_the_subset_and_a_full_run_records_none() -> None:
    grading, payload = make_inputs(IMAGES)
    subset = grading.model_copy(update={"subset": ("fail", "hello")})
    assert build_summary(subset, payload).dataset.subset == ("fail", "hello")
    whole = build_summary(grading, payload).dataset
    assert whole.subset is None and "subset" not in whole.to_json_dict()  # summaries of full runs are unchanged
    assert Dataset.model_validate({"name": "smoke", "subset": ["a"]}).subset == ("a",)


def _release(n: int, tag: str, subset: tuple[str, ...] | None) -> HistoryEntry:
    return HistoryEntry(repository="acme/widget", suite="smoke", tag=tag, run_id=f"run-{n:020x}", commit="a" * 40,
                        score=1.0, interval=None, tasks={"a": TaskCounts(attempts=1, completed=1, resolved=1)},
                        gated=False, finished_at=datetime(2026, 1, 1, tzinfo=UTC), summary_digest="sha256:" + "c" * 64,
                        dataset_digest="sha256:" + "1" * 64, subset=subset)


def test_subset_runs_are_kept_apart_from_full_runs_and_other_subsets_in_the_history() -> None:
    digest = "sha256:" + "1" * 64
    history = [_release(1, "v1", None), _release(2, "v2", ("a",)), _release(3, "v3", ("a", "b"))]
    assert baseline(history, "v4", dataset_digest=digest, subset=None) == history[0]
    assert baseline(history, "v4", dataset_digest=digest, subset=("a",)) == history[1]
    assert baseline(history, "v4", dataset_digest=digest, subset=("a", "b")) == history[2]
    assert baseline(history, "v4", dataset_digest=digest, subset=("b",)) is None  # a new subset starts afresh
    # Stored as the queue stores it (JSON), the subset comes back the same.
    assert HistoryEntry.model_validate_json(history[1].model_dump_json()).subset == ("a",)
    assert "subset" not in json.loads(history[0].model_dump_json())


def test_a_comparison_with_a_run_of_another_subset_is_refused() -> None:
    """What the seal job, the worker's finalizer and verify recompute: the previous release ran the same subset."""
    tasks = {"a": TaskCounts(attempts=1, completed=1, resolved=1)}
    previous = _release(1, "v1", ("a",)).as_previous()
    assert previous.subset == ("a",)
    comparison = compare(score=1.0, interval=None, tasks=tasks, previous=previous, gate=None)
    check_comparison(comparison, score=1.0, interval=None, tasks=tasks, where="comparison", subset=("a",))
    for other in (None, ("a", "b")):
        with pytest.raises(CheckFailed, match=r"comparison\.previous\.subset: says tasks a, but this release ran"):
            check_comparison(comparison, score=1.0, interval=None, tasks=tasks, where="comparison", subset=other)


def test_the_release_body_says_a_subset_run_is_a_subset() -> None:
    grading, payload = make_inputs(IMAGES)
    assert facts_from_summary(build_summary(grading, payload), "v9.9.9").suite == "smoke"
    subset = build_summary(grading.model_copy(update={"subset": ("fail", "hello")}), payload)
    assert facts_from_summary(subset, "v9.9.9").suite == "smoke (subset of 2 tasks)"
