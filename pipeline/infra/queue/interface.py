"""``Queue``: what the dispatcher, worker and publisher need from a queue backend (the rules and the
states are described in ``pipeline.infra.queue.sql``)."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from pipeline.core.contracts import DispatchPayload, Grading, PublicationRequest, RunState
from pipeline.core.digests import validate_digest
from pipeline.core.documents import Comparison, HistoryEntry, PlannedTrial
from pipeline.infra.queue.records import Event, Publication, QueueStats, RunRecord, ScoredRelease, TrialBatch, TrialRow

# The ``accepted`` event's detail when accept checked a policy digest: this prefix, then ``sha256:HEX``.
ACCEPTED_POLICY = "policy "


class Queue(abc.ABC):
    """What the dispatcher, worker and publisher need from a queue backend."""

    runs_dir: Path
    # Whether workers on other hosts may share this queue (then a trial's dir can be on another host
    # than its grader's, and each trial's evidence travels in the queue).
    spans_hosts = False

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def enqueue(self, payload: DispatchPayload, *, max_attempts: int,
                policy_digest: str | None = None) -> tuple[str, bool]:
        """Insert a run once per correlation id; return (run_id, created).

        The same correlation id with a different payload is refused (ValidationError) and
        recorded as ``redelivery_refused``. ``policy_digest``: the infra policy accept checked the run
        against (``infra accept --policy-digest``), recorded with its ``accepted`` event.
        """

    def accepted_policy(self, run_id: str) -> str | None:
        """The policy digest the run was accepted under (``enqueue``'s ``policy_digest``); None when accept
        checked none. The worker runs and grades the run only under that policy (``policy_home``)."""
        for event in self.events(run_id):
            if event.event == "accepted" and event.detail is not None and event.detail.startswith(ACCEPTED_POLICY):
                return validate_digest(event.detail.removeprefix(ACCEPTED_POLICY), "accepted policy digest")
        return None

    @abc.abstractmethod
    def claim(self, worker: str, lease_seconds: float, now: datetime | None = None) -> RunRecord | None:
        """Move the oldest QUEUED run to CLAIMED under a fresh lease; None when nothing is queued."""

    @abc.abstractmethod
    def start(self, run_id: str, lease_token: str) -> None: ...

    @abc.abstractmethod
    def heartbeat(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool: ...

    @abc.abstractmethod
    def release(self, run_id: str, lease_token: str, reason: str) -> None: ...

    @abc.abstractmethod
    def fail_infra(self, run_id: str, lease_token: str, reason: str) -> RunState: ...

    @abc.abstractmethod
    def begin_finalize(self, run_id: str, lease_token: str, reason: str) -> None: ...

    @abc.abstractmethod
    def complete(
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest],
        *, release: ScoredRelease | None = None,
    ) -> list[int]:
        """Terminal state + grading + outbox rows (+ a scored run's history entry) in one transaction;
        returns the outbox row ids."""

    # --- the history of scored releases ---------------------------------------------

    @abc.abstractmethod
    def previous_release(self, repository: str, suite: str, tag: str) -> HistoryEntry | None:
        """What a release of ``repository``/``suite``/``tag`` is compared with (``pipeline.core.history.baseline``):
        the newest earlier tag's sealed, ungated standing release, never ``tag`` itself."""

    @abc.abstractmethod
    def history(self, repository: str, suite: str | None = None) -> list[HistoryEntry]: ...

    @abc.abstractmethod
    def history_repositories(self) -> list[str]: ...

    @abc.abstractmethod
    def comparison(self, run_id: str) -> Comparison | None: ...

    @abc.abstractmethod
    def worker_problem(self, worker: str, problem: str, now: datetime | None = None) -> None:
        """``worker`` polls but claims nothing, because of ``problem`` (one line): recorded with its heartbeat,
        shown by ``stats`` (``infra status``, ``doctor host``) until its next claim attempt clears it."""

    @abc.abstractmethod
    def record_summary(self, run_id: str, summary_digest: str) -> None:
        """The sealed summary.json's digest of ``run_id``'s release: from then on it can be compared with."""

    @abc.abstractmethod
    def requeue_expired(self, now: datetime | None = None) -> list[str]: ...

    # --- trials: the work split below the run ---------------------------------------

    @abc.abstractmethod
    def plan_trials(self, run_id: str, lease_token: str, trials: Sequence[PlannedTrial], *, max_attempts: int,
                    claim: int = 0, worker: str | None = None, lease_seconds: float = 0.0) -> TrialBatch | None:
        """Split a claimed run into trial rows (once) and give up the run's lease: from now on the run
        belongs to its trials. With ``claim`` > 0 the planner also claims its first batch (same transaction)."""

    @abc.abstractmethod
    def claim_trials(self, worker: str, lease_seconds: float, limit: int, *, run_id: str | None = None,
                     now: datetime | None = None) -> TrialBatch | None:
        """Claim up to ``limit`` QUEUED trials of one run (the oldest, or ``run_id``) under one fresh lease."""

    @abc.abstractmethod
    def heartbeat_trials(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool: ...

    @abc.abstractmethod
    def complete_trials(self, run_id: str, lease_token: str, results: Mapping[int, str], *,
                        lease_seconds: float, evidence: Mapping[int, bytes] | None = None) -> RunRecord | None:
        """Record graded trials of the batch (all or some of them, as they finish; each exactly once: a
        recorded trial is no longer held), each with its packed evidence when given (``evidence`` keys
        are a subset of ``results``'). When this ends the run's LAST trial (checked in the same
        transaction), the caller gets the run under a fresh lease and must grade it and ``complete`` it;
        otherwise None."""

    @abc.abstractmethod
    def fail_trials(self, run_id: str, lease_token: str, reason: str, *, lease_seconds: float) -> RunRecord | None:
        """An infrastructure failure of the batch: each trial is requeued until its attempts are used up,
        then ends with no result (graded as an infrastructure error). Returns the run like ``complete_trials``."""

    @abc.abstractmethod
    def release_trials(self, run_id: str, lease_token: str, reason: str) -> None:
        """Give the batch back (SIGTERM): requeued, no attempt used."""

    @abc.abstractmethod
    def trials(self, run_id: str) -> list[TrialRow]: ...

    @abc.abstractmethod
    def trial_evidence(self, run_id: str, idx: int) -> bytes | None:
        """The packed evidence recorded with trial ``idx`` of ``run_id``; None when none was recorded."""

    @abc.abstractmethod
    def held_batches(self, run_id: str) -> set[str]:
        """``batch_label`` of every lease that holds a trial of ``run_id`` now (what may still run)."""

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRecord: ...

    @abc.abstractmethod
    def list_runs(self) -> list[RunRecord]: ...

    @abc.abstractmethod
    def events(self, run_id: str) -> list[Event]: ...

    @abc.abstractmethod
    def stats(self, now: datetime | None = None) -> QueueStats: ...

    @abc.abstractmethod
    def pending_publications(self, limit: int = 10, now: datetime | None = None) -> list[Publication]: ...

    @abc.abstractmethod
    def get_publication(self, pub_id: int) -> Publication: ...

    @abc.abstractmethod
    def list_publications(self, run_id: str | None = None) -> list[Publication]: ...

    @abc.abstractmethod
    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool: ...

    @abc.abstractmethod
    def mark_published(self, pub_id: int, result: Mapping[str, object]) -> None: ...

    @abc.abstractmethod
    def record_publication_failure(self, pub_id: int, error: str, retry_at: datetime) -> None: ...
