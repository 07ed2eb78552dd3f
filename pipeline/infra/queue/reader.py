"""The queue as the API reads it: opened read-only, and on PostgreSQL as a role that may only SELECT.

``open_reader`` opens the queue the API serves: the SQLite file ``mode=ro`` (``SqliteQueue(read_only=True)``),
or PostgreSQL with ``default_transaction_read_only`` on, refused outright when the role it connects as
may write any queue table (``writable_tables``): the API never runs with the worker's credentials.

``reader_grants`` are the statements that give a role exactly that: CONNECT on the database, USAGE on
the queue's schema and SELECT on the tables the API reads (``READER_TABLES``), every other privilege
on the queue's tables revoked. ``grant_reader`` runs them (``benchseal api grant-reader``), as a role
that owns the queue's tables (the one ``benchseal infra migrate`` ran as) and may create roles when the
reader does not exist yet. The reader's password or certificate is the operator's to set, never here.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pydantic

from pipeline.core.contracts import Grading, RunState, canonical_repository
from pipeline.core.documents import Comparison, HistoryEntry
from pipeline.core.errors import CheckFailed, NotAQueue, ValidationError, escape_text
from pipeline.infra.queue.helpers import Cursor, T
from pipeline.infra.queue.records import RunRecord, parse_payload
from pipeline.infra.queue.rules import SqlQueue
from pipeline.infra.queue.schema import RUN_COLUMNS, check_version
from pipeline.infra.queue.sqlite import SqliteQueue, default_db_path

if TYPE_CHECKING:
    from pipeline.infra.queue.postgres import PostgresQueue

# What the API reads: the schema version (checked at every open), the runs and the release history.
READER_TABLES = ("schema_migrations", "runs", "releases")
# Every table of the queue's schema (pipeline.infra.queue.schema): a reader holds no other privilege on any.
QUEUE_TABLES = ("schema_migrations", "runs", "events", "publications", "workers", "trials", "releases",
                "release_tags")
ROLE_RULE = "must be a PostgreSQL role name: a lowercase letter or _, then up to 62 of a-z 0-9 _"
_ROLE_RE = re.compile(r"\A[a-z_][a-z0-9_]{0,62}\Z")


def validate_role(role: str, field: str = "ROLE") -> str:
    if not isinstance(role, str) or not _ROLE_RE.match(role) or role.startswith("pg_"):
        raise ValidationError(field, ROLE_RULE + " (not pg_*)", role)
    return role


def _ident(name: str) -> str:
    """A quoted SQL identifier (a database or schema name the server reported)."""
    return '"' + name.replace('"', '""') + '"'


def reader_grants(role: str, database: str, schema: str = "public") -> list[str]:
    """The statements that make ``role`` a reader of the queue in ``database``/``schema`` (idempotent)."""
    validate_role(role)
    quoted, where = _ident(role), _ident(schema)
    tables = ", ".join(f"{where}.{table}" for table in QUEUE_TABLES)
    readable = ", ".join(f"{where}.{table}" for table in READER_TABLES)
    return [
        # The role name is checked above (a-z 0-9 _), so it can stand in a literal and an identifier.
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN "
        f"CREATE ROLE {quoted} LOGIN; END IF; END $$",
        f"GRANT CONNECT ON DATABASE {_ident(database)} TO {quoted}",
        f"GRANT USAGE ON SCHEMA {where} TO {quoted}",
        f"REVOKE ALL ON TABLE {tables} FROM {quoted}",
        f"GRANT SELECT ON TABLE {readable} TO {quoted}",
    ]


def _where(queue: PostgresQueue) -> tuple[str, str]:
    def work(cur: Cursor) -> tuple[str, str]:
        cur.execute("SELECT current_database(), current_schema()")
        database, schema = cur.fetchone()
        return str(database), str(schema)

    return queue._read(work)


def grant_reader(queue: PostgresQueue, role: str) -> list[str]:
    """Run ``reader_grants`` for ``queue``'s database and schema in one transaction; return them."""
    statements = reader_grants(role, *_where(queue))

    def work(cur: Cursor) -> None:
        for statement in statements:
            cur.execute(statement)

    queue._transaction(work)
    return statements


