"""The run queue and the durable publication outbox.

``Queue`` is the interface. ``SqlQueue`` holds the one implementation of its
rules, written once in portable SQL (``?`` placeholders) over two backends:

* ``SqliteQueue`` (the default; one host, several processes): WAL mode, every
  write in ``BEGIN IMMEDIATE``;
* ``PostgresQueue`` (``pipeline.infra.queue.postgres``; workers on several hosts):
  claims with ``SELECT ... FOR UPDATE SKIP LOCKED``.

Both guard every transition (``UPDATE ... WHERE state IN (...) AND
lease_token = ? RETURNING ...``: no row back, no transition), so two claimers can never both win and a worker
that lost its lease can change nothing.

States: QUEUED -> CLAIMED -> RUNNING -> SUCCEEDED | FAILED | INFRA_ERROR; trials:
QUEUED -> RUNNING -> DONE.
A claim holds a lease (random token + expiry) renewed by heartbeats; an expired
lease goes back to QUEUED. Once the attempts are used up (lease expiry or
infrastructure errors) the run goes back to QUEUED in the ``finalize`` phase:
the next worker grades whatever trials completed, runs the finalizer (evidence,
signing) and completes it, so EVERY terminal state is written by ``complete``
together with its grading and outbox rows, in one transaction.

Work split below the run (``trials``): a claimed run is planned once into trial rows
(``plan_trials``) and gives up its lease; workers on any host then claim batches of its trials
(``claim_trials``, each batch under its own lease token, attempts bounded per trial) and record
each trial's graded result (``complete_trials``). The transaction that ends a run's LAST trial
(it locks the run row, then counts) hands the run to that worker under a fresh lease; it grades
from the trial rows and ends the run with ``complete``, which refuses while any trial is open. A
run whose last trial ended by lease expiry, or whose grader died, is queued in the ``finalize``
phase and graded by the next claim.

Every change appends to ``events`` (the audit trail), and ``run.json``
(pipeline.core.contracts.RunStatus) in the run directory is rewritten atomically
after each committed change.

``open_queue`` chooses the backend: ``BENCHSEAL_QUEUE_URL`` /
``BENCHSEAL_QUEUE_URL_FILE`` (or ``url_file=``) select PostgreSQL, otherwise the
SQLite file. Schema versions are migrations (``migrate()``, run by
``benchseal infra migrate``); every open checks the version and refuses a
database that is behind or ahead.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote, urlsplit

from pipeline.core.contracts import DispatchPayload, Grading, PublicationRequest, RunState, RunStatus
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.fsutil import canonical_json
from pipeline.core.paths import home, state_dir

TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "INFRA_ERROR"})
ACTIVE_STATES: frozenset[str] = frozenset({"CLAIMED", "RUNNING"})
PublicationState = Literal["PENDING", "DELIVERED"]
RunPhase = Literal["run", "finalize"]
T = TypeVar("T")
log = logging.getLogger("benchseal.queue")

QUEUE_URL_ENV = "BENCHSEAL_QUEUE_URL"
QUEUE_URL_FILE_ENV = "BENCHSEAL_QUEUE_URL_FILE"
BUSY_TIMEOUT_ENV = "BENCHSEAL_QUEUE_BUSY_TIMEOUT"

# --- schema (SQLite) -------------------------------------------------------------
# Version 1 is the schema before versions were recorded (an unversioned database
# that has the runs table is at version 1).
_SQLITE_MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    correlation_id TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('QUEUED','CLAIMED','RUNNING','SUCCEEDED','FAILED','INFRA_ERROR')),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_token TEXT,
    lease_expires_at REAL,
    worker TEXT,
    reason TEXT,
    grading TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_state ON runs (state, created_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    at TEXT NOT NULL,
    event TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, id);
CREATE TABLE IF NOT EXISTS publications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    target TEXT NOT NULL,
    tag TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('PENDING','DELIVERED')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    lease_expires_at REAL,
    last_error TEXT,
    result TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (run_id, target, tag)
);
""",
    """
ALTER TABLE runs ADD COLUMN phase TEXT NOT NULL DEFAULT 'run' CHECK (phase IN ('run','finalize'));
ALTER TABLE runs ADD COLUMN finalize_attempts INTEGER NOT NULL DEFAULT 0;
CREATE TABLE workers (
    worker TEXT PRIMARY KEY,
    last_seen REAL NOT NULL,
    run_id TEXT
);
-- The claim order (finalize before run, then oldest) read straight from this index.
CREATE INDEX runs_claim ON runs (state, phase, created_at, run_id);
""",
    # Version 3: work split below the run (see "trials" in the module docstring).
    """
ALTER TABLE runs ADD COLUMN trials_planned INTEGER NOT NULL DEFAULT 0;
CREATE TABLE trials (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    idx INTEGER NOT NULL,
    task TEXT NOT NULL,
    trial_name TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('QUEUED','RUNNING','DONE')),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    lease_token TEXT,
    lease_expires_at REAL,
    worker TEXT,
    reason TEXT,
    result TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX trials_claim ON trials (state, created_at, run_id, idx);
CREATE INDEX trials_lease ON trials (run_id, lease_token);
""",
    # Version 4: each trial's evidence (its Harbor trial dir, packed by the host that ran it), so the
    # grading host publishes every trial's dir, wherever it ran.
    """
ALTER TABLE trials ADD COLUMN evidence BLOB;
""",
)
SCHEMA_VERSION = len(_SQLITE_MIGRATIONS)
# The packed evidence of one trial (pipeline.infra.worker.trial_evidence) may not exceed this.
MAX_TRIAL_EVIDENCE_BYTES = 64 * 1024 * 1024


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _epoch(moment: datetime | None) -> float:
    if moment is None:
        return time.time()
    if moment.tzinfo is None:
        raise ValidationError("now", "datetimes must be timezone-aware (UTC)", moment.isoformat())
    return moment.timestamp()


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def run_id_for(correlation_id: str) -> str:
    """The run id of a correlation id: stable, so a redelivery names the same run everywhere."""
    return "run-" + hashlib.sha256(correlation_id.encode("ascii")).hexdigest()[:20]


@functools.lru_cache(maxsize=4096)
def _parse_payload(text: str) -> DispatchPayload:
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


TrialState = Literal["QUEUED", "RUNNING", "DONE"]


@dataclass(frozen=True)
class PlannedTrial:
    """One trial of a run's plan: the task and Harbor's (deterministic) trial name."""

    task: str
    trial_name: str


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
    def enqueue(self, payload: DispatchPayload, *, max_attempts: int) -> tuple[str, bool]:
        """Insert a run once per correlation id; return (run_id, created).

        The same correlation id with a different payload is refused (ValidationError) and
        recorded as ``redelivery_refused``.
        """

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
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest]
    ) -> list[int]:
        """Terminal state + grading + outbox rows in one transaction; returns the outbox row ids."""

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


def default_db_path() -> Path:
    return state_dir("infra") / "queue.sqlite3"


