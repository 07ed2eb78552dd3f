"""The run queue and the durable publication outbox.

``Queue`` is the interface (a PostgreSQL backend for multi-host workers would
implement it with ``SELECT ... FOR UPDATE SKIP LOCKED``); ``SqliteQueue`` is the
single-host backend: WAL mode, every write in ``BEGIN IMMEDIATE``, guarded state
transitions (``UPDATE ... WHERE state=... AND lease_token=...`` + rowcount), so
two claimers can never both win.

States: QUEUED -> CLAIMED -> RUNNING -> SUCCEEDED | FAILED | INFRA_ERROR.
A claim holds a lease (random token + expiry) renewed by heartbeats; an expired
lease goes back to QUEUED, or to INFRA_ERROR once the attempts are used up.
Every transition appends to ``events`` (the audit trail), and ``run.json``
(pipeline.contracts.RunStatus) in the run directory is rewritten atomically
after each committed change.
"""

from __future__ import annotations

import abc
import hashlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pipeline.contracts import DispatchPayload, Grading, PublicationRequest, RunState, RunStatus
from pipeline.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.fsutil import atomic_write_json
from pipeline.paths import state_dir

TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "INFRA_ERROR"})
ACTIVE_STATES: frozenset[str] = frozenset({"CLAIMED", "RUNNING"})
PublicationState = Literal["PENDING", "DELIVERED"]

_SCHEMA = """
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
"""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _epoch(moment: datetime | None) -> float:
    if moment is None:
        return time.time()
    if moment.tzinfo is None:
        raise ValidationError("now", "datetimes must be timezone-aware (UTC)", moment.isoformat())
    return moment.timestamp()


def run_id_for(correlation_id: str) -> str:
    """The run id of a correlation id: stable, so a redelivery names the same run everywhere."""
    return "run-" + hashlib.sha256(correlation_id.encode("ascii")).hexdigest()[:20]


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

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


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


class Queue(abc.ABC):
    """What the dispatcher, worker and publisher need from a queue backend."""

    @abc.abstractmethod
    def enqueue(self, payload: DispatchPayload, *, max_attempts: int) -> tuple[str, bool]:
        """Insert a run once per correlation id; return (run_id, created)."""

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
    def fail_infra(self, run_id: str, lease_token: str, reason: str, grading: Grading | None = None) -> RunState: ...

    @abc.abstractmethod
    def complete(
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest]
    ) -> None: ...

    @abc.abstractmethod
    def requeue_expired(self, now: datetime | None = None) -> list[str]: ...

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRecord: ...

    @abc.abstractmethod
    def list_runs(self) -> list[RunRecord]: ...

    @abc.abstractmethod
    def events(self, run_id: str) -> list[Event]: ...

    @abc.abstractmethod
    def pending_publications(self, limit: int = 10, now: datetime | None = None) -> list[Publication]: ...

    @abc.abstractmethod
    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool: ...

    @abc.abstractmethod
    def mark_published(self, pub_id: int, result: Mapping[str, object]) -> None: ...

    @abc.abstractmethod
    def record_publication_failure(self, pub_id: int, error: str, retry_at: datetime) -> None: ...


def default_db_path() -> Path:
    return state_dir("infra") / "queue.sqlite3"