def writable_tables(queue: PostgresQueue) -> list[str]:
    """The queue tables the connected role may INSERT into, UPDATE, DELETE from or TRUNCATE."""

    def work(cur: Cursor) -> list[Any]:
        found = []
        for table in QUEUE_TABLES:
            cur.execute("SELECT to_regclass(quote_ident(current_schema()) || '.' || ?) IS NOT NULL"
                        " AND has_table_privilege(current_user, quote_ident(current_schema()) || '.' || ?,"
                        " 'INSERT, UPDATE, DELETE, TRUNCATE')", (table, table))
            if cur.fetchone()[0]:
                found.append(table)
        return found

    return list(queue._read(work))


_SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def queue_file_problem(db: Path) -> str | None:
    """Why the file ``db`` holds no benchseal queue, judged before the queue opens it, or None: absent,
    not a regular file, empty, not SQLite (its header), or an SQLite database with neither the ``runs``
    nor the ``schema_migrations`` table (``SqliteQueue._current_version``'s test for a queue). A file
    this cannot read far enough to judge gets None: opening it then says why (corrupt, -wal files)."""
    try:
        info = os.stat(db)
    except FileNotFoundError:
        return "does not exist (nothing accepted on this host yet, or the path names another file)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_size == 0:
        return "is empty: not an SQLite database"
    try:
        with open(db, "rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if header != _SQLITE_HEADER:
        return "is not an SQLite database"
    try:
        conn = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=5)
        try:
            tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if not tables & {"runs", "schema_migrations"}:
        return f"is an SQLite database without the queue's tables ({len(tables)} other table(s))"
    return None


def open_reader(db: Path | None = None, url: str | None = None) -> SqlQueue:
    """The queue the API reads: the PostgreSQL ``url`` (as a read-only role), else the SQLite file ``db``.

    NotAQueue (a CheckFailed) when the file or database holds no queue (``queue_file_problem``; a
    PostgreSQL database without the queue's schema), CheckFailed when its schema version is not this
    benchseal's or its role may write, InfrastructureError when it cannot be read or reached."""
    if url is None:
        path = (db or default_db_path()).resolve()
        problem = queue_file_problem(path)
        if problem:
            raise NotAQueue(f"queue database {path} {problem}")
        return SqliteQueue(path, read_only=True)
    # lazy: psycopg costs 120-150 ms at import (python -X importtime, 2026-12-03); a SQLite reader never pays it
    from pipeline.infra.queue.postgres import PostgresQueue

    # A page waits for a database that is down for seconds, not the worker's 30 s of reconnecting.
    queue = PostgresQueue(url, read_only=True, reconnect_seconds=5.0, connect_timeout=5, check_schema=False)
    try:
        version = queue.schema_version()
        if version == 0:
            raise NotAQueue(f"queue database {queue.location} holds no benchseal queue (no schema_migrations "
                            "table): run `benchseal infra migrate` as its owner, or name the queue's database")
        check_version(queue.location, version)
        writable = writable_tables(queue)
    except BaseException:
        queue.close()
        raise
    if writable:
        queue.close()
        raise CheckFailed(f"queue database {queue.location}: its role may write {', '.join(writable)}: the API "
                          "connects only as a role granted SELECT (`benchseal api grant-reader ROLE`)")
    return queue


# --- rows as the API shows them: one unreadable row is marked, never the whole answer refused ------

_RUN_INDEX = {name.strip(): index for index, name in enumerate(RUN_COLUMNS.split(","))}
_RUN_STATES = frozenset(RunState)
MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class Unreadable:
    """A row of the queue the API cannot decode (a corrupt payload, grading, state, history entry or
    comparison): shown with its run id and why, in one escaped line, while every other row is served."""

    run_id: str
    reason: str