class Cursor(Protocol):
    """The DB-API cursor subset both backends provide (``?`` placeholders)."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


_RUN_COLUMNS = ("run_id, correlation_id, payload, state, attempts, max_attempts, lease_token, lease_expires_at,"
                " worker, reason, grading, created_at, updated_at, phase, finalize_attempts, trials_planned")
_PUB_COLUMNS = "id, request, state, attempts, next_attempt_at, last_error, result"


class SqlQueue(Queue):
    """The queue's rules over a DB-API backend; subclasses give transactions and the claim lock clause."""

    backend = "sql"
    location = ""
    # Appended to the claim's SELECT: the PostgreSQL backend skips rows other claimers hold.
    _claim_lock = ""
    # Appended to a SELECT that must hold its row until COMMIT (SQLite: BEGIN IMMEDIATE already does).
    _row_lock = ""
    # Run first in a transaction whose loss in a database crash is harmless (a heartbeat: the lease
    # then expires a little earlier), so its COMMIT does not wait for the disk. None: no such setting.
    _relaxed_commit: str | None = None

    @abc.abstractmethod
    def _transaction(self, work: Callable[[Cursor], T]) -> T:
        """Run ``work`` in one write transaction (retried only when nothing can have been committed)."""

    @abc.abstractmethod
    def _read(self, work: Callable[[Cursor], T]) -> T:
        """Run ``work`` against a consistent read."""

    def __enter__(self) -> SqlQueue:
        return self

    @abc.abstractmethod
    def schema_version(self) -> int: ...

    @abc.abstractmethod
    def migrate(self) -> tuple[int, int]:
        """Apply the pending schema migrations; return (version before, version after)."""

    # --- plumbing ---------------------------------------------------------------

    @staticmethod
    def _event(cur: Cursor, run_id: str, event: str, from_state: str | None, to_state: str | None, detail: str | None, now: float) -> None:
        cur.execute(
            "INSERT INTO events (run_id, at, event, from_state, to_state, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, _iso(now), event, from_state, to_state, detail),
        )

    @staticmethod
    def _row(cur: Cursor, run_id: str) -> tuple[object, ...] | None:
        cur.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))  # noqa: S608
        row: tuple[object, ...] | None = cur.fetchone()
        return row

    @staticmethod
    def _record(row: Sequence[object]) -> RunRecord:
        (run_id, correlation_id, payload, state, attempts, max_attempts, token, expires, worker, reason, grading,
         created, updated, phase, finalize_attempts, trials_planned) = row
        return RunRecord(
            run_id=str(run_id),
            correlation_id=str(correlation_id),
            payload=_parse_payload(str(payload)),
            state=str(state),  # type: ignore[arg-type]
            attempts=int(str(attempts)),
            max_attempts=int(str(max_attempts)),
            lease_token=None if token is None else str(token),
            lease_expires_at=None if expires is None else datetime.fromtimestamp(float(str(expires)), UTC),
            worker=None if worker is None else str(worker),
            reason=None if reason is None else str(reason),
            grading=None if grading is None else Grading.model_validate_json(str(grading)),
            created_at=str(created),
            updated_at=str(updated),
            phase="finalize" if str(phase) == "finalize" else "run",
            finalize_attempts=int(str(finalize_attempts)),
            trials_planned=int(str(trials_planned)),
        )

    def _write_status(self, run_id: str, row: Sequence[object] | RunRecord | None = None) -> None:
        """Rewrite run.json from ``row`` (read in the committing transaction) or from the database."""
        if isinstance(row, RunRecord):
            record = row
        else:
            record = self._record(row) if row is not None else self.get_run(run_id)
        grading = record.grading
        status = RunStatus(
            run_id=record.run_id,
            correlation_id=record.correlation_id,
            state=record.state,
            attempts=record.attempts,
            suite=record.payload.suite,
            agent=record.payload.agent,
            source=record.payload.source,
            runner=record.payload.runner,
            api=record.payload.api,
            created_at=record.created_at,
            updated_at=record.updated_at,
            score=grading.score if grading else None,
            counts=grading.counts if grading else None,
        )
        # run.json is a view of the database, rewritten after every change: atomic (temp file +
        # os.replace) but not fsync'd, so the queue's own cost per transition stays small.
        # A failure here comes after the commit: the database stays the truth and the next change rewrites it.
        target = self.run_dir(run_id) / "run.json"
        tmp = target.with_name(f".run.json.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(canonical_json(status.model_dump(mode="json")), encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("run %s: run.json not rewritten (%s); the queue database holds the state", run_id, exc)

    def _transition(
        self,
        run_id: str,
        lease_token: str,
        *,
        from_states: Sequence[str],
        event: str,
        to_state: str,
        detail: str | None,
        sets: str = "",
        params: Sequence[object] = (),
    ) -> None:
        now = time.time()
        placeholders = ",".join("?" for _ in from_states)

        def work(cur: Cursor) -> tuple[object, ...] | None:
            # One possible from-state: it is the event's from-state, no read needed before the update.
            current = from_states[0] if len(from_states) == 1 else None
            if current is None:
                before = self._row(cur, run_id)
                if before is None:
                    raise ValidationError("run_id", "no such run", run_id)
                current = str(before[3])
            cur.execute(
                f"UPDATE runs SET state = ?, updated_at = ?{sets} WHERE run_id = ? AND lease_token = ?"  # noqa: S608
                f" AND state IN ({placeholders}) RETURNING {_RUN_COLUMNS}",
                (to_state, _iso(now), *params, run_id, lease_token, *from_states),
            )
            row: tuple[object, ...] | None = cur.fetchone()
            if row is None:
                found = self._row(cur, run_id)
                if found is None:
                    raise ValidationError("run_id", "no such run", run_id)
                raise CheckFailed(f"run {run_id}: lease not held (state {found[3]}); refusing {event}")
            self._event(cur, run_id, event, current, to_state, detail, now)
            return row

        self._write_status(run_id, self._transaction(work))

    @staticmethod
    def _beat(cur: Cursor, worker: str, run_id: str | None, at: float) -> None:
        cur.execute(
            "INSERT INTO workers (worker, last_seen, run_id) VALUES (?, ?, ?)"
            " ON CONFLICT (worker) DO UPDATE SET last_seen = excluded.last_seen, run_id = excluded.run_id",
            (worker, at, run_id),
        )

    # --- runs --------------------------------------------------------------------

    def enqueue(self, payload: DispatchPayload, *, max_attempts: int) -> tuple[str, bool]:
        run_id = run_id_for(payload.correlation_id)
        encoded = canonical_payload(payload)
        now = time.time()

        def work(cur: Cursor) -> tuple[str, bool, bool]:
            cur.execute(
                "INSERT INTO runs (run_id, correlation_id, payload, state, attempts, max_attempts, created_at, updated_at)"
                " VALUES (?, ?, ?, 'QUEUED', 0, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING run_id",
                (run_id, payload.correlation_id, encoded, max_attempts, _iso(now), _iso(now)),
            )
            if cur.fetchone() is not None:
                self._event(cur, run_id, "accepted", None, "QUEUED", None, now)
                return run_id, True, True
            cur.execute("SELECT run_id, payload FROM runs WHERE correlation_id = ?", (payload.correlation_id,))
            existing = cur.fetchone()
            if existing is None:
                raise CheckFailed(f"run id {run_id} is taken by another correlation id; refusing {payload.correlation_id!r}")
            same = str(existing[1]) == encoded
            # A refused redelivery is recorded as what it is, never as "redelivered".
            self._event(cur, str(existing[0]), "redelivered" if same else "redelivery_refused", None, None,
                        None if same else "same correlation id, different payload", now)
            return str(existing[0]), False, same

        found, created, same = self._transaction(work)
        if not same:
            # Same correlation id, different content: never silently merge two dispatches.
            raise ValidationError("payload.correlation_id", f"already used by run {found} with a different payload",
                                  payload.correlation_id)
        if created:
            self._write_status(found)
        return found, created

    def claim(self, worker: str, lease_seconds: float, now: datetime | None = None) -> RunRecord | None:
        at = _epoch(now)
        token = secrets.token_hex(16)

        def work(cur: Cursor) -> tuple[object, ...] | None:
            # One statement: pick the oldest QUEUED run (finalize before run: 'finalize' < 'run', their
            # results are already in), skipping rows other claimers hold, and claim it; the outer
            # state guard is the contract.
            cur.execute(
                "UPDATE runs SET state = 'CLAIMED', lease_token = ?, lease_expires_at = ?, worker = ?,"  # noqa: S608
                " attempts = attempts + CASE WHEN phase = 'run' THEN 1 ELSE 0 END,"
                " finalize_attempts = finalize_attempts + CASE WHEN phase = 'finalize' THEN 1 ELSE 0 END,"
                " updated_at = ? WHERE state = 'QUEUED' AND run_id = (SELECT run_id FROM runs WHERE state = 'QUEUED'"
                " ORDER BY phase, created_at, run_id LIMIT 1" + self._claim_lock + f") RETURNING {_RUN_COLUMNS}",
                (token, at + lease_seconds, worker, _iso(at)),
            )
            row: tuple[object, ...] | None = cur.fetchone()
            if row is None:
                self._beat(cur, worker, None, at)
                return None
            run_id = str(row[0])
            self._event(cur, run_id, "claimed", "QUEUED", "CLAIMED", f"worker={worker}", at)
            self._beat(cur, worker, run_id, at)
            return row

        row = self._transaction(work)
        if row is None:
            return None
        record = self._record(row)
        self._write_status(record.run_id, row)
        return record

    def start(self, run_id: str, lease_token: str) -> None:
        self._transition(run_id, lease_token, from_states=("CLAIMED",), event="started", to_state="RUNNING", detail=None)

    def heartbeat(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool:
        at = _epoch(now)

        def work(cur: Cursor) -> bool:
            if self._relaxed_commit:
                cur.execute(self._relaxed_commit)
            cur.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? AND state IN ('CLAIMED','RUNNING')"
                " RETURNING worker",
                (at + lease_seconds, run_id, lease_token),
            )
            row = cur.fetchone()
            if row is None:
                return False
            if row is not None and row[0] is not None:
                self._beat(cur, str(row[0]), run_id, at)
            return True

        return self._transaction(work)

    def release(self, run_id: str, lease_token: str, reason: str) -> None:
        # A voluntary release (SIGTERM) does not use up an attempt (of either phase).
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES), event="released", to_state="QUEUED", detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, worker = NULL,"
                 " phase = CASE WHEN trials_planned > 0 THEN 'finalize' ELSE phase END,"
                 " attempts = CASE WHEN phase = 'run' AND trials_planned = 0 AND attempts > 0 THEN attempts - 1 ELSE attempts END,"
                 " finalize_attempts = CASE WHEN phase = 'finalize' AND finalize_attempts > 0"
                 " THEN finalize_attempts - 1 ELSE finalize_attempts END",
        )

    def fail_infra(self, run_id: str, lease_token: str, reason: str) -> RunState:
        """Record an infrastructure error: requeue; once attempts are used up, requeue for finalization.

        Never terminal by itself: the run ends through ``complete`` (grading + outbox rows).
        """
        record = self.get_run(run_id)
        # A planned run has no attempts left to run: its trials ended; it waits to be graded again.
        exhausted = record.phase == "finalize" or record.attempts >= record.max_attempts or record.trials_planned > 0
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES),
            event="finalize_pending" if exhausted else "requeued", to_state="QUEUED", detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, reason = ?, phase = ?",
            params=(reason, "finalize" if exhausted else "run"),
        )
        return "QUEUED"

    def begin_finalize(self, run_id: str, lease_token: str, reason: str) -> None:
        """The attempts are used up: keep the lease and switch the run to its finalize phase."""
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES), event="finalizing", to_state="RUNNING", detail=reason,
            sets=", reason = ?, phase = 'finalize'", params=(reason,),
        )

    def complete(
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest]
    ) -> list[int]:
        """Terminal state + grading + outbox rows in ONE transaction; refuses unless the lease is held.

        Returns the ids of the run's outbox rows (so a caller can deliver them without a lookup)."""
        if grading.run_id != run_id:
            raise ValidationError("grading.run_id", f"must equal the run id {run_id}", grading.run_id)
        for index, request in enumerate(publications):
            if request.run_id != run_id:
                raise ValidationError(f"publications[{index}].run_id", f"must equal the run id {run_id}", request.run_id)
        now = time.time()

        def work(cur: Cursor) -> tuple[tuple[object, ...] | None, list[int]]:
            ended: tuple[object, ...] | None = None
            current = ""
            # RUNNING first (the usual case: no read before the update), then CLAIMED.
            for current in ("RUNNING", "CLAIMED"):
                cur.execute(
                    "UPDATE runs SET state = ?, grading = ?, reason = ?, lease_token = NULL, lease_expires_at = NULL,"  # noqa: S608
                    " updated_at = ? WHERE run_id = ? AND lease_token = ? AND state = ?"
                    # A planned run ends only once every one of its trials has ended.
                    " AND NOT EXISTS (SELECT 1 FROM trials WHERE trials.run_id = runs.run_id AND trials.state <> 'DONE')"
                    f" RETURNING {_RUN_COLUMNS}",
                    (grading.status, grading.model_dump_json(), grading.reason, _iso(now), run_id, lease_token, current),
                )
                ended = cur.fetchone()
                if ended is not None:
                    break
            if ended is None:
                found = self._row(cur, run_id)
                if found is None:
                    raise ValidationError("run_id", "no such run", run_id)
                raise CheckFailed(f"run {run_id}: lease not held or trials still open (state {found[3]}); refusing to complete")
            self._event(cur, run_id, "completed", current, grading.status, grading.reason, now)
            ids: list[int] = []
            for request in publications:
                cur.execute(
                    "INSERT INTO publications (run_id, target, tag, request, state, attempts, next_attempt_at, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, 'PENDING', 0, ?, ?, ?) ON CONFLICT (run_id, target, tag) DO NOTHING RETURNING id",
                    (run_id, request.target, request.tag, request.model_dump_json(), now, _iso(now), _iso(now)),
                )
                inserted = cur.fetchone()
                if inserted is not None:
                    ids.append(int(inserted[0]))
                self._event(cur, run_id, "publication_queued", None, None, f"{request.target}:{request.tag}", now)
            return ended, ids

        row, ids = self._transaction(work)
        self._write_status(run_id, row)
        return ids

    def requeue_expired(self, now: datetime | None = None) -> list[str]:
        """Requeue runs whose lease expired (a dead worker); to the finalize phase once attempts are used up."""
        at = _epoch(now)

        def expired(cur: Cursor) -> bool:
            cur.execute("SELECT 1 FROM runs WHERE state IN ('CLAIMED','RUNNING') AND lease_expires_at < ? LIMIT 1", (at,))
            return cur.fetchone() is not None

        # Trials first: a run whose last trial expires here is queued for grading in the same pass.
        changed_trials = self._requeue_expired_trials(at)
        # A plain read first: the common case (nothing expired) takes no write lock.
        if not self._read(expired):
            return changed_trials

        def work(cur: Cursor) -> list[str]:
            changed: list[str] = []
            cur.execute(
                "SELECT run_id, state, attempts, max_attempts, lease_token, phase, trials_planned FROM runs"  # noqa: S608
                " WHERE state IN ('CLAIMED','RUNNING') AND lease_expires_at < ?" + self._claim_lock,
                (at,),
            )
            for run_id, state, attempts, max_attempts, token, phase, planned in cur.fetchall():
                # A planned run's lease is its grader's: every trial has ended, so the next claim grades it.
                exhausted = phase == "finalize" or attempts >= max_attempts or int(planned) > 0
                if int(planned) > 0:
                    reason = "lease expired while grading; queued for grading again"
                elif exhausted:
                    reason = (f"lease expired on the final attempt ({attempts} of {max_attempts}); finalizing with the"
                              " trials that completed")
                else:
                    reason = "lease expired"
                cur.execute(
                    "UPDATE runs SET state = 'QUEUED', lease_token = NULL, lease_expires_at = NULL, reason = ?, phase = ?,"
                    " updated_at = ? WHERE run_id = ? AND lease_token = ? AND state = ? RETURNING run_id",
                    (reason, "finalize" if exhausted else "run", _iso(at), run_id, token, state),
                )
                if cur.fetchone() is not None:
                    self._event(cur, run_id, "lease_expired", state, "QUEUED", reason, at)
                    changed.append(str(run_id))
            return changed

        changed = self._transaction(work)
        for run_id in changed:
            self._write_status(run_id)
        return changed_trials + [r for r in changed if r not in changed_trials]

    # --- trials: the work split below the run -----------------------------------------
    # Lock order everywhere: the run row first, then its trial rows (no deadlock between a
    # completing batch and the expiry scan). Every transaction that can end a run's last trial
    # locks the run row before counting what is left, so exactly one of two concurrent batches
    # sees zero trials left (READ COMMITTED re-reads after the lock).

    def _lock_run(self, cur: Cursor, run_id: str) -> tuple[object, ...]:
        cur.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?" + self._row_lock, (run_id,))  # noqa: S608
        row: tuple[object, ...] | None = cur.fetchone()
        if row is None:
            raise ValidationError("run_id", "no such run", run_id)
        return row

    def _claim_trials(self, cur: Cursor, worker: str, lease_seconds: float, limit: int, run_id: str | None,
                      at: float) -> TrialBatch | None:
        if limit < 1:
            raise ValidationError("limit", "must be >= 1", limit)
        target = run_id
        if target is None:
            cur.execute("SELECT run_id FROM trials WHERE state = 'QUEUED'"  # noqa: S608
                        " ORDER BY created_at, run_id, idx LIMIT 1" + self._claim_lock)
            first = cur.fetchone()
            if first is None:
                return None
            target = str(first[0])
        cur.execute("SELECT idx FROM trials WHERE run_id = ? AND state = 'QUEUED' ORDER BY idx LIMIT ?"  # noqa: S608
                    + self._claim_lock, (target, int(limit)))
        picked = [int(r[0]) for r in cur.fetchall()]
        if not picked:
            return None
        token = secrets.token_hex(16)
        marks = ",".join("?" for _ in picked)
        cur.execute(
            "UPDATE trials SET state = 'RUNNING', lease_token = ?, lease_expires_at = ?, worker = ?,"  # noqa: S608
            f" attempts = attempts + 1, updated_at = ? WHERE run_id = ? AND state = 'QUEUED' AND idx IN ({marks})"
            " RETURNING idx, task, trial_name, attempts, max_attempts",
            (token, at + lease_seconds, worker, _iso(at), target, *picked),
        )
        claims = tuple(sorted((TrialClaim(idx=int(i), task=str(t), trial_name=str(n), attempts=int(a), max_attempts=int(m))
                               for i, t, n, a, m in cur.fetchall()), key=lambda c: c.idx))
        if len(claims) != len(picked):  # cannot happen under the row locks; the guard is the contract
            raise CheckFailed(f"run {target}: trials {picked} changed while being claimed")
        self._event(cur, target, "trials_claimed", None, None, f"worker={worker} trials={picked}", at)
        self._beat(cur, worker, target, at)
        run = self._row(cur, target)
        if run is None:
            raise ValidationError("run_id", "no such run", target)
        return TrialBatch(run=self._record(run), lease_token=token, trials=claims)

    def plan_trials(self, run_id: str, lease_token: str, trials: Sequence[PlannedTrial], *, max_attempts: int,
                    claim: int = 0, worker: str | None = None, lease_seconds: float = 0.0) -> TrialBatch | None:
        if not trials:
            raise ValidationError("trials", "a run must be planned with at least one trial", run_id)
        names = [t.trial_name for t in trials]
        if len(set(names)) != len(names):
            raise ValidationError("trials", "trial names must be unique within a run", run_id)
        if max_attempts < 1:
            raise ValidationError("max_attempts", "must be >= 1", max_attempts)
        if claim and (worker is None or lease_seconds <= 0):
            raise ValidationError("claim", "claiming a first batch needs a worker and a lease", claim)
        at = time.time()

        def work(cur: Cursor) -> tuple[tuple[object, ...] | None, TrialBatch | None]:
            current = str(self._lock_run(cur, run_id)[3])
            cur.execute(
                "UPDATE runs SET state = 'RUNNING', lease_token = NULL, lease_expires_at = NULL, worker = NULL,"
                " trials_planned = ?, updated_at = ? WHERE run_id = ? AND lease_token = ?"
                " AND state IN ('CLAIMED','RUNNING') AND phase = 'run' AND trials_planned = 0 RETURNING run_id",
                (len(trials), _iso(at), run_id, lease_token),
            )
            if cur.fetchone() is None:
                raise CheckFailed(f"run {run_id}: lease not held, or already planned (state {current}); refusing to plan trials")
            self._event(cur, run_id, "trials_planned", current, "RUNNING", f"{len(trials)} trials", at)
            for first in range(0, len(trials), 100):  # one statement per 100 trials
                chunk = list(enumerate(trials))[first:first + 100]
                cur.execute(
                    "INSERT INTO trials (run_id, idx, task, trial_name, state, attempts, max_attempts, created_at, updated_at)"  # noqa: S608
                    " VALUES " + ",".join("(?, ?, ?, ?, 'QUEUED', 0, ?, ?, ?)" for _ in chunk),
                    [v for idx, trial in chunk for v in (run_id, idx, trial.task, trial.trial_name, max_attempts,
                                                          _iso(at), _iso(at))],
                )
            batch = self._claim_trials(cur, worker or "", lease_seconds, claim, run_id, at) if claim else None
            return (None if batch is not None else self._row(cur, run_id)), batch

        row, batch = self._transaction(work)
        if batch is not None:
            self._write_status(run_id, batch.run)
        else:
            self._write_status(run_id, row)
        return batch

    def claim_trials(self, worker: str, lease_seconds: float, limit: int, *, run_id: str | None = None,
                     now: datetime | None = None) -> TrialBatch | None:
        at = _epoch(now)

        def any_queued(cur: Cursor) -> bool:
            if run_id is None:
                cur.execute("SELECT 1 FROM trials WHERE state = 'QUEUED' LIMIT 1")
            else:
                cur.execute("SELECT 1 FROM trials WHERE run_id = ? AND state = 'QUEUED' LIMIT 1", (run_id,))
            return cur.fetchone() is not None

        # The common case for an idle worker or one-trial runs (nothing queued) takes no write lock.
        if not self._read(any_queued):
            return None
        return self._transaction(lambda cur: self._claim_trials(cur, worker, lease_seconds, limit, run_id, at))

    def heartbeat_trials(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool:
        at = _epoch(now)

        def work(cur: Cursor) -> bool:
            if self._relaxed_commit:
                cur.execute(self._relaxed_commit)
            cur.execute("UPDATE trials SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? AND state = 'RUNNING'"
                        " RETURNING worker", (at + lease_seconds, run_id, lease_token))
            rows = cur.fetchall()
            if not rows:
                return False
            row = rows[0]
            if row is not None and row[0] is not None:
                self._beat(cur, str(row[0]), run_id, at)
            return True

        return self._transaction(work)

    def _held_trials(self, cur: Cursor, run_id: str, lease_token: str, what: str) -> tuple[list[int], str]:
        cur.execute("SELECT idx, worker FROM trials WHERE run_id = ? AND lease_token = ? AND state = 'RUNNING' ORDER BY idx",
                    (run_id, lease_token))
        rows = cur.fetchall()
        if not rows:
            raise CheckFailed(f"run {run_id}: trial lease not held; refusing {what}")
        return [int(r[0]) for r in rows], str(rows[0][1] or "")

    def _after_trials_end(self, cur: Cursor, run_id: str, worker: str | None, lease_seconds: float,
                          at: float) -> tuple[object, ...] | None:
        """When no trial of ``run_id`` is left, hand the run to ``worker`` under a fresh lease (it grades
        and completes it), or with no worker (lease expiry) queue it to be graded by the next claim."""
        cur.execute("SELECT COUNT(*) FROM trials WHERE run_id = ? AND state <> 'DONE'", (run_id,))
        if int(cur.fetchone()[0]) != 0:
            return None
        if worker is None:
            cur.execute(
                "UPDATE runs SET state = 'QUEUED', phase = 'finalize', lease_token = NULL, lease_expires_at = NULL,"
                " worker = NULL, updated_at = ? WHERE run_id = ? AND state = 'RUNNING' AND lease_token IS NULL"
                " AND trials_planned > 0 RETURNING run_id", (_iso(at), run_id))
            if cur.fetchone() is not None:
                self._event(cur, run_id, "trials_done", "RUNNING", "QUEUED", "the last trial ended by lease expiry: queued for grading", at)
            return None
        token = secrets.token_hex(16)
        cur.execute(
            "UPDATE runs SET lease_token = ?, lease_expires_at = ?, worker = ?, updated_at = ?"  # noqa: S608
            " WHERE run_id = ? AND state = 'RUNNING' AND lease_token IS NULL AND trials_planned > 0"
            f" RETURNING {_RUN_COLUMNS}",
            (token, at + lease_seconds, worker, _iso(at), run_id))
        row: tuple[object, ...] | None = cur.fetchone()
        if row is None:
            return None
        self._event(cur, run_id, "trials_done", None, None, f"worker={worker} grades the run", at)
        self._beat(cur, worker, run_id, at)
        return row

    def complete_trials(self, run_id: str, lease_token: str, results: Mapping[int, str], *,
                        lease_seconds: float, evidence: Mapping[int, bytes] | None = None) -> RunRecord | None:
        at = time.time()
        packed = dict(evidence or {})
        for idx, data in packed.items():
            if idx not in results:
                raise ValidationError(f"evidence[{idx}]", "must belong to a trial recorded in the same call", run_id)
            if not isinstance(data, bytes) or len(data) > MAX_TRIAL_EVIDENCE_BYTES:
                raise ValidationError(f"evidence[{idx}]", f"must be bytes, at most {MAX_TRIAL_EVIDENCE_BYTES}",
                                      type(data).__name__ if not isinstance(data, bytes) else len(data))

        def work(cur: Cursor) -> tuple[object, ...] | None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to complete trials")
            lost = sorted(set(results) - set(held))
            if lost:
                raise CheckFailed(f"run {run_id}: trials {lost} are not held under this lease; refusing to complete them")
            if not results:
                raise ValidationError("results", "must hold at least one trial result", run_id)
            for idx in sorted(results):
                cur.execute(
                    "UPDATE trials SET state = 'DONE', result = ?, evidence = ?, reason = NULL, lease_token = NULL,"
                    " lease_expires_at = NULL, updated_at = ? WHERE run_id = ? AND idx = ? AND lease_token = ?"
                    " AND state = 'RUNNING' RETURNING idx",
                    (results[idx], packed.get(idx), _iso(at), run_id, idx, lease_token))
                if cur.fetchone() is None:
                    raise CheckFailed(f"run {run_id}: trial {idx} changed under its lease; refusing to complete it")
            self._event(cur, run_id, "trials_completed", None, None, f"worker={worker} trials={sorted(results)}", at)
            return self._after_trials_end(cur, run_id, worker, lease_seconds, at)

        row = self._transaction(work)
        # A hand-over changes no state run.json shows (the run stays RUNNING): no rewrite.
        return None if row is None else self._record(row)

    def fail_trials(self, run_id: str, lease_token: str, reason: str, *, lease_seconds: float) -> RunRecord | None:
        at = time.time()
        reason = _one_line(reason, 2000)

        def work(cur: Cursor) -> tuple[object, ...] | None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to fail trials")
            cur.execute(
                "UPDATE trials SET state = CASE WHEN attempts >= max_attempts THEN 'DONE' ELSE 'QUEUED' END,"
                " reason = ?, result = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ?"
                " WHERE run_id = ? AND lease_token = ? AND state = 'RUNNING'",
                (reason, _iso(at), run_id, lease_token))
            self._event(cur, run_id, "trials_failed", None, None, f"worker={worker} trials={held}: {reason[:300]}", at)
            return self._after_trials_end(cur, run_id, worker, lease_seconds, at)

        row = self._transaction(work)
        if row is None:
            return None
        self._write_status(run_id, row)
        return self._record(row)

    def release_trials(self, run_id: str, lease_token: str, reason: str) -> None:
        at = time.time()

        def work(cur: Cursor) -> None:
            self._lock_run(cur, run_id)
            held, worker = self._held_trials(cur, run_id, lease_token, "to release trials")
            cur.execute(
                "UPDATE trials SET state = 'QUEUED', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,"
                " lease_token = NULL, lease_expires_at = NULL, worker = NULL, updated_at = ?"
                " WHERE run_id = ? AND lease_token = ? AND state = 'RUNNING'",
                (_iso(at), run_id, lease_token))
            self._event(cur, run_id, "trials_released", None, None, f"worker={worker} trials={held}: {reason[:300]}", at)

        self._transaction(work)

    def trials(self, run_id: str) -> list[TrialRow]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT run_id, idx, task, trial_name, state, attempts, max_attempts, worker, reason, result"
                        " FROM trials WHERE run_id = ? ORDER BY idx", (run_id,))
            return cur.fetchall()

        return [TrialRow(run_id=str(r), idx=int(i), task=str(t), trial_name=str(n), state=str(st),  # type: ignore[arg-type]
                         attempts=int(a), max_attempts=int(m), worker=None if w is None else str(w),
                         reason=None if why is None else str(why), result=None if res is None else str(res))
                for r, i, t, n, st, a, m, w, why, res in self._read(work)]

    def trial_evidence(self, run_id: str, idx: int) -> bytes | None:
        def work(cur: Cursor) -> Any:
            cur.execute("SELECT evidence FROM trials WHERE run_id = ? AND idx = ?", (run_id, int(idx)))
            return cur.fetchone()

        row = self._read(work)
        if row is None:
            raise ValidationError("idx", f"run {run_id} has no trial {idx}", idx)
        return None if row[0] is None else bytes(row[0])

    def held_batches(self, run_id: str) -> set[str]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT DISTINCT lease_token FROM trials WHERE run_id = ? AND state = 'RUNNING'", (run_id,))
            return cur.fetchall()

        return {batch_label(str(r[0])) for r in self._read(work) if r[0] is not None}

    def _requeue_expired_trials(self, at: float) -> list[str]:
        def expired(cur: Cursor) -> list[str]:
            cur.execute("SELECT DISTINCT run_id FROM trials WHERE state = 'RUNNING' AND lease_expires_at < ?", (at,))
            return sorted(str(r[0]) for r in cur.fetchall())

        changed: list[str] = []
        for run_id in self._read(expired):
            def work(cur: Cursor, run_id: str = run_id) -> bool:
                self._lock_run(cur, run_id)
                cur.execute(
                    "UPDATE trials SET state = CASE WHEN attempts >= max_attempts THEN 'DONE' ELSE 'QUEUED' END,"
                    " reason = CASE WHEN attempts >= max_attempts THEN 'lease expired on the final attempt' ELSE 'lease expired' END,"
                    " lease_token = NULL, lease_expires_at = NULL, updated_at = ?"
                    " WHERE run_id = ? AND state = 'RUNNING' AND lease_expires_at < ? RETURNING idx",
                    (_iso(at), run_id, at))
                ended = cur.fetchall()
                if not ended:
                    return False
                self._event(cur, run_id, "trials_lease_expired", None, None, f"{len(ended)} trials", at)
                self._after_trials_end(cur, run_id, None, 0.0, at)
                return True

            if self._transaction(work):
                changed.append(run_id)
        return changed

    def get_run(self, run_id: str) -> RunRecord:
        row = self._read(lambda cur: self._row(cur, run_id))
        if row is None:
            raise ValidationError("run_id", "no such run", run_id)
        return self._record(row)

    def list_runs(self) -> list[RunRecord]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created_at, run_id")  # noqa: S608
            return cur.fetchall()

        return [self._record(row) for row in self._read(work)]

    def events(self, run_id: str) -> list[Event]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT id, run_id, at, event, from_state, to_state, detail FROM events WHERE run_id = ? ORDER BY id",
                        (run_id,))
            return cur.fetchall()

        return [Event(*row) for row in self._read(work)]

    def stats(self, now: datetime | None = None) -> QueueStats:
        at = _epoch(now)

        def work(cur: Cursor) -> tuple[dict[str, int], dict[str, int], int, int, int, list[Any]]:
            cur.execute("SELECT state, COUNT(*) FROM runs GROUP BY state")
            by_state = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute("SELECT COUNT(*) FROM runs WHERE state = 'QUEUED' AND phase = 'finalize'")
            finalize = int(cur.fetchone()[0])
            cur.execute("SELECT COUNT(*) FROM runs WHERE state IN ('CLAIMED','RUNNING') AND lease_expires_at < ?", (at,))
            expired = int(cur.fetchone()[0])
            cur.execute("SELECT COUNT(*) FROM publications WHERE state = 'PENDING'")
            outbox = int(cur.fetchone()[0])
            cur.execute("SELECT worker, last_seen, run_id FROM workers ORDER BY worker")
            workers = cur.fetchall()
            cur.execute("SELECT state, COUNT(*) FROM trials GROUP BY state")
            trials = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING' AND lease_expires_at < ?", (at,))
            expired += int(cur.fetchone()[0])
            return by_state, trials, finalize, expired, outbox, workers

        by_state, trials, finalize, expired, outbox, workers = self._read(work)
        return QueueStats(
            backend=self.backend, location=self.location, schema_version=self.schema_version(),
            by_state=by_state, depth=by_state.get("QUEUED", 0), finalize_pending=finalize,
            in_flight=by_state.get("CLAIMED", 0) + by_state.get("RUNNING", 0), expired_leases=expired,
            outbox_pending=outbox, trials_queued=trials.get("QUEUED", 0), trials_in_flight=trials.get("RUNNING", 0),
            workers=tuple(WorkerBeat(worker=str(w), last_seen=datetime.fromtimestamp(float(s), UTC),
                                     run_id=None if r is None else str(r)) for w, s, r in workers),
        )

    # --- publication outbox ------------------------------------------------------

    @staticmethod
    def _publication(row: Sequence[object]) -> Publication:
        pub_id, request, state, attempts, next_at, last_error, result = row
        return Publication(
            id=int(str(pub_id)),
            request=PublicationRequest.model_validate_json(str(request)),
            attempts=int(str(attempts)),
            next_attempt_at=datetime.fromtimestamp(float(str(next_at)), UTC),
            last_error=None if last_error is None else str(last_error),
            state=str(state),  # type: ignore[arg-type]
            result=None if result is None else json.loads(str(result)),
        )

    def pending_publications(self, limit: int = 10, now: datetime | None = None) -> list[Publication]:
        at = _epoch(now)

        def work(cur: Cursor) -> list[Any]:
            cur.execute(
                f"SELECT {_PUB_COLUMNS} FROM publications"  # noqa: S608
                " WHERE state = 'PENDING' AND next_attempt_at <= ? AND (lease_expires_at IS NULL OR lease_expires_at < ?)"
                " ORDER BY next_attempt_at, id LIMIT ?",
                (at, at, int(limit)),
            )
            return cur.fetchall()

        return [self._publication(r) for r in self._read(work)]

    def get_publication(self, pub_id: int) -> Publication:
        def work(cur: Cursor) -> Any:
            cur.execute(f"SELECT {_PUB_COLUMNS} FROM publications WHERE id = ?", (pub_id,))  # noqa: S608
            return cur.fetchone()

        row = self._read(work)
        if row is None:
            raise ValidationError("pub_id", "no such publication", pub_id)
        return self._publication(row)

    def list_publications(self, run_id: str | None = None) -> list[Publication]:
        def work(cur: Cursor) -> list[Any]:
            if run_id is None:
                cur.execute(f"SELECT {_PUB_COLUMNS} FROM publications ORDER BY id")  # noqa: S608
            else:
                cur.execute(f"SELECT {_PUB_COLUMNS} FROM publications WHERE run_id = ? ORDER BY id", (run_id,))  # noqa: S608
            return cur.fetchall()

        return [self._publication(r) for r in self._read(work)]

    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool:
        now = time.time()

        def work(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE publications SET lease_expires_at = ?, attempts = attempts + 1, updated_at = ?"
                " WHERE id = ? AND state = 'PENDING' AND next_attempt_at <= ?"
                " AND (lease_expires_at IS NULL OR lease_expires_at < ?) RETURNING run_id",
                (now + lease_seconds, _iso(now), pub_id, now, now),
            )
            won = cur.fetchone()
            if won is None:
                return False
            self._event(cur, str(won[0]), "publication_claimed", None, None, f"publication={pub_id}", now)
            return True

        return self._transaction(work)

    def mark_published(self, pub_id: int, result: Mapping[str, object]) -> None:
        now = time.time()
        encoded = json.dumps(dict(result), sort_keys=True, default=str)

        def work(cur: Cursor) -> None:
            cur.execute(
                "UPDATE publications SET state = 'DELIVERED', result = ?, lease_expires_at = NULL, last_error = NULL,"
                " updated_at = ? WHERE id = ? AND state = 'PENDING' RETURNING run_id",
                (encoded, _iso(now), pub_id),
            )
            delivered = cur.fetchone()
            # A second deliverer (its lease expired meanwhile) finds the row delivered: no second "published".
            if delivered is not None:
                self._event(cur, str(delivered[0]), "published", None, None, f"publication={pub_id}", now)
            else:
                self._publication_run(cur, pub_id)  # no such publication: refused

        self._transaction(work)

    def record_publication_failure(self, pub_id: int, error: str, retry_at: datetime) -> None:
        now = time.time()

        def work(cur: Cursor) -> None:
            run_id = self._publication_run(cur, pub_id)
            cur.execute(
                "UPDATE publications SET last_error = ?, next_attempt_at = ?, lease_expires_at = NULL, updated_at = ?"
                " WHERE id = ? AND state = 'PENDING'",
                (error[:4000], _epoch(retry_at), _iso(now), pub_id),
            )
            self._event(cur, run_id, "publication_failed", None, None, f"publication={pub_id}: {error[:200]}", now)

        self._transaction(work)

    @staticmethod
    def _publication_run(cur: Cursor, pub_id: int) -> str:
        cur.execute("SELECT run_id FROM publications WHERE id = ?", (pub_id,))
        row = cur.fetchone()
        if row is None:
            raise ValidationError("pub_id", "no such publication", pub_id)
        return str(row[0])


