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

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.queue.helpers import Cursor
from pipeline.infra.queue.rules import SqlQueue
from pipeline.infra.queue.sqlite import SqliteQueue

if TYPE_CHECKING:
    from pipeline.infra.queue.postgres import PostgresQueue

# What the API reads: the schema version (checked at every open), the runs and the release history.
READER_TABLES = ("schema_migrations", "runs", "releases")
# Every table of the queue's schema (pipeline.infra.queue.schema): a reader holds no other privilege on any.
QUEUE_TABLES = ("schema_migrations", "runs", "events", "publications", "workers", "trials", "releases")
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


def open_reader(db: Path | None = None, url: str | None = None) -> SqlQueue:
    """The queue the API reads: the PostgreSQL ``url`` (as a read-only role), else the SQLite file ``db``."""
    if url is None:
        return SqliteQueue(db, read_only=True)
    # lazy: psycopg costs 120-150 ms at import (python -X importtime, 2026-12-03); a SQLite reader never pays it
    from pipeline.infra.queue.postgres import PostgresQueue

    # A page waits for a database that is down for seconds, not the worker's 30 s of reconnecting.
    queue = PostgresQueue(url, read_only=True, reconnect_seconds=5.0, connect_timeout=5)
    try:
        writable = writable_tables(queue)
    except BaseException:
        queue.close()
        raise
    if writable:
        queue.close()
        raise CheckFailed(f"queue database {queue.location}: its role may write {', '.join(writable)}: the API "
                          "connects only as a role granted SELECT (`benchseal api grant-reader ROLE`)")
    return queue
