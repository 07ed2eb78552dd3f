"""The PostgreSQL backend of the run queue (workers on several hosts, one database).

The rules are ``pipeline.infra.queue.rules.SqlQueue``'s and the schema is
``pipeline.infra.queue.schema``'s; this module gives them a connection,
transactions and ``FOR UPDATE SKIP LOCKED`` claims (a claimer skips the rows
another claimer has locked instead of waiting for them).

Connection failures (a restarted database, a dropped network): a transaction
that failed BEFORE its COMMIT was sent is retried on a new connection (nothing
of it can have been committed); a failure during COMMIT is reported as an
``InfrastructureError`` (its outcome is unknown, and every caller is safe
against either: transitions are lease-guarded, enqueue is idempotent).

The URL comes from ``BENCHSEAL_QUEUE_URL`` / a URL file and never appears in an
error message with its password (``redact_url``).

``read_only`` (the API, which connects as a role granted SELECT only: ``pipeline.infra.queue.reader``):
every session has ``default_transaction_read_only`` on, and every write is refused before it is sent.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from pipeline.core.errors import CheckFailed, InfrastructureError
from pipeline.core.paths import state_dir
from pipeline.infra.queue.helpers import Cursor, T, iso, one_line, redact_url
from pipeline.infra.queue.rules import SqlQueue
from pipeline.infra.queue.schema import POSTGRESQL, SCHEMA_VERSION, VERSIONS_TABLE, check_version, migration

# Serialises concurrent `benchseal infra migrate` runs (an arbitrary, fixed advisory lock key).
_MIGRATE_LOCK = 0x62656E6368


class _PgCursor:
    """A psycopg cursor that takes the portable ``?`` placeholders."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _PgCursor:
        # The queue's SQL has no literal '?' or '%': a plain replacement is exact.
        self._cur.execute(sql.replace("?", "%s"), tuple(params))
        return self

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


def _is_connection_error(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or (conn is not None and conn.closed)


class PostgresQueue(SqlQueue):
    """PostgreSQL backend (psycopg 3): one connection per queue object, shared by its threads under a lock."""

    backend = "postgresql"
    spans_hosts = True
    _claim_lock = " FOR UPDATE SKIP LOCKED"
    _row_lock = " FOR UPDATE"
    _relaxed_commit = "SET LOCAL synchronous_commit = off"

    def __init__(self, url: str, *, runs_dir: Path | None = None, reconnect_seconds: float = 30.0,
                 connect_timeout: int = 10, check_schema: bool = True, read_only: bool = False) -> None:
        self._url = url
        self.read_only = read_only
        self.location = redact_url(url)
        self.runs_dir = (runs_dir or state_dir("infra") / "runs").resolve()
        self._reconnect_seconds = reconnect_seconds
        self._connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._connected_once = False
        self.reconnects = 0  # connections replaced after a failure (observability, tests)
        if check_schema:
            check_version(self.location, self.schema_version())

    def _error(self, what: str, exc: BaseException) -> InfrastructureError:
        # psycopg's messages name host and database, never the password.
        return InfrastructureError(f"queue database {self.location}: {what}: {one_line(str(exc))}")

    def _connect(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise InfrastructureError(f"queue database {self.location}: the queue was closed")
        if self._conn is not None and not self._conn.closed:
            return self._conn
        deadline = time.monotonic() + self._reconnect_seconds
        delay = 0.1
        while True:
            try:
                # A reader's sessions refuse writes whatever its role may do (its role may only SELECT too).
                options = "-c default_transaction_read_only=on" if self.read_only else None
                self._conn = psycopg.connect(self._url, autocommit=False, connect_timeout=self._connect_timeout,
                                             application_name="benchseal", options=options)
                if self._connected_once:
                    self.reconnects += 1
                self._connected_once = True
                return self._conn
            except psycopg.OperationalError as exc:
                if time.monotonic() + delay > deadline:
                    raise self._error("cannot connect", exc) from exc
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail; it is discarded anyway
                self._conn.close()
        self._conn = None

    def _run(self, work: Callable[[Cursor], T], *, write: bool) -> T:
        deadline = time.monotonic() + self._reconnect_seconds
        with self._lock:
            while True:
                conn = self._connect()
                committing = False
                try:
                    if not write:
                        # Reads run in autocommit: no BEGIN/COMMIT round trips (each statement its own snapshot).
                        conn.autocommit = True
                        try:
                            with conn.cursor() as raw:
                                return work(_PgCursor(raw))
                        finally:
                            if not conn.closed:
                                conn.autocommit = False
                    with conn.cursor() as raw:
                        result = work(_PgCursor(raw))
                    committing = True
                    conn.commit()
                    return result
                except (psycopg.Error, OSError) as exc:
                    broken = _is_connection_error(exc, conn)
                    if broken:
                        self._drop()
                    else:
                        conn.rollback()
                    if broken and not (committing and write) and time.monotonic() < deadline:
                        time.sleep(0.2)
                        continue  # nothing was committed: run the whole transaction again
                    if committing and write and broken:
                        raise self._error("connection lost during COMMIT (outcome unknown; safe to retry)", exc) from exc
                    raise self._error("database error", exc) from exc
                except BaseException:
                    if conn.closed:
                        self._drop()
                    else:
                        conn.rollback()
                    raise

    def _transaction(self, work: Callable[[Cursor], T]) -> T:
        if self.read_only:
            raise InfrastructureError(f"queue database {self.location}: opened read-only: refusing to write")
        return self._run(work, write=True)

    def _read(self, work: Callable[[Cursor], T]) -> T:
        return self._run(work, write=False)

    def schema_version(self) -> int:
        def work(cur: Cursor) -> int:
            cur.execute("SELECT to_regclass('schema_migrations') IS NOT NULL")
            if not cur.fetchone()[0]:
                return 0
            cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            return int(cur.fetchone()[0])

        return self._read(work)

    def migrate(self) -> tuple[int, int]:
        """Apply the pending migrations in one transaction (advisory-locked); return (before, after)."""

        def work(cur: Cursor) -> tuple[int, int]:
            cur.execute(f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK})")
            cur.execute(VERSIONS_TABLE)
            cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            before = int(cur.fetchone()[0])
            if before > SCHEMA_VERSION:
                raise CheckFailed(f"queue database {self.location} is at schema version {before}, newer than this "
                                  f"benchseal knows ({SCHEMA_VERSION}): upgrade benchseal")
            for version in range(before + 1, SCHEMA_VERSION + 1):
                for statement in migration(POSTGRESQL, version):
                    cur.execute(statement)
                cur.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, iso(time.time())))
            return before, SCHEMA_VERSION

        return self._transaction(work)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    def __enter__(self) -> PostgresQueue:
        return self
