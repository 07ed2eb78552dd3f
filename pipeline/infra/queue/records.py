"""What the queue hands out: run, trial, publication and event records, the states, and the names
derived from ids (``batch_label``; the run id is ``contracts.run_id_for``). Both backends build these from their rows."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal, get_args

from pipeline.core.contracts import DispatchPayload, Grading, PublicationRequest, RunOutcome, RunState, RunStatus
from pipeline.core.documents import Comparison, HistoryEntry

# A run's states are pipeline.core.contracts.RunState; the terminal ones are the grader's outcomes.
TERMINAL_STATES: frozenset[RunState] = frozenset(RunState(outcome) for outcome in get_args(RunOutcome))
ACTIVE_STATES: frozenset[RunState] = frozenset({RunState.CLAIMED, RunState.RUNNING})
RunPhase = Literal["run", "finalize"]


class TrialState(StrEnum):
    """A trial row's state (stored: the schema's CHECK is generated from this, pipeline.infra.queue.schema)."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    DONE = "DONE"


class PublicationState(StrEnum):
    """An outbox row's state (stored, like TrialState)."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"

# The packed evidence of one trial (pipeline.infra.worker.trial_evidence) may not exceed this.
MAX_TRIAL_EVIDENCE_BYTES = 64 * 1024 * 1024


@functools.lru_cache(maxsize=4096)
def parse_payload(text: str) -> DispatchPayload:
    """A stored payload, validated once per process (DispatchPayload is frozen, so sharing it is safe):
    every RunRecord of a run carries the same payload text."""
    return DispatchPayload.model_validate_json(text)


def batch_label(lease_token: str) -> str:
    """What names a trial batch outside the queue (a container label): a hash of its lease token,
    never the token itself (the token is what authorises the batch's transitions)."""
    return hashlib.sha256(lease_token.encode("ascii")).hexdigest()[:24]


def canonical_payload(payload: DispatchPayload) -> str:
    return json.dumps(payload.to_json_dict(), sort_keys=True)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    correlation_id: str
    payload: DispatchPayload
    state: RunState
    attempts: int
    max_attempts: int
    lease_token: str | None
    lease_expires_at: datetime | None
    worker: str | None
    reason: str | None
    grading: Grading | None
    created_at: str
    updated_at: str
    # "finalize": the attempts are used up; the next claim grades what completed and ends the run.
    phase: RunPhase = "run"
    finalize_attempts: int = 0
    # How many trial rows the run was split into (0: not planned yet). Once planned, the run's
    # trials are claimed one batch at a time (``claim_trials``), possibly by workers on other hosts.
    trials_planned: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def status(self) -> RunStatus:
        """The run's status as run.json, the export and the API show it: one view of this row."""
        grading = self.grading
        return RunStatus(run_id=self.run_id, correlation_id=self.correlation_id, state=self.state,
                         attempts=self.attempts, suite=self.payload.suite, agent=self.payload.agent,
                         source=self.payload.source, runner=self.payload.runner, api=self.payload.api,
                         created_at=self.created_at, updated_at=self.updated_at,
                         score=grading.score if grading else None, counts=grading.counts if grading else None,
                         agent_artifact=self.payload.agent_artifact)


@dataclass(frozen=True)
class TrialClaim:
    """One claimed trial of a batch."""

    idx: int
    task: str
    trial_name: str
    attempts: int
    max_attempts: int


@dataclass(frozen=True)
class TrialBatch:
    """Trials of ONE run claimed together under one lease token (one runner container runs them)."""

    run: RunRecord
    lease_token: str
    trials: tuple[TrialClaim, ...]


@dataclass(frozen=True)
class TrialRow:
    """A trial as the queue holds it; ``result`` is the graded trial (JSON, opaque to the queue)."""

    run_id: str
    idx: int
    task: str
    trial_name: str
    state: TrialState
    attempts: int
    max_attempts: int
    worker: str | None
    reason: str | None
    result: str | None


@dataclass(frozen=True)
class Publication:
    id: int
    request: PublicationRequest
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    state: PublicationState
    result: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Event:
    id: int
    run_id: str
    at: str
    event: str
    from_state: str | None
    to_state: str | None
    detail: str | None


@dataclass(frozen=True)
class WorkerBeat:
    worker: str
    last_seen: datetime
    run_id: str | None
    problem: str | None = None  # why it claims nothing (``Queue.worker_problem``); None once it claims again


@dataclass(frozen=True)
class QueueStats:
    """What ``benchseal infra status`` shows about the queue as a whole."""

    backend: str
    location: str
    schema_version: int
    by_state: Mapping[str, int]
    depth: int  # QUEUED runs (finalize-phase ones included)
    finalize_pending: int
    in_flight: int  # CLAIMED + RUNNING
    expired_leases: int
    outbox_pending: int
    workers: tuple[WorkerBeat, ...]
    trials_queued: int = 0  # trials of planned runs waiting for a worker
    trials_in_flight: int = 0  # trials claimed (RUNNING) by some worker


@dataclass(frozen=True)
class ScoredRelease:
    """A SUCCEEDED run's history entry and its comparison with the previous release, recorded by
    ``Queue.complete`` with the run's terminal state."""

    entry: HistoryEntry
    comparison: Comparison