# --- SQLite ----------------------------------------------------------------------------

def _fs_state(db: Path) -> str | None:
    """'read-only' or 'full' when the file system holding ``db`` is so (SQLite often reports only an I/O error)."""
    for where in (db, db.parent):
        try:
            st = os.statvfs(where)
        except OSError:
            continue
        if st.f_flag & os.ST_RDONLY:
            return "read-only"
        if st.f_bavail * st.f_frsize < 64 * 1024:
            return "full"
        return None
    return None


def _sqlite_cause(exc: sqlite3.Error, busy_seconds: float, db: Path | None = None) -> str:
    """One line naming what is wrong with the database file."""
    text = _one_line(str(exc))
    name = getattr(exc, "sqlite_errorname", "") or ""
    lowered = text.lower()
    fs = _fs_state(db) if db is not None else None
    if fs == "read-only" and not ("not a database" in lowered or "malformed" in lowered):
        return f"read-only: it is on a read-only file system ({text})"
    if fs == "full" and ("full" in lowered or "i/o" in lowered or name.startswith(("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN"))):
        return f"full: no space left on the file system that holds it ({text})"
    if "locked" in lowered or "busy" in lowered or name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return (f"locked: another process holds a write transaction on it longer than the busy timeout "
                f"({busy_seconds:g} s; {BUSY_TIMEOUT_ENV}) ({text})")
    if "not a database" in lowered or "malformed" in lowered or name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return f"corrupt: not a readable SQLite queue database ({text})"
    if "full" in lowered or name.startswith("SQLITE_FULL"):
        return f"full: no space left on the file system that holds it ({text})"
    if "readonly" in lowered or "read-only" in lowered or name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        return f"read-only: the file or its directory cannot be written ({text})"
    if name.startswith("SQLITE_IOERR") or "i/o" in lowered:
        return f"I/O error: the file system refused a read or write ({text})"
    return text


