"""A repository's history of scored releases and the regression gate (issue 26 point 3).

The rule (``pipeline.core.history``: ``compare``, ``check_comparison``) on its own, then the queue's
history on both backends (SQLite and a real PostgreSQL): what a release is compared with (the newest
sealed, ungated entry of the repository and suite), recorded in the transaction that completes the run,
the sealed summary's digest recorded once, and the worker's ``scored_release`` under the policy's gate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading, TrialRecord
from pipeline.core.documents import Comparison, GateRules, PreviousRelease, ScoreInterval, TaskCounts
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.history import check_comparison, compare
from pipeline.core.scoring import score_interval, task_counts
from pipeline.infra.intake.policy import POLICY_PATH, InfraPolicy, load_policy
from pipeline.infra.queue.records import ScoredRelease
from pipeline.infra.worker.history import scored_release

GATE = GateRules()
DIGEST = "sha256:" + "ab" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _counts(resolved: int, completed: int = 1, attempts: int = 1) -> TaskCounts:
    return TaskCounts(attempts=attempts, completed=completed, resolved=resolved)


def _previous(tasks: dict[str, TaskCounts], score: float, tag: str = "v1.0.0") -> PreviousRelease:
    return PreviousRelease(tag=tag, run_id="run-" + "0" * 20, commit=COMMIT, summary_digest=DIGEST, score=score,
                           tasks=tasks)


def _interval(resolved: int, completed: int) -> ScoreInterval | None:
    counts = GradeCounts(total=completed, completed=completed, resolved=resolved, unresolved=completed - resolved,
                         infra_errors=0)
    return score_interval("SUCCEEDED", counts)


# --- the rule -------------------------------------------------------------------------------------

def test_the_first_release_has_nothing_to_compare_and_is_never_gated() -> None:
    result = compare(score=0.0, interval=_interval(0, 3), tasks={"a": _counts(0)}, previous=None, gate=GATE)
    assert result.previous is None and result.score_delta is None and result.changed == ()
    assert not result.gated and result.reasons == ()


def test_a_previously_resolved_task_that_fails_gates_the_release_naming_the_task() -> None:
    before = {"a": _counts(1), "b": _counts(1), "c": _counts(0)}
    now = {"a": _counts(1), "b": _counts(0), "c": _counts(1)}
    result = compare(score=2 / 3, interval=_interval(2, 3), tasks=now, previous=_previous(before, 2 / 3), gate=GATE)
    assert [(c.task, c.change) for c in result.changed] == [("b", "regressed"), ("c", "improved")]
    assert result.regressed_tasks == ("b",)
    assert result.gated and result.reasons == ("resolved in v1.0.0, failing now: b",)
    assert result.score_delta == 0.0  # the score alone did not move: the task rule catches it


def test_the_interval_rule_gates_only_a_drop_beyond_the_noise() -> None:
    before = {f"t{i}": _counts(1) for i in range(20)}
    # 19/20 now: the interval's upper end (0.991) is below the previous 1.0, so the interval rule
    # gates it (the task rule is off here, so the reason is the interval's alone).
    slight = dict(before, t0=_counts(0))
    only_interval = GateRules(resolved_task_fails=False)
    result = compare(score=0.95, interval=_interval(19, 20), tasks=slight, previous=_previous(before, 1.0),
                     gate=only_interval)
    assert result.gated and result.reasons[0].startswith("the score's 95 % interval [")
    # A previous score inside the interval is noise: not gated.
    result = compare(score=0.95, interval=_interval(19, 20), tasks=slight, previous=_previous(slight, 0.9),
                     gate=only_interval)
    assert not result.gated and result.score_delta == 0.05


def test_added_removed_and_unjudged_tasks_are_changes_but_not_regressions() -> None:
    before = {"a": _counts(1), "gone": _counts(1), "flaky": _counts(0, completed=0), "lost": _counts(0)}
    now = {"a": _counts(1), "new": _counts(0), "flaky": _counts(0), "lost": _counts(0, completed=0)}
    result = compare(score=1.0, interval=_interval(1, 1), tasks=now, previous=_previous(before, 1.0), gate=GATE)
    assert [(c.task, c.change) for c in result.changed] == [("flaky", "unjudged"), ("gone", "removed"),
                                                            ("lost", "unjudged"), ("new", "added")]
    assert not result.gated


def test_a_resolved_task_made_unjudgeable_is_a_regression_and_gated() -> None:
    """Issue 35.3: an agent that turns a task it used to solve into infrastructure errors (or a verifier
    that cannot judge it) does not slip past the gate as "unjudged"."""
    before = {"a": _counts(1), "b": _counts(1), "c": _counts(1, 2, 2)}
    now = {"a": _counts(1), "b": _counts(0, completed=0), "c": _counts(0, 0, 2)}  # only infrastructure errors
    result = compare(score=1.0, interval=_interval(1, 1), tasks=now, previous=_previous(before, 1.0), gate=GATE)
    assert [(c.task, c.change) for c in result.changed] == [("b", "regressed"), ("c", "regressed")]
    assert result.gated and result.reasons == ("resolved in v1.0.0, failing now: b",)


def test_attempts_count_as_pass_rates() -> None:
    before = {"a": _counts(3, 3, 3)}
    now = {"a": _counts(2, 3, 3)}
    result = compare(score=2 / 3, interval=_interval(2, 3), tasks=now, previous=_previous(before, 1.0), gate=GATE)
    assert [(c.task, c.change) for c in result.changed] == [("a", "regressed")]
    assert result.gated and "failing now: a" in result.reasons[-1]


def test_no_gate_compares_but_never_gates() -> None:
    result = compare(score=0.0, interval=_interval(0, 1), tasks={"a": _counts(0)},
                     previous=_previous({"a": _counts(1)}, 1.0), gate=None)
    assert result.changed[0].change == "regressed" and not result.gated and result.gate is None


@pytest.mark.parametrize("forged", [
    {"gated": False, "reasons": ()},
    {"score_delta": 0.5},
    {"changed": ()},
    {"reasons": ("all good",)},
])
def test_a_comparison_that_is_not_what_the_scores_give_is_refused_naming_the_field(forged: dict[str, object]) -> None:
    tasks = {"a": _counts(0)}
    honest = compare(score=0.0, interval=_interval(0, 1), tasks=tasks, previous=_previous({"a": _counts(1)}, 1.0),
                     gate=GATE)
    check_comparison(honest, score=0.0, interval=_interval(0, 1), tasks=tasks, where="summary.json comparison")
    lie = honest.model_copy(update=forged)
    with pytest.raises(CheckFailed, match=r"^summary.json comparison\.(gated|score_delta|changed|reasons): says "):
        check_comparison(lie, score=0.0, interval=_interval(0, 1), tasks=tasks, where="summary.json comparison")
    with pytest.raises(CheckFailed, match="needs a scored release"):
        check_comparison(honest, score=None, interval=None, tasks=None, where="x")


def test_the_comparison_document_refuses_a_malformed_previous_release() -> None:
    data = compare(score=1.0, interval=_interval(1, 1), tasks={"a": _counts(1)},
                   previous=_previous({"a": _counts(1)}, 1.0), gate=GATE).to_json_dict()
    assert data["schema"] == "benchseal.comparison/v1"
    Comparison.model_validate(data)
    for field, value in (("summary_digest", "sha256:XYZ"), ("score", 1.5), ("commit", "abc"), ("tag", "v1\n")):
        bad = dict(data, previous=dict(data["previous"], **{field: value}))
        with pytest.raises(ValueError):
            Comparison.model_validate(bad)


# --- the queue's history, both backends -------------------------------------------------------------

def _graded(run_id: str, payload: DispatchPayload, outcomes: dict[str, str]) -> Grading:
    trials = tuple(TrialRecord(task=task, trial_name=f"{task}__{run_id[-7:]}", outcome=outcome,  # type: ignore[arg-type]
                               reward=1.0 if outcome == "resolved" else 0.0, agent_name="oracle")
                   for task, outcome in sorted(outcomes.items()))
    resolved = sum(o == "resolved" for o in outcomes.values())
    counts = GradeCounts(total=len(outcomes), completed=len(outcomes), resolved=resolved,
                         unresolved=len(outcomes) - resolved, infra_errors=0)
    return Grading(run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle", counts=counts,
                   score=round(resolved / len(outcomes), 6), trials=trials, runner_ref=payload.runner,
                   api_ref=payload.api, started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z")


def _release(queue, make_payload, policy: InfraPolicy, n: int, tag: str, outcomes: dict[str, str],
             repository: str = "acme/widget") -> tuple[str, ScoredRelease]:
    payload = DispatchPayload.model_validate(make_payload(
        correlation_id=f"history-corr-{n:06d}", source={"repository": repository, "commit": COMMIT, "tag": tag}))
    run_id, _ = queue.enqueue(payload, max_attempts=3)
    record = queue.claim("w1", 60)
    assert record is not None and record.run_id == run_id and record.lease_token
    grading = _graded(run_id, payload, outcomes)
    release = scored_release(queue, record, grading, policy)
    assert release is not None
    queue.complete(run_id, record.lease_token, grading, [], release=release)
    return run_id, release


def test_history_sequence_first_right_then_wrong_gated_then_compared_with_the_last_good(
        make_payload, queue_spec, infra_policy) -> None:
    policy = infra_policy
    policy = policy.model_copy(update={"suites": {
        name: suite.model_copy(update={"gate": GATE}) for name, suite in policy.suites.items()}})
    right = {"a": "resolved", "b": "resolved", "c": "resolved"}
    with queue_spec.open() as q:
        first, r1 = _release(q, make_payload, policy, 1, "v1.0.0", right)
        assert r1.comparison.previous is None and not r1.comparison.gated
        # Not sealed yet: nothing to compare the next release with.
        assert q.previous_release("acme/widget", "smoke", "v1.1.0") is None
        q.record_summary(first, DIGEST)
        q.record_summary(first, DIGEST)  # idempotent
        with pytest.raises(CheckFailed, match="was recorded as"):
            q.record_summary(first, "sha256:" + "cd" * 32)
        with pytest.raises(ValidationError):
            q.record_summary(first, "sha256:nothex")
        # Repository names compare case-insensitively.
        assert q.previous_release("ACME/Widget", "smoke", "v1.1.0") is not None
        assert q.previous_release("acme/widget", "other-suite", "v1.1.0") is None

        wrong, r2 = _release(q, make_payload, policy, 2, "v1.1.0", {"a": "resolved", "b": "unresolved",
                                                                    "c": "unresolved"})
        assert r2.comparison.previous is not None and r2.comparison.previous.tag == "v1.0.0"
        assert r2.comparison.previous.summary_digest == DIGEST and r2.comparison.previous.run_id == first
        assert r2.comparison.gated and r2.comparison.regressed_tasks == ("b", "c")
        assert any("failing now: b, c" in reason for reason in r2.comparison.reasons)
        assert q.comparison(wrong) == r2.comparison
        q.record_summary(wrong, "sha256:" + "ef" * 32)

        # The gated release is published and sealed, but the next one is compared with the last good one.
        _, r3 = _release(q, make_payload, policy, 3, "v1.2.0", right)
        assert r3.comparison.previous is not None and r3.comparison.previous.run_id == first
        assert not r3.comparison.gated and r3.comparison.changed == ()
        # Another repository has its own history.
        _, other = _release(q, make_payload, policy, 4, "v9.0.0", {"a": "unresolved"}, repository="acme/other")
        assert other.comparison.previous is None and not other.comparison.gated

        history = q.history("acme/widget")
        assert [(e.tag, e.gated, e.summary_digest is not None) for e in history] == [
            ("v1.0.0", False, True), ("v1.1.0", True, True), ("v1.2.0", False, False)]
        assert q.history_repositories() == ["acme/other", "acme/widget"]
        assert q.comparison("run-" + "f" * 20) is None


def test_complete_refuses_a_history_entry_that_is_not_the_runs(make_payload, queue_spec, infra_policy) -> None:
    policy = infra_policy
    with queue_spec.open() as q:
        payload = DispatchPayload.model_validate(make_payload(correlation_id="history-corr-000010"))
        run_id, _ = q.enqueue(payload, max_attempts=3)
        record = q.claim("w1", 60)
        assert record is not None and record.lease_token
        grading = _graded(run_id, payload, {"a": "resolved"})
        release = scored_release(q, record, grading, policy)
        assert release is not None
        lying = ScoredRelease(entry=release.entry.model_copy(update={"score": 0.5}), comparison=release.comparison)
        with pytest.raises(ValidationError, match="release"):
            q.complete(run_id, record.lease_token, grading, [], release=lying)
        failed = grading.model_copy(update={"status": "FAILED", "score": None, "reason": "x"})
        with pytest.raises(ValidationError, match="release"):
            q.complete(run_id, record.lease_token, failed, [], release=release)
        assert q.history("acme/widget") == [] and q.get_run(run_id).state == "CLAIMED"  # nothing half-written
        assert scored_release(q, record, failed, policy) is None  # a run without a score has no entry
        q.complete(run_id, record.lease_token, grading, [], release=release)
        assert [e.run_id for e in q.history("acme/widget")] == [run_id]


def test_the_entry_carries_what_the_summary_will_say(make_payload, queue_spec, infra_policy) -> None:
    policy = infra_policy
    with queue_spec.open() as q:
        _, release = _release(q, make_payload, policy, 20, "v2.0.0", {"a": "resolved", "b": "unresolved"})
        entry = release.entry
        assert entry.score == 0.5 and entry.tasks == task_counts([("a", "resolved"), ("b", "unresolved")])
        assert entry.interval == _interval(1, 2)
        assert entry.commit == COMMIT and entry.repository == "acme/widget" and entry.suite == "smoke"


# --- the gate in the infra policy ------------------------------------------------------------------

def _policy_with_gate(tmp: Path, gate: object) -> Path:
    data = yaml.safe_load(POLICY_PATH.read_text())
    data["suites"]["smoke"]["gate"] = gate
    path = tmp / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_shipped_policy_gates_the_smoke_suite_and_a_suite_may_set_no_gate(tmp_path: Path) -> None:
    assert load_policy().suites["smoke"].gate == GateRules(interval_below_previous=True, resolved_task_fails=True)
    assert load_policy(_policy_with_gate(tmp_path, None)).suites["smoke"].gate is None
    only = load_policy(_policy_with_gate(tmp_path, {"resolved_task_fails": False})).suites["smoke"].gate
    assert only == GateRules(interval_below_previous=True, resolved_task_fails=False)


@pytest.mark.parametrize(("gate", "field", "rule"), [
    ({"interval_below_previous": "yes"}, "suites.smoke.gate.interval_below_previous", "valid boolean"),
    ({"resolved_task_fails": 1}, "suites.smoke.gate.resolved_task_fails", "valid boolean"),
    ({"score_drop": 0.1}, "suites.smoke.gate.score_drop", "Extra inputs are not permitted"),
    ([True], "suites.smoke.gate", "valid dictionary"),
])
def test_a_bad_gate_is_refused_naming_the_field_exit_2_in_one_line(tmp_path: Path, gate: object, field: str,
                                                                   rule: str) -> None:
    path = _policy_with_gate(tmp_path, gate)
    with pytest.raises(ValidationError) as caught:
        load_policy(path)
    assert caught.value.field == f"policy infra.yaml: {field}" and rule in caught.value.rule, caught.value
    done = subprocess.run([sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-", "--policy",
                           str(path)], input="{}", capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and field in done.stderr, done.stderr
