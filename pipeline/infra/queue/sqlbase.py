"""``SqlBase``: the plumbing of ``SqlQueue`` (events, run rows, run.json, guarded transitions, worker
beats), its reads (runs, events, stats) and the publication outbox, in portable SQL (``?``
placeholders). The transitions of runs and trials are ``pipeline.infra.queue.rules.SqlQueue``'s."""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.core.contracts import Grading, PublicationRequest, RunState
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import canonical_json
from pipeline.infra.queue.helpers import Cursor, T, epoch, iso, log
from pipeline.infra.queue.interface import Queue
from pipeline.infra.queue.records import (
    ACTIVE_STATES,
    Event,
    Publication,
    PublicationState,
    QueueStats,
    RunRecord,
    TrialState,
    WorkerBeat,
    parse_payload,
)
from pipeline.infra.queue.schema import PUB_COLUMNS, RUN_COLUMNS, sql_list, sql_text

# The states as the statements below write them, generated from their enums (never spelled out here);
# the S608 noqa on those statements: what they interpolate is these constants, never input.
_QUEUED, _ACTIVE = sql_text(RunState.QUEUED), sql_list(ACTIVE_STATES)
_TRIAL_RUNNING = sql_text(TrialState.RUNNING)
_PENDING, _DELIVERED = sql_text(PublicationState.PENDING), sql_text(PublicationState.DELIVERED)
_PROBLEM_CHARS = 2000  # a worker's problem is one line for an operator, not a log