@dataclass(frozen=True)
class ReleaseRow:
    """A history entry and the comparison recorded with it (None: none was recorded)."""

    entry: HistoryEntry
    comparison: Comparison | None


def _reason(column: str, exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        text = f"{column}: {where + ': ' if where else ''}{first['msg']}{more}"
    else:
        text = f"{column}: {exc or type(exc).__name__}"
    return escape_text(" ".join(text.split()))[:MAX_REASON_CHARS]


def _decoded(column: str, decode: Callable[[], T]) -> T:
    """``decode()``; whatever it raises becomes ``_Undecodable`` naming ``column``. Decoding a row is pure
    (the database was read before), so any exception means this row's contents, never the queue."""
    try:
        return decode()
    except Exception as exc:  # any failure to decode one row marks that row, and only it
        raise _Undecodable(_reason(column, exc)) from None


class _Undecodable(Exception):
    pass


def _row_id(value: object) -> str:
    return escape_text(str(value))[:100]


def _run(row: Sequence[object]) -> RunRecord | Unreadable:
    try:
        state = row[_RUN_INDEX["state"]]
        if state not in _RUN_STATES:
            raise _Undecodable("state: not a run state")  # the value is not echoed, as pydantic's messages do not
        _decoded("payload", lambda: parse_payload(str(row[_RUN_INDEX["payload"]])))
        grading = row[_RUN_INDEX["grading"]]
        if grading is not None:
            _decoded("grading", lambda: Grading.model_validate_json(str(grading)))
        record = _decoded("row", lambda: SqlQueue._record(row))
        _decoded("row", record.status)  # what /runs/{id} serves must be buildable too
        return record
    except _Undecodable as exc:
        return Unreadable(_row_id(row[0]), str(exc))


def runs(queue: SqlQueue) -> list[RunRecord | Unreadable]:
    """Every run (as ``Queue.list_runs`` orders them); a row that cannot be decoded is an ``Unreadable``."""

    def work(cur: Cursor) -> list[Any]:
        cur.execute(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at, run_id")  # noqa: S608
        return cur.fetchall()

    return [_run(row) for row in queue._read(work)]


def run(queue: SqlQueue, run_id: str) -> RunRecord | Unreadable:
    """One run (ValidationError on field run_id when there is none), or why its row cannot be decoded."""
    row = queue._read(lambda cur: queue._row(cur, run_id))
    if row is None:
        raise ValidationError("run_id", "no such run", run_id)
    return _run(row)


def _release(row: Sequence[object]) -> ReleaseRow | Unreadable:
    run_id, entry, summary_digest, comparison = row
    try:
        decoded = _decoded("entry", lambda: HistoryEntry.model_validate_json(str(entry)).model_copy(
            update={"summary_digest": None if summary_digest is None else str(summary_digest)}))
        compared = None if comparison is None else _decoded(
            "comparison", lambda: Comparison.model_validate_json(str(comparison)))
    except _Undecodable as exc:
        return Unreadable(_row_id(run_id), f"history: {exc}")
    return ReleaseRow(decoded, compared)


def releases(queue: SqlQueue, repository: str) -> list[ReleaseRow | Unreadable]:
    """``repository``'s recorded releases with their comparisons, oldest first (``Queue.history``'s
    order); a row that cannot be decoded is an ``Unreadable``."""

    def work(cur: Cursor) -> list[Any]:
        cur.execute("SELECT run_id, entry, summary_digest, comparison FROM releases WHERE repository = ?"
                    " ORDER BY recorded_at, run_id", (canonical_repository(repository),))
        return cur.fetchall()

    return [_release(row) for row in queue._read(work)]


def comparison(queue: SqlQueue, run_id: str) -> ReleaseRow | Unreadable | None:
    """The history row of ``run_id`` (None: the run was not scored), or why it cannot be decoded."""

    def work(cur: Cursor) -> Any:
        cur.execute("SELECT run_id, entry, summary_digest, comparison FROM releases WHERE run_id = ?", (run_id,))
        return cur.fetchone()

    row = queue._read(work)
    return None if row is None else _release(row)