class SqliteQueue(Queue):
    """SQLite backend; safe across threads (one locked connection) and processes (WAL + BEGIN IMMEDIATE)."""

    def __init__(self, db: Path | None = None, *, runs_dir: Path | None = None, busy_timeout_ms: int = 30000) -> None:
        self.db = (db or default_db_path()).resolve()
        self.db.parent.mkdir(parents=True, exist_ok=True)
        self.runs_dir = (runs_dir or self.db.parent / "runs").resolve()
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.db, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
                # Switching to WAL takes an exclusive lock that busy_timeout does not
                # always cover when several processes open a new file at once: retry.
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute("PRAGMA synchronous = NORMAL")
                self._conn.execute("PRAGMA foreign_keys = ON")
                self._conn.executescript(_SCHEMA)  # CREATE ... IF NOT EXISTS: idempotent
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    self._conn.close()
                    raise InfrastructureError(f"cannot open queue database {self.db}: {exc}") from exc
                time.sleep(0.05)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    # --- plumbing ---------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
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

    @staticmethod
    def _event(cur: sqlite3.Cursor, run_id: str, event: str, from_state: str | None, to_state: str | None, detail: str | None, now: float) -> None:
        cur.execute(
            "INSERT INTO events (run_id, at, event, from_state, to_state, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, _iso(now), event, from_state, to_state, detail),
        )

    def _row(self, cur: sqlite3.Cursor, run_id: str) -> tuple[object, ...] | None:
        row: tuple[object, ...] | None = cur.execute(
            "SELECT run_id, correlation_id, payload, state, attempts, max_attempts, lease_token, lease_expires_at,"
            " worker, reason, grading, created_at, updated_at FROM runs WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        return row

    @staticmethod
    def _record(row: tuple[object, ...]) -> RunRecord:
        (run_id, correlation_id, payload, state, attempts, max_attempts, token, expires, worker, reason, grading, created, updated) = row
        return RunRecord(
            run_id=str(run_id),
            correlation_id=str(correlation_id),
            payload=DispatchPayload.model_validate_json(str(payload)),
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
        )

    def _write_status(self, run_id: str) -> None:
        record = self.get_run(run_id)
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
        atomic_write_json(self.run_dir(run_id) / "run.json", status.model_dump(mode="json"))

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
        with self._tx() as cur:
            row = self._row(cur, run_id)
            if row is None:
                raise ValidationError("run_id", "no such run", run_id)
            current = str(row[3])
            placeholders = ",".join("?" for _ in from_states)
            cur.execute(
                f"UPDATE runs SET state = ?, updated_at = ?{sets} WHERE run_id = ? AND lease_token = ?"  # noqa: S608
                f" AND state IN ({placeholders})",
                (to_state, _iso(now), *params, run_id, lease_token, *from_states),
            )
            if cur.rowcount != 1:
                raise CheckFailed(f"run {run_id}: lease not held (state {current}); refusing {event}")
            self._event(cur, run_id, event, current, to_state, detail, now)
        self._write_status(run_id)

    # --- runs --------------------------------------------------------------------

    def enqueue(self, payload: DispatchPayload, *, max_attempts: int) -> tuple[str, bool]:
        run_id = run_id_for(payload.correlation_id)
        now = time.time()
        with self._tx() as cur:
            existing = cur.execute("SELECT run_id FROM runs WHERE correlation_id = ?", (payload.correlation_id,)).fetchone()
            if existing is not None:
                self._event(cur, str(existing[0]), "redelivered", None, None, None, now)
                created = False
                run_id = str(existing[0])
            else:
                cur.execute(
                    "INSERT INTO runs (run_id, correlation_id, payload, state, attempts, max_attempts, created_at, updated_at)"
                    " VALUES (?, ?, ?, 'QUEUED', 0, ?, ?, ?)",
                    (run_id, payload.correlation_id, json.dumps(payload.to_json_dict(), sort_keys=True), max_attempts, _iso(now), _iso(now)),
                )
                self._event(cur, run_id, "accepted", None, "QUEUED", None, now)
                created = True
        if created:
            self._write_status(run_id)
        return run_id, created

    def claim(self, worker: str, lease_seconds: float, now: datetime | None = None) -> RunRecord | None:
        at = _epoch(now)
        token = secrets.token_hex(16)
        with self._tx() as cur:
            row = cur.execute("SELECT run_id FROM runs WHERE state = 'QUEUED' ORDER BY created_at, run_id LIMIT 1").fetchone()
            if row is None:
                return None
            run_id = str(row[0])
            cur.execute(
                "UPDATE runs SET state = 'CLAIMED', lease_token = ?, lease_expires_at = ?, worker = ?,"
                " attempts = attempts + 1, updated_at = ? WHERE run_id = ? AND state = 'QUEUED'",
                (token, at + lease_seconds, worker, _iso(at), run_id),
            )
            if cur.rowcount != 1:  # cannot happen under BEGIN IMMEDIATE; the guard is the contract
                return None
            self._event(cur, run_id, "claimed", "QUEUED", "CLAIMED", f"worker={worker}", at)
        self._write_status(run_id)
        return self.get_run(run_id)

    def start(self, run_id: str, lease_token: str) -> None:
        self._transition(run_id, lease_token, from_states=("CLAIMED",), event="started", to_state="RUNNING", detail=None)

    def heartbeat(self, run_id: str, lease_token: str, lease_seconds: float, now: datetime | None = None) -> bool:
        at = _epoch(now)
        with self._tx() as cur:
            cur.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_token = ? AND state IN ('CLAIMED','RUNNING')",
                (at + lease_seconds, run_id, lease_token),
            )
            return cur.rowcount == 1

    def release(self, run_id: str, lease_token: str, reason: str) -> None:
        # A voluntary release (SIGTERM) does not use up an attempt.
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES), event="released", to_state="QUEUED", detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, worker = NULL, attempts = MAX(attempts - 1, 0)",
        )

    def fail_infra(self, run_id: str, lease_token: str, reason: str, grading: Grading | None = None) -> RunState:
        """Record an infrastructure error: requeue, or INFRA_ERROR (terminal) once attempts are used up."""
        record = self.get_run(run_id)
        exhausted = record.attempts >= record.max_attempts
        to_state: RunState = "INFRA_ERROR" if exhausted else "QUEUED"
        stored = grading.model_dump_json() if (grading is not None and exhausted) else None
        self._transition(
            run_id, lease_token, from_states=tuple(ACTIVE_STATES),
            event="infra_error" if exhausted else "requeued", to_state=to_state, detail=reason,
            sets=", lease_token = NULL, lease_expires_at = NULL, reason = ?, grading = COALESCE(?, grading)",
            params=(reason, stored),
        )
        return to_state

    def complete(
        self, run_id: str, lease_token: str, grading: Grading, publications: Sequence[PublicationRequest]
    ) -> None:
        """Terminal state + grading + outbox rows in ONE transaction; refuses unless the lease is held."""
        if grading.run_id != run_id:
            raise ValidationError("grading.run_id", f"must equal the run id {run_id}", grading.run_id)
        for index, request in enumerate(publications):
            if request.run_id != run_id:
                raise ValidationError(f"publications[{index}].run_id", f"must equal the run id {run_id}", request.run_id)
        now = time.time()
        with self._tx() as cur:
            row = self._row(cur, run_id)
            if row is None:
                raise ValidationError("run_id", "no such run", run_id)
            current = str(row[3])
            cur.execute(
                "UPDATE runs SET state = ?, grading = ?, reason = ?, lease_token = NULL, lease_expires_at = NULL,"
                " updated_at = ? WHERE run_id = ? AND lease_token = ? AND state IN ('CLAIMED','RUNNING')",
                (grading.status, grading.model_dump_json(), grading.reason, _iso(now), run_id, lease_token),
            )
            if cur.rowcount != 1:
                raise CheckFailed(f"run {run_id}: lease not held (state {current}); refusing to complete")
            self._event(cur, run_id, "completed", current, grading.status, grading.reason, now)
            for request in publications:
                cur.execute(
                    "INSERT INTO publications (run_id, target, tag, request, state, attempts, next_attempt_at, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, 'PENDING', 0, ?, ?, ?) ON CONFLICT (run_id, target, tag) DO NOTHING",
                    (run_id, request.target, request.tag, request.model_dump_json(), now, _iso(now), _iso(now)),
                )
                self._event(cur, run_id, "publication_queued", None, None, f"{request.target}:{request.tag}", now)
        self._write_status(run_id)

    def requeue_expired(self, now: datetime | None = None) -> list[str]:
        """Requeue runs whose lease expired (a dead worker); INFRA_ERROR once attempts are used up."""
        at = _epoch(now)
        changed: list[str] = []
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT run_id, state, attempts, max_attempts, lease_token FROM runs"
                " WHERE state IN ('CLAIMED','RUNNING') AND lease_expires_at < ?",
                (at,),
            ).fetchall()
            for run_id, state, attempts, max_attempts, token in rows:
                to_state = "INFRA_ERROR" if attempts >= max_attempts else "QUEUED"
                reason = "lease expired" + ("; attempts exhausted" if to_state == "INFRA_ERROR" else "")
                cur.execute(
                    "UPDATE runs SET state = ?, lease_token = NULL, lease_expires_at = NULL, reason = ?, updated_at = ?"
                    " WHERE run_id = ? AND lease_token = ? AND state = ?",
                    (to_state, reason, _iso(at), run_id, token, state),
                )
                if cur.rowcount == 1:
                    self._event(cur, run_id, "lease_expired", state, to_state, reason, at)
                    changed.append(run_id)
        for run_id in changed:
            self._write_status(run_id)
        return changed

    def get_run(self, run_id: str) -> RunRecord:
        with self._lock:
            row = self._row(self._conn.cursor(), run_id)
        if row is None:
            raise ValidationError("run_id", "no such run", run_id)
        return self._record(row)

    def list_runs(self) -> list[RunRecord]:
        with self._lock:
            ids = [str(r[0]) for r in self._conn.execute("SELECT run_id FROM runs ORDER BY created_at, run_id").fetchall()]
        return [self.get_run(i) for i in ids]

    def events(self, run_id: str) -> list[Event]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, run_id, at, event, from_state, to_state, detail FROM events WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
        return [Event(*row) for row in rows]

    # --- publication outbox ------------------------------------------------------

    @staticmethod
    def _publication(row: tuple[object, ...]) -> Publication:
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
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, request, state, attempts, next_attempt_at, last_error, result FROM publications"
                " WHERE state = 'PENDING' AND next_attempt_at <= ? AND (lease_expires_at IS NULL OR lease_expires_at < ?)"
                " ORDER BY next_attempt_at, id LIMIT ?",
                (at, at, int(limit)),
            ).fetchall()
        return [self._publication(r) for r in rows]

    def get_publication(self, pub_id: int) -> Publication:
        with self._lock:
            row = self._conn.execute(
                "SELECT id, request, state, attempts, next_attempt_at, last_error, result FROM publications WHERE id = ?", (pub_id,)
            ).fetchone()
        if row is None:
            raise ValidationError("pub_id", "no such publication", pub_id)
        return self._publication(row)

    def list_publications(self, run_id: str | None = None) -> list[Publication]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, request, state, attempts, next_attempt_at, last_error, result FROM publications"
                " WHERE ? IS NULL OR run_id = ? ORDER BY id",
                (run_id, run_id),
            ).fetchall()
        return [self._publication(r) for r in rows]

    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool:
        now = time.time()
        with self._tx() as cur:
            cur.execute(
                "UPDATE publications SET lease_expires_at = ?, attempts = attempts + 1, updated_at = ?"
                " WHERE id = ? AND state = 'PENDING' AND next_attempt_at <= ?"
                " AND (lease_expires_at IS NULL OR lease_expires_at < ?)",
                (now + lease_seconds, _iso(now), pub_id, now, now),
            )
            won = cur.rowcount == 1
            if won:
                run_id = cur.execute("SELECT run_id FROM publications WHERE id = ?", (pub_id,)).fetchone()[0]
                self._event(cur, str(run_id), "publication_claimed", None, None, f"publication={pub_id}", now)
            return won

    def mark_published(self, pub_id: int, result: Mapping[str, object]) -> None:
        now = time.time()
        encoded = json.dumps(dict(result), sort_keys=True, default=str)
        with self._tx() as cur:
            run_id = self._publication_run(cur, pub_id)
            cur.execute(
                "UPDATE publications SET state = 'DELIVERED', result = ?, lease_expires_at = NULL, last_error = NULL,"
                " updated_at = ? WHERE id = ?",
                (encoded, _iso(now), pub_id),
            )
            self._event(cur, run_id, "published", None, None, f"publication={pub_id}", now)

    def record_publication_failure(self, pub_id: int, error: str, retry_at: datetime) -> None:
        now = time.time()
        with self._tx() as cur:
            run_id = self._publication_run(cur, pub_id)
            cur.execute(
                "UPDATE publications SET last_error = ?, next_attempt_at = ?, lease_expires_at = NULL, updated_at = ?"
                " WHERE id = ? AND state = 'PENDING'",
                (error[:4000], _epoch(retry_at), _iso(now), pub_id),
            )
            self._event(cur, run_id, "publication_failed", None, None, f"publication={pub_id}: {error[:200]}", now)

    @staticmethod
    def _publication_run(cur: sqlite3.Cursor, pub_id: int) -> str:
        row = cur.execute("SELECT run_id FROM publications WHERE id = ?", (pub_id,)).fetchone()
        if row is None:
            raise ValidationError("pub_id", "no such publication", pub_id)
        return str(row[0])
