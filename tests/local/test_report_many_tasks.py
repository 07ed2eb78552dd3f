"""`benchseal release --local`'s closing report for a suite of many tasks (issue 36.5): a 164-task nop run names
its first INLINE_TASKS failures and says where the rest are, instead of printing a line per trial."""

from __future__ import annotations

from rich.console import Console

from pipeline.local.release import ReleaseReport
from pipeline.local.report import render_report
from pipeline.publish.body import INLINE_TASKS

N = 164


def _report(failed: int) -> ReleaseReport:
    tasks = [f"humaneval-{i}" for i in range(N)]
    comparison = {"previous": {"tag": "v0.0.0-demo", "run_id": "run-0", "score": 1.0}, "score_delta": -1.0,
                  "changed": [{"task": t, "change": "regressed"} for t in tasks[:failed]], "gated": False}
    return ReleaseReport(
        tag="v0.0.1-demo", release_dir="/tmp/dist/v0.0.1-demo", run_id="run-1", status="SUCCEEDED",
        score=(N - failed) / N, counts={"completed": N, "resolved": N - failed, "unresolved": failed,
                                        "infra_errors": 0, "total": N},
        images={}, images_reused=True, source={}, stages={"worker": 100.0}, comparison=comparison,
        failed_trials=[{"task": t, "outcome": "unresolved", "reason": "FAILED: CandidateError"} for t in tasks[:failed]])


def _render(report: ReleaseReport) -> list[str]:
    console = Console(record=True, width=160)
    render_report(report, console)
    return console.export_text().splitlines()


def test_a_failing_164_task_run_prints_the_first_trials_and_where_the_rest_are() -> None:
    lines = _render(_report(N))
    trials = [line for line in lines if line.startswith("trial ")]
    assert len(trials) == INLINE_TASKS + 1
    assert trials[-1] == (f"trial   and {N - INLINE_TASKS} more not resolved (every trial: "
                          "/tmp/dist/v0.0.1-demo/trial-results.json, per task: body.md and summary.json)")
    history = next(line for line in lines if line.startswith("history "))
    assert history.count("regressed") == INLINE_TASKS
    assert history.endswith(f"and {N - INLINE_TASKS} more (summary.json comparison)")
    assert len(lines) < 40


def test_a_few_failures_are_all_printed() -> None:
    lines = _render(_report(3))
    assert [line for line in lines if line.startswith("trial ")] == [
        f"trial   humaneval-{i} unresolved: FAILED: CandidateError" for i in range(3)]
    assert "more" not in next(line for line in lines if line.startswith("history "))