def _busy_seconds(default: float) -> float:
    raw = os.environ.get(BUSY_TIMEOUT_ENV)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError(BUSY_TIMEOUT_ENV, "must be a number of seconds", raw) from None
    if not 0 <= value <= 3600:
        raise ValidationError(BUSY_TIMEOUT_ENV, "must be between 0 and 3600 seconds", raw)
    return value


class SqliteQueue(SqlQueue):
    """SQLite backend; safe across threads (one locked connection) and processes (WAL + BEGIN IMMEDIATE).

    A new (empty) file is created at the current schema version; an existing one that is behind
    is refused until ``migrate()`` (``benchseal infra migrate``). Every SQLite failure becomes an
    ``InfrastructureError`` naming the file and the cause (corrupt, locked, full, read-only).
    """

    backend = "sqlite"

    def __init__(self, db: Path | None = None, *, runs_dir: Path | None = None, busy_timeout_ms: int = 30000,
                 check_schema: bool = True, create: bool = True) -> None:
        self.db = (db or default_db_path()).resolve()
        self.location = str(self.db)
        self._busy = _busy_seconds(busy_timeout_ms / 1000)
        if create:
            try:
                self.db.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InfrastructureError(f"queue database {self.db}: cannot create its directory: {exc.strerror}") from exc
        elif not self.db.is_file():
            # A reader never creates a queue: an empty one made from a mistyped path would report "depth 0".
            raise CheckFailed(f"queue database {self.db} does not exist (nothing accepted on this host yet, "
                              "or the path names another file)")
        self.runs_dir = (runs_dir or self.db.parent / "runs").resolve()
        self._lock = threading.RLock()
        try:
            # mode=rw for a reader: the file must already exist (no creation between the check and here).
            target = self.db if create else f"file:{quote(str(self.db))}?mode=rw"
            self._conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False, timeout=self._busy,
                                         uri=not create)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            self._open(check_schema, create)
        except BaseException:
            self._conn.close()
            raise

    def _error(self, exc: sqlite3.Error) -> InfrastructureError:
        return InfrastructureError(f"queue database {self.db}: {_sqlite_cause(exc, self._busy, self.db)}")

    def _open(self, check_schema: bool, create: bool) -> None:
        deadline = time.monotonic() + self._busy
        while True:
            try:
                self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy * 1000)}")
                # Read first: a corrupt or foreign file is refused before anything is written to it.
                version = self._current_version()
                if version == 0 and not create:
                    raise CheckFailed(f"queue database {self.db} is not a benchseal queue (no schema); "
                                      "a reader does not create one")
                if version == 0:
                    # A new, empty file: create it at the current version (BEGIN IMMEDIATE: one creator wins).
                    self._conn.execute("PRAGMA journal_mode = WAL")
                    self._apply_migrations(new_only=True)
                    version = self._current_version()
                if check_schema:
                    _check_version(self.location, version)  # before WAL: a refused file is left byte-identical
                if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute("PRAGMA synchronous = NORMAL")
                self._conn.execute("PRAGMA foreign_keys = ON")
                break
            except sqlite3.OperationalError as exc:
                # Switching to WAL takes an exclusive lock that busy_timeout does not always
                # cover when several processes open a new file at once: retry until the deadline.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise self._error(exc) from exc
                time.sleep(0.05)
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def _current_version(self) -> int:
        tables = {str(r[0]) for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
        if "schema_migrations" in tables:
            row = self._conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
            return int(row[0] or 0)
        if "runs" in tables:
            return 1  # written before versions were recorded
        if tables:
            raise sqlite3.DatabaseError("file is not a database: it holds other tables and no queue schema")
        return 0

    def _apply_migrations(self, *, new_only: bool) -> tuple[int, int]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    before = self._current_version()
                    if new_only and before != 0:
                        cur.execute("ROLLBACK")
                        return before, before
                    if before > SCHEMA_VERSION:
                        cur.execute("ROLLBACK")
                        return before, before
                    cur.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
                    if before == 1:
                        cur.execute("INSERT OR IGNORE INTO schema_migrations (version, applied_at) VALUES (1, ?)", (_iso(time.time()),))
                    for version in range(before + 1, SCHEMA_VERSION + 1):
                        # executescript would COMMIT: run the statements one by one inside this transaction.
                        for statement in _SQLITE_MIGRATIONS[version - 1].split(";"):
                            if statement.strip():
                                cur.execute(statement)
                        cur.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, _iso(time.time())))
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return before, SCHEMA_VERSION
            finally:
                cur.close()

    def migrate(self) -> tuple[int, int]:
        """Apply the pending migrations in one transaction; return (version before, version after)."""
        try:
            before, after = self._apply_migrations(new_only=False)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        _check_version(self.location, after)
        return before, after

    def schema_version(self) -> int:
        with self._lock:
            try:
                return self._current_version()
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteQueue:
        return self

    # --- plumbing ---------------------------------------------------------------

    def _transaction(self, work: Callable[[Cursor], T]) -> T:
        with self._lock:
            try:
                cur = self._conn.cursor()
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            try:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    result = work(cur)
                except BaseException:
                    # SQLite may already have rolled back (e.g. on a full disk): keep the original error.
                    if self._conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._conn.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise self._error(exc) from exc
            finally:
                cur.close()

    def _read(self, work: Callable[[Cursor], T]) -> T:
        with self._lock:
            try:
                cur = self._conn.cursor()
                try:
                    return work(cur)
                finally:
                    cur.close()
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        """A raw write transaction (tests and tools)."""
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()


