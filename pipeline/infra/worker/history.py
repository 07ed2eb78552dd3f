"""A graded run's place in its repository's history: the comparison with the previous scored release
and the regression gate's verdict (the rule: ``pipeline.core.history``), recorded by the worker in the
transaction that completes the run (``Queue.complete(..., release=...)``)."""

from __future__ import annotations

from datetime import datetime

from pipeline.core.contracts import Grading
from pipeline.core.documents import HistoryEntry
from pipeline.core.history import baseline, compare
from pipeline.core.scoring import grading_noise
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.queue.records import RunRecord, ScoredRelease
from pipeline.infra.queue.sql import Queue


def scored_release(queue: Queue, record: RunRecord, grading: Grading, policy: InfraPolicy) -> ScoredRelease | None:
    """The history entry and comparison of a SUCCEEDED run (None for a run without a score: it is
    neither compared nor gated, and never becomes anyone's previous release)."""
    if grading.status != "SUCCEEDED" or grading.score is None:
        return None
    source = record.payload.source
    # The same functions summary.json's interval and tasks come from, so the seal job and verify
    # recompute the comparison from the summary alone.
    interval, tasks = grading_noise(grading)
    # The history key is (repository, suite, dataset digest, task subset): a release is never compared with one on
    # other tasks.
    previous = baseline(queue.history(source.repository, grading.suite), source.tag,
                        dataset_digest=grading.dataset_digest, subset=grading.subset)
    suite = policy.suites.get(grading.suite)
    comparison = compare(score=grading.score, interval=interval, tasks=tasks,
                         previous=previous.as_previous() if previous is not None else None,
                         gate=suite.gate if suite is not None else None)
    entry = HistoryEntry(repository=source.repository, suite=grading.suite, tag=source.tag, run_id=record.run_id,
                         commit=source.commit, score=grading.score, interval=interval, tasks=tasks,
                         gated=comparison.gated, finished_at=datetime.fromisoformat(grading.finished_at),
                         dataset_digest=grading.dataset_digest, subset=grading.subset)
    return ScoredRelease(entry=entry, comparison=comparison)
