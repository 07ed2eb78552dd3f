"""The SQLite backend of the run queue (the default; one host, several processes): WAL mode, every
write in ``BEGIN IMMEDIATE``. The rules are ``pipeline.infra.queue.rules.SqlQueue``'s."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.paths import state_dir
from pipeline.infra.queue.helpers import Cursor, T, iso, one_line
from pipeline.infra.queue.rules import SqlQueue
from pipeline.infra.queue.schema import SCHEMA_VERSION, SQLITE, VERSIONS_TABLE, check_version, migration

BUSY_TIMEOUT_ENV = "BENCHSEAL_QUEUE_BUSY_TIMEOUT"


def default_db_path() -> Path:
    return state_dir("infra") / "queue.sqlite3"


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
    text = one_line(str(exc))
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

    ``read_only`` (the API): the file is opened ``mode=ro`` with ``PRAGMA query_only``, never created,
    migrated or switched to WAL, and every write is refused (SQLite refuses one on the connection
    too). A reader of a WAL database needs its ``-wal`` and ``-shm`` files: where its directory is
    read-only (the API's container) they must already exist. They do while a writer has the file
    open, and a read-only open where the directory IS writable creates them and, unable to
    checkpoint, leaves them in place (what ``benchseal api check-image`` does on the host).
    """

    backend = "sqlite"

    def __init__(self, db: Path | None = None, *, runs_dir: Path | None = None, busy_timeout_ms: int = 30000,
                 check_schema: bool = True, create: bool = True, read_only: bool = False) -> None:
        self.db = (db or default_db_path()).resolve()
        self.location = str(self.db)
        self.read_only = read_only
        create = create and not read_only
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
            target = self.db if create else f"file:{quote(str(self.db))}?mode={'ro' if read_only else 'rw'}"
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
        text, name = one_line(str(exc)), getattr(exc, "sqlite_errorname", "") or ""
        if self.read_only and ("readonly" in text.lower() or name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))):
            # What a read needs to write: the wal-index of a WAL file, in a directory it cannot write.
            return InfrastructureError(f"queue database {self.db}: opened read-only, and reading it needs its -wal and "
                                       "-shm files, which are absent and cannot be created here (they exist while a "
                                       f"writer has it open) ({text})")
        return InfrastructureError(f"queue database {self.db}: {_sqlite_cause(exc, self._busy, self.db)}")

    def _refuse_write(self) -> None:
        if self.read_only:
            raise InfrastructureError(f"queue database {self.db}: opened read-only: refusing to write")

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
                    check_version(self.location, version)  # before WAL: a refused file is left byte-identical
                if self.read_only:
                    self._conn.execute("PRAGMA query_only = ON")
                    break
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
                    cur.execute(VERSIONS_TABLE)
                    if before == 1:
                        cur.execute("INSERT OR IGNORE INTO schema_migrations (version, applied_at) VALUES (1, ?)", (iso(time.time()),))
                    for version in range(before + 1, SCHEMA_VERSION + 1):
                        # executescript would COMMIT: run the statements one by one inside this transaction.
                        for statement in migration(SQLITE, version):
                            cur.execute(statement)
                        cur.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, iso(time.time())))
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return before, SCHEMA_VERSION
            finally:
                cur.close()

    def migrate(self) -> tuple[int, int]:
        """Apply the pending migrations in one transaction; return (version before, version after)."""
        self._refuse_write()
        try:
            before, after = self._apply_migrations(new_only=False)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        check_version(self.location, after)
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
        self._refuse_write()
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