class SqlBase(Queue):
    """The queue's plumbing, reads and outbox over a DB-API backend; subclasses give transactions and the
    claim lock clause."""

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
            (run_id, iso(now), event, from_state, to_state, detail),
        )

    @staticmethod
    def _row(cur: Cursor, run_id: str) -> tuple[object, ...] | None:
        cur.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))  # noqa: S608
        row: tuple[object, ...] | None = cur.fetchone()
        return row

    @staticmethod
    def _record(row: Sequence[object]) -> RunRecord:
        (run_id, correlation_id, payload, state, attempts, max_attempts, token, expires, worker, reason, grading,
         created, updated, phase, finalize_attempts, trials_planned) = row
        return RunRecord(
            run_id=str(run_id),
            correlation_id=str(correlation_id),
            payload=parse_payload(str(payload)),
            state=RunState(str(state)),
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
        status = record.status()
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
                f" AND state IN ({placeholders}) RETURNING {RUN_COLUMNS}",
                (to_state, iso(now), *params, run_id, lease_token, *from_states),
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
            " ON CONFLICT (worker) DO UPDATE SET last_seen = excluded.last_seen, run_id = excluded.run_id,"
            " problem = NULL",  # a claim attempt: whatever stopped its claims before is over
            (worker, at, run_id),
        )

    def worker_problem(self, worker: str, problem: str, now: datetime | None = None) -> None:
        at = epoch(now)

        def work(cur: Cursor) -> None:
            cur.execute(
                "INSERT INTO workers (worker, last_seen, run_id, problem) VALUES (?, ?, NULL, ?)"
                " ON CONFLICT (worker) DO UPDATE SET last_seen = excluded.last_seen, run_id = NULL,"
                " problem = excluded.problem",
                (worker, at, problem[:_PROBLEM_CHARS]))

        self._transaction(work)

    def get_run(self, run_id: str) -> RunRecord:
        row = self._read(lambda cur: self._row(cur, run_id))
        if row is None:
            raise ValidationError("run_id", "no such run", run_id)
        return self._record(row)

    def list_runs(self) -> list[RunRecord]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at, run_id")  # noqa: S608
            return cur.fetchall()

        return [self._record(row) for row in self._read(work)]

    def events(self, run_id: str) -> list[Event]:
        def work(cur: Cursor) -> list[Any]:
            cur.execute("SELECT id, run_id, at, event, from_state, to_state, detail FROM events WHERE run_id = ? ORDER BY id",
                        (run_id,))
            return cur.fetchall()

        return [Event(*row) for row in self._read(work)]

    def stats(self, now: datetime | None = None) -> QueueStats:
        at = epoch(now)

        def work(cur: Cursor) -> tuple[dict[str, int], dict[str, int], int, int, int, list[Any]]:
            cur.execute("SELECT state, COUNT(*) FROM runs GROUP BY state")
            by_state = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute(f"SELECT COUNT(*) FROM runs WHERE state = {_QUEUED} AND phase = 'finalize'")  # noqa: S608
            finalize = int(cur.fetchone()[0])
            cur.execute(f"SELECT COUNT(*) FROM runs WHERE state IN {_ACTIVE} AND lease_expires_at < ?", (at,))  # noqa: S608
            expired = int(cur.fetchone()[0])
            cur.execute(f"SELECT COUNT(*) FROM publications WHERE state = {_PENDING}")  # noqa: S608
            outbox = int(cur.fetchone()[0])
            cur.execute("SELECT worker, last_seen, run_id, problem FROM workers ORDER BY worker")
            workers = cur.fetchall()
            cur.execute("SELECT state, COUNT(*) FROM trials GROUP BY state")
            trials = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute(f"SELECT COUNT(*) FROM trials WHERE state = {_TRIAL_RUNNING} AND lease_expires_at < ?", (at,))  # noqa: S608
            expired += int(cur.fetchone()[0])
            return by_state, trials, finalize, expired, outbox, workers

        by_state, trials, finalize, expired, outbox, workers = self._read(work)
        return QueueStats(
            backend=self.backend, location=self.location, schema_version=self.schema_version(),
            by_state=by_state, depth=by_state.get(RunState.QUEUED, 0), finalize_pending=finalize,
            in_flight=sum(by_state.get(state, 0) for state in ACTIVE_STATES), expired_leases=expired,
            outbox_pending=outbox, trials_queued=trials.get(TrialState.QUEUED, 0), trials_in_flight=trials.get(TrialState.RUNNING, 0),
            workers=tuple(WorkerBeat(worker=str(w), last_seen=datetime.fromtimestamp(float(s), UTC),
                                     run_id=None if r is None else str(r), problem=None if p is None else str(p))
                          for w, s, r, p in workers),
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
            state=PublicationState(str(state)),
            result=None if result is None else json.loads(str(result)),
        )

    def pending_publications(self, limit: int = 10, now: datetime | None = None) -> list[Publication]:
        at = epoch(now)

        def work(cur: Cursor) -> list[Any]:
            cur.execute(
                f"SELECT {PUB_COLUMNS} FROM publications"  # noqa: S608
                f" WHERE state = {_PENDING} AND next_attempt_at <= ? AND (lease_expires_at IS NULL OR lease_expires_at < ?)"
                " ORDER BY next_attempt_at, id LIMIT ?",
                (at, at, int(limit)),
            )
            return cur.fetchall()

        return [self._publication(r) for r in self._read(work)]

    def get_publication(self, pub_id: int) -> Publication:
        def work(cur: Cursor) -> Any:
            cur.execute(f"SELECT {PUB_COLUMNS} FROM publications WHERE id = ?", (pub_id,))  # noqa: S608
            return cur.fetchone()

        row = self._read(work)
        if row is None:
            raise ValidationError("pub_id", "no such publication", pub_id)
        return self._publication(row)

    def list_publications(self, run_id: str | None = None) -> list[Publication]:
        def work(cur: Cursor) -> list[Any]:
            if run_id is None:
                cur.execute(f"SELECT {PUB_COLUMNS} FROM publications ORDER BY id")  # noqa: S608
            else:
                cur.execute(f"SELECT {PUB_COLUMNS} FROM publications WHERE run_id = ? ORDER BY id", (run_id,))  # noqa: S608
            return cur.fetchall()

        return [self._publication(r) for r in self._read(work)]

    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool:
        now = time.time()

        def work(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE publications SET lease_expires_at = ?, attempts = attempts + 1, updated_at = ?"  # noqa: S608
                f" WHERE id = ? AND state = {_PENDING} AND next_attempt_at <= ?"
                " AND (lease_expires_at IS NULL OR lease_expires_at < ?) RETURNING run_id",
                (now + lease_seconds, iso(now), pub_id, now, now),
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
                f"UPDATE publications SET state = {_DELIVERED}, result = ?, lease_expires_at = NULL, last_error = NULL,"  # noqa: S608
                f" updated_at = ? WHERE id = ? AND state = {_PENDING} RETURNING run_id",
                (encoded, iso(now), pub_id),
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
                "UPDATE publications SET last_error = ?, next_attempt_at = ?, lease_expires_at = NULL, updated_at = ?"  # noqa: S608
                f" WHERE id = ? AND state = {_PENDING}",
                (error[:4000], epoch(retry_at), iso(now), pub_id),
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

