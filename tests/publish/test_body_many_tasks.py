"""A release body for a suite of many tasks (issue 36.5: HumanEval's 164): the facts table, the body's first
screen, names at most INLINE_TASKS tasks in any cell; every task is in one folded per-task table after it."""

from __future__ import annotations

from typing import Any

from pipeline.publish.body import INLINE_TASKS, MAX_TASKS_SHOWN, REASON_CHARS, facts_from_summary, render_section
from tests.publish.test_publish_body import SUMMARY, _with_comparison

N = 164
REASON = "FAILED: CandidateError: loading the solution failed: FileNotFoundError " + "x" * 80


def _summary(resolved: int, total: int = N, **extra: Any) -> dict[str, Any]:
    tasks = {f"humaneval-{i}": {"attempts": 1, "completed": 1, "resolved": int(i < resolved)} for i in range(total)}
    trials = [{"task": task, "trial": f"{task}__abc", "outcome": "resolved" if c["resolved"] else "unresolved",
               "reward": float(c["resolved"]), "total_seconds": 4.0, "agent_seconds": 1.0, "verifier_seconds": 1.0,
               "model_calls": None, "input_tokens": None, "output_tokens": None,
               **({} if c["resolved"] else {"reason": REASON})} for task, c in tasks.items()]
    return {**SUMMARY, "counts": {"total": total, "completed": total, "resolved": resolved,
                                  "unresolved": total - resolved, "infra_errors": 0},
            "score": round(resolved / total, 6), "tasks": tasks,
            "timings": {**SUMMARY["timings"], "trials": trials}, **extra}


def _table(text: str) -> list[str]:
    """The facts table: the section's lines up to the first blank line after its header."""
    lines = text.splitlines()
    start = lines.index("|---|---|")
    end = lines.index("", start)
    return lines[start + 1:end]


def test_a_failing_164_task_run_keeps_the_first_screen_short_and_folds_every_task() -> None:
    text = render_section(facts_from_summary(_summary(resolved=4), "v1.2.3"))
    table = _table(text)
    failed = next(line for line in table if line.startswith("| Trials not resolved |"))
    assert failed.count("humaneval") == INLINE_TASKS
    assert f"and {N - 4 - INLINE_TASKS} more (per-task results below, trial-results.json)" in failed
    assert all(line.count("humaneval") <= INLINE_TASKS for line in table)
    assert len(table) < 30  # rows, not tasks
    # The folded table: one row per task, after the facts table, closed before the verify lines.
    opened = text.index("<details><summary>Per-task results: 164 tasks, 4 resolved in every attempt")
    assert opened > text.index("| Correlation id |")
    folded = text[opened:text.index("</details>", opened)]
    rows = [line for line in folded.splitlines() if line.startswith("| humaneval")]
    assert len(rows) == N
    assert rows[0].startswith("| humaneval\\-0 | 1/1 |  |")  # resolved: no reason
    assert [row.split(" | ")[0] for row in rows[:3]] == ["| humaneval\\-0", "| humaneval\\-1", "| humaneval\\-2"]
    cut = rows[-1].split(" | ")[2]
    assert cut.startswith("unresolved`:` FAILED`:` CandidateError") and cut.endswith("… |")
    assert len(cut) < REASON_CHARS + 40  # cut before escaping; the escapes add a few characters


def test_the_oracle_at_164_tasks_folds_the_table_and_names_no_task_in_the_facts() -> None:
    text = render_section(facts_from_summary(_summary(resolved=N), "v1.2.3"))
    assert not any("humaneval" in line for line in _table(text))
    assert "Per-task results: 164 tasks, 164 resolved in every attempt" in text
    assert "Trials not resolved" not in text


def test_a_small_suite_has_no_folded_table() -> None:
    text = render_section(facts_from_summary(_summary(resolved=1, total=3), "v1.2.3"))
    assert "Per-task results" not in text
    assert "| Trials not resolved | humaneval\\-1 (unresolved)" in text


def test_the_folded_table_is_bounded_and_says_how_many_more() -> None:
    total = MAX_TASKS_SHOWN + 7
    text = render_section(facts_from_summary(_summary(resolved=0, total=total), "v1.2.3"))
    assert "| and 7 more | | summary.json tasks |" in text
    assert len(text) < 60_000


def test_many_changed_tasks_name_the_first_ones() -> None:
    previous = {"tag": "v1.2.2", "run_id": "run-0", "commit": "d" * 40, "summary_digest": "sha256:" + "e" * 64,
                "score": 1.0, "tasks": _summary(resolved=N)["tasks"]}
    now = _summary(resolved=0)
    comparison = _with_comparison(previous, now["tasks"], {})["comparison"]
    text = render_section(facts_from_summary({**now, "comparison": comparison}, "v1.2.3"))
    changed = next(line for line in _table(text) if line.startswith("| Tasks changed |"))
    assert changed.count("regressed") == INLINE_TASKS
    assert f"and {N - INLINE_TASKS} more (summary.json comparison)" in changed
