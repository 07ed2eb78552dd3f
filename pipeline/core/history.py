"""A release against its repository's previous scored release, and the suite's regression gate.

The infra keeps, per source repository and suite, the history of its scored releases (the queue's
``releases`` table, so every host sees the same). A tag is released once: from one commit
(``tag_refusal``, checked where a dispatch is accepted, where the history entry is recorded and where
the local target writes the release directory). When a run is graded the worker compares it with
its ``baseline``: the standing release of the newest earlier tag whose standing release was sealed
and not gated (a tag's standing release is its latest entry: a re-run supersedes the tag's earlier
ones). A re-run of a tag (the same commit) gets the baseline the tag's first scoring had, never the
tag itself. ``compare`` is the whole comparison rule, pure; the worker writes its result, the seal
job and ``benchseal verify`` call ``check_comparison`` to recompute it from the same inputs (one rule,
producer and consumers alike).

A task's pass rate is resolved / completed over its attempts (None when no attempt completed: an
infrastructure error says nothing about the agent). Between two releases a task is

* ``regressed`` / ``improved`` when both rates exist and the rate fell / rose;
* ``added`` / ``removed`` when only one release ran it;
* ``regressed`` too when the previous release resolved the task at least once and this one has no
  rate (only infrastructure errors): whatever the reason, a task resolved before and not now is a
  regression (issue 35: an agent that makes a task unjudgeable must not slip past the gate);
* ``unjudged`` when one side has no rate (only infrastructure errors) and the other has one otherwise.

The gate (``GateRules``, a suite's ``gate`` in the infra policy) holds a release back when
``interval_below_previous``: the upper end of its 95 % interval is below the previous score (the drop
is more than noise), or ``resolved_task_fails``: a task the previous release resolved in every
completed attempt now fails at least one attempt, or completes none (only infrastructure errors). The first release of a repository has
nothing to compare with and is never gated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.core.contracts import SCORE_DIGITS, Grading
from pipeline.core.documents import (
    Change,
    Comparison,
    GateRules,
    HistoryEntry,
    PreviousRelease,
    ScoreInterval,
    TaskChange,
    TaskCounts,
)
from pipeline.core.errors import CheckFailed
from pipeline.core.scoring import grading_noise

__all__ = ["Comparison", "GateRules", "HistoryEntry", "PreviousRelease", "TaskChange", "baseline", "check_comparison",
           "check_graded_comparison", "compare", "pass_rate", "tag_key", "tag_refusal"]

_REF_PREFIX = "refs/tags/"


def tag_key(tag: str) -> str:
    """The form two tags of one repository are compared in: one leading ``refs/tags/`` dropped, then
    lowercased (the tag rule admits ASCII only). ``v1.0``, ``V1.0`` and ``refs/tags/v1.0`` are one tag
    here: they would name one GitHub release page or one directory on a case-insensitive filesystem."""
    if tag[:len(_REF_PREFIX)].lower() == _REF_PREFIX:
        tag = tag[len(_REF_PREFIX):]
    return tag.lower()


def tag_refusal(*, repository: str, tag: str, commit: str, released_tag: str, released_commit: str) -> str | None:
    """Why a release of ``tag`` at ``commit`` may not follow the one recorded for the same tag
    (``released_tag`` at ``released_commit``), in one line; None when it may (a re-run of that commit)."""
    if released_commit != commit:
        return (f"tag {tag} of {repository} was released from commit {released_commit}; a tag is released once: "
                f"refusing commit {commit} (release it under a new tag)")
    if released_tag != tag:
        return (f"tag {tag} of {repository} is the tag already released as {released_tag} (commit "
                f"{released_commit}): one tag, one spelling")
    return None


ANY_DATASET = "any"  # baseline's default: not a digest, so no entry's dataset is excluded


def baseline(history: Sequence[HistoryEntry], tag: str, *, dataset_digest: str | None = ANY_DATASET,
             subset: tuple[str, ...] | str | None = ANY_DATASET) -> HistoryEntry | None:
    """The entry a release of ``tag`` is compared with, from its repository and suite's ``history``
    (oldest first): among the tags recorded before ``tag``'s first entry, newest first, the first whose
    standing entry (its latest) was sealed and not gated. A gated or superseded entry, and ``tag``
    itself, are never a baseline; a re-run of ``tag`` sees what its first scoring saw.

    With ``dataset_digest`` (the release's dataset content digest) only entries of that same dataset
    count: the dataset is part of the history key, and two datasets never compare as one (an entry
    recorded before datasets were pinned, with no digest, matches only a release without one). With
    ``subset`` (the release's task subset, None for the whole suite) likewise: a subset run is compared only
    with runs of exactly that subset, a full-suite run only with full-suite runs."""
    key = tag_key(tag)
    first = next((index for index, entry in enumerate(history) if tag_key(entry.tag) == key), len(history))
    standing: dict[str, HistoryEntry] = {}  # insertion order: each tag's first entry; the value: its latest
    for entry in history[:first]:
        if dataset_digest != ANY_DATASET and entry.dataset_digest != dataset_digest:
            continue
        if subset != ANY_DATASET and entry.subset != subset:
            continue
        standing[tag_key(entry.tag)] = entry
    for entry in reversed(standing.values()):
        if not entry.gated and entry.summary_digest is not None:
            return entry
    return None


def pass_rate(counts: TaskCounts | None) -> float | None:
    if counts is None or counts.completed == 0:
        return None
    return counts.resolved / counts.completed


def _change(previous: TaskCounts | None, current: TaskCounts | None) -> Change | None:
    if previous is None and current is None:
        return None
    if previous is None:
        return "added"
    if current is None:
        return "removed"
    before, now = pass_rate(previous), pass_rate(current)
    if before is None and now is None:
        return None
    if now is None and before is not None and before > 0:
        return "regressed"  # resolved before, unjudgeable now: never a way past the gate
    if before is None or now is None:
        return "unjudged"
    if now < before:
        return "regressed"
    if now > before:
        return "improved"
    return None


def task_change(previous: TaskCounts | None, current: TaskCounts | None) -> Change | None:
    """How one task changed between two releases (None: unchanged): the rule ``compare`` applies,
    for readers that set any two releases side by side (the API's comparison page)."""
    return _change(previous, current)


def _fully_resolved_then_failed(previous: TaskCounts | None, current: TaskCounts | None) -> bool:
    return (previous is not None and current is not None and previous.completed > 0
            and previous.resolved == previous.completed
            and (current.completed == 0 or current.resolved < current.completed))


def compare(*, score: float, interval: ScoreInterval | None, tasks: Mapping[str, TaskCounts],
            previous: PreviousRelease | None, gate: GateRules | None) -> Comparison:
    """The comparison of a scored release (its score, interval and per-task counts) with ``previous``."""
    if previous is None:
        return Comparison(previous=None, score_delta=None, changed=(), gate=gate, gated=False, reasons=())
    changed = []
    for task in sorted(set(tasks) | set(previous.tasks)):
        before, now = previous.tasks.get(task), tasks.get(task)
        kind = _change(before, now)
        if kind is not None:
            changed.append(TaskChange(task=task, change=kind, previous=before, current=now))
    reasons: list[str] = []
    if gate is not None and gate.interval_below_previous and interval is not None and interval.high < previous.score:
        reasons.append(f"the score's 95 % interval [{interval.low:g}, {interval.high:g}] lies below "
                       f"{previous.tag}'s score {previous.score:g}")
    if gate is not None and gate.resolved_task_fails:
        failed = [task for task in sorted(tasks) if _fully_resolved_then_failed(previous.tasks.get(task), tasks[task])]
        if failed:
            reasons.append(f"resolved in {previous.tag}, failing now: {', '.join(failed)}")
    return Comparison(previous=previous, score_delta=round(score - previous.score, SCORE_DIGITS),
                      changed=tuple(changed), gate=gate, gated=bool(reasons), reasons=tuple(reasons))


def check_graded_comparison(comparison: Comparison, grading: Grading, where: str) -> None:
    """``check_comparison`` for a graded run (the seal job's and the worker's finalizer's check)."""
    interval, tasks = grading_noise(grading)
    check_comparison(comparison, score=grading.score, interval=interval, tasks=tasks, where=where,
                     dataset_digest=grading.dataset_digest, subset=grading.subset)


def check_comparison(comparison: Comparison, *, score: float | None, interval: ScoreInterval | None,
                     tasks: Mapping[str, TaskCounts] | None, where: str,
                     dataset_digest: str | None = ANY_DATASET,
                     subset: tuple[str, ...] | str | None = ANY_DATASET) -> None:
    """CheckFailed unless ``comparison`` is what ``compare`` gives for this release against the previous
    release and gate rules it names (the consumer's recomputation; the field that differs is named), and
    (with ``dataset_digest`` and ``subset``, the release's) the previous release ran the same dataset and the
    same subset of its tasks."""
    if score is None or tasks is None:
        raise CheckFailed(f"{where}: a comparison needs a scored release with per-task counts")
    previous = comparison.previous
    if dataset_digest != ANY_DATASET and previous is not None and previous.dataset_digest != dataset_digest:
        raise CheckFailed(f"{where}.previous.dataset_digest: says {previous.dataset_digest}, but this release ran "
                          f"{dataset_digest}: two datasets never compare as one")
    if subset != ANY_DATASET and previous is not None and previous.subset != subset:
        raise CheckFailed(f"{where}.previous.subset: says {_subset(previous.subset)}, but this release ran "
                          f"{_subset(subset)}: a subset of the tasks never compares with another subset or the whole")
    expected = compare(score=score, interval=interval, tasks=tasks, previous=comparison.previous, gate=comparison.gate)
    for name in ("score_delta", "changed", "gated", "reasons"):
        claimed, actual = getattr(comparison, name), getattr(expected, name)
        if claimed != actual:
            raise CheckFailed(f"{where}.{name}: says {_shown(claimed)}, but the release's own scores give {_shown(actual)}")


def _subset(subset: object) -> str:
    return "the whole suite" if subset is None else "tasks " + ",".join(map(str, subset)) if isinstance(
        subset, tuple) else str(subset)


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    if isinstance(value, TaskChange):
        return f"{value.task}:{value.change}"
    return repr(value)