def _check_version(location: str, version: int) -> None:
    if version < SCHEMA_VERSION:
        raise CheckFailed(f"queue database {location} is at schema version {version}, this benchseal needs "
                          f"{SCHEMA_VERSION}: run `benchseal infra migrate`")
    if version > SCHEMA_VERSION:
        raise CheckFailed(f"queue database {location} is at schema version {version}, newer than this benchseal "
                          f"knows ({SCHEMA_VERSION}): upgrade benchseal")


# --- choosing the backend ------------------------------------------------------------------

def redact_url(url: str) -> str:
    """A connection URL without its password (and without query parameters, which may carry one)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        user = f"{parts.username}@" if parts.username else ""
    except ValueError:
        return f"{url.partition(':')[0]}://..."
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def _read_url_file(path: Path, field: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(field, f"cannot read the queue URL file: {exc.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise ValidationError(field, "the queue URL file must be UTF-8 text", str(path)) from None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise ValidationError(field, "the queue URL file must hold exactly one URL line", str(path))
    return lines[0]


def state_url_file() -> Path:
    """``$BENCHSEAL_HOME/infra/queue-url``: every process sharing the state dir (the sudo accept wrapper,
    the worker and publisher units) selects the same queue from it, with no environment to plumb."""
    return home() / "infra" / "queue-url"


def queue_url(url_file: Path | None = None, *, use_state_file: bool = True) -> tuple[str, str] | None:
    """The configured PostgreSQL URL and where it came from, or None for SQLite."""
    sources: list[tuple[str, str]] = []
    if url_file is not None:
        sources.append((_read_url_file(url_file, "--queue-url-file"), "--queue-url-file"))
    env_file = os.environ.get(QUEUE_URL_FILE_ENV)
    if env_file:
        sources.append((_read_url_file(Path(env_file), QUEUE_URL_FILE_ENV), QUEUE_URL_FILE_ENV))
    env_url = os.environ.get(QUEUE_URL_ENV)
    if env_url:
        sources.append((env_url.strip(), QUEUE_URL_ENV))
    if not sources and use_state_file and state_url_file().is_file():
        sources.append((_read_url_file(state_url_file(), str(state_url_file())), str(state_url_file())))
    if not sources:
        return None
    if len(sources) > 1:
        raise UsageError(f"the queue URL is given twice ({' and '.join(s for _, s in sources)}): give exactly one")
    url, source = sources[0]
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValidationError(source, "must be a postgresql:// URL", redact_url(url))
    return url, source


def open_queue(db: Path | None = None, *, url_file: Path | None = None, runs_dir: Path | None = None,
               check_schema: bool = True, create: bool = True) -> SqlQueue:
    """The configured queue: PostgreSQL when a queue URL is configured, else the SQLite file ``db``.

    ``create=False`` (the read-only verbs): a SQLite file that does not exist, or has no schema, is
    refused instead of created.

    The URL comes from ``url_file``, ``BENCHSEAL_QUEUE_URL_FILE``, ``BENCHSEAL_QUEUE_URL`` or, when
    none of them is set and no ``db`` is given, ``$BENCHSEAL_HOME/infra/queue-url``. A URL and an
    explicit ``db`` together are refused (no silent choice between two queues).
    """
    found = queue_url(url_file, use_state_file=db is None)
    if found is None:
        return SqliteQueue(db, runs_dir=runs_dir, check_schema=check_schema, create=create)
    if db is not None:
        raise UsageError(f"--db names a SQLite queue but {found[1]} names a PostgreSQL one: give exactly one")
    # lazy: psycopg costs 120-150 ms at import (python -X importtime, 2026-12-03), and queue_pg imports this module
    from pipeline.infra.queue.postgres import PostgresQueue

    return PostgresQueue(found[0], runs_dir=runs_dir, check_schema=check_schema)
