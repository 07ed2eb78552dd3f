"""A corrupt, locked, full or read-only queue database: one line naming the file and the cause,
exit 1, and nothing changed (issue 9.6). Real files, a real lock held by another process, a real
tiny tmpfs and a real read-only mount."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.core.contracts import DispatchPayload
from pipeline.infra.queue.sql import SqliteQueue


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)


def _accept(payload_file: Path, db: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _cli("infra", "accept", "--payload", str(payload_file), "--db", str(db), env=env)


def _assert_one_line_error(result: subprocess.CompletedProcess[str], db: Path, cause: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    assert "Traceback" not in result.stderr
    assert lines[0].startswith(f"benchseal: error: queue database {db}: {cause}"), lines[0]
    assert result.stdout == ""


def _make_db(db: Path, make_payload, n: int = 3) -> None:
    with SqliteQueue(db) as q:
        for i in range(n):
            q.enqueue(DispatchPayload.model_validate(make_payload(correlation_id=f"err-corr-{i:06d}")), max_attempts=3)
    # Closing the last connection checkpoints the WAL into the main file and removes it.
    assert not Path(str(db) + "-wal").exists()


@pytest.fixture
def payload_file(tmp_path, make_payload) -> Path:
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(make_payload(correlation_id="err-new-000001")))
    return path


@pytest.mark.parametrize("damage", ["garbage", "header-kept-pages-garbled", "truncated", "foreign-sqlite"])
def test_corrupt_database(tmp_path, make_payload, payload_file, damage):
    db = tmp_path / "q" / "queue.sqlite3"
    db.parent.mkdir()
    if damage == "garbage":
        db.write_bytes(os.urandom(8192))
    elif damage == "foreign-sqlite":
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, data BLOB)")
        conn.close()
    else:
        _make_db(db, make_payload)
        data = bytearray(db.read_bytes())
        if damage == "truncated":
            data = data[: len(data) // 2 + 100]
        else:
            page = int.from_bytes(data[16:18], "big")
            for offset in range(page, len(data)):  # every page after the schema page
                data[offset] = 0xA5
        db.write_bytes(bytes(data))
    before = _sha(db)
    for result in (_accept(payload_file, db), _cli("infra", "status", "--db", str(db))):
        _assert_one_line_error(result, db, "corrupt")
    assert _sha(db) == before


@contextmanager
def _write_lock_held(db: Path) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE')\n"
         "c.execute(\"UPDATE runs SET reason = 'held' WHERE 0\")\n"
         "print('locked', flush=True)\n"
         "time.sleep(120)\n", str(db)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_locked_database(tmp_path, make_payload, payload_file):
    db = tmp_path / "q" / "queue.sqlite3"
    _make_db(db, make_payload)
    with SqliteQueue(db) as q:
        runs_before = [r.run_id for r in q.list_runs()]
    with _write_lock_held(db):
        started = time.monotonic()
        result = _accept(payload_file, db, env={"BENCHSEAL_QUEUE_BUSY_TIMEOUT": "1"})
        assert time.monotonic() - started < 60
        _assert_one_line_error(result, db, "locked")
        assert "another process holds a write transaction" in result.stderr
    with SqliteQueue(db) as q:
        assert [r.run_id for r in q.list_runs()] == runs_before  # nothing enqueued
    # Once the lock is gone the same command works: the refusal changed nothing.
    ok = _accept(payload_file, db)
    assert ok.returncode == 0, ok.stderr


def test_busy_timeout_setting_is_validated(tmp_path, make_payload, payload_file):
    db = tmp_path / "q" / "queue.sqlite3"
    result = _accept(payload_file, db, env={"BENCHSEAL_QUEUE_BUSY_TIMEOUT": "soon"})
    assert result.returncode == 2 and "BENCHSEAL_QUEUE_BUSY_TIMEOUT" in result.stderr


@contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the test needs root with mount rights): {mounted.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _dump(db: Path) -> list[str]:
    # Read-only, immutable: works on a read-only mount and writes nothing.
    conn = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("when", ["on-open", "on-write"])
def test_full_file_system(tmp_path, make_payload, payload_file, when):
    with _tmpfs(tmp_path / "tiny", "512k") as mount:
        db = mount / "queue.sqlite3"
        _make_db(db, make_payload)
        before, dump = _sha(db), _dump(db)
        # on-write: another reader keeps the -wal/-shm files, so opening works and the write itself hits the full disk.
        reader = sqlite3.connect(db) if when == "on-write" else None
        if reader is not None:
            reader.execute("SELECT COUNT(*) FROM runs").fetchone()
        filler = mount / "filler"
        with filler.open("wb") as handle:  # fill every remaining block
            try:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
            except OSError:
                pass
        result = _accept(payload_file, db)
        _assert_one_line_error(result, db, "full")
        if reader is not None:
            reader.close()
        assert _sha(db) == before and _dump(db) == dump
        # Space again: the same command succeeds, so the refusal left nothing half-done.
        filler.unlink()
        for leftover in (Path(str(db) + "-wal"), Path(str(db) + "-shm")):
            leftover.unlink(missing_ok=True)
        ok = _accept(payload_file, db)
        assert ok.returncode == 0, ok.stderr


def test_read_only_file_system(tmp_path, make_payload, payload_file):
    with _tmpfs(tmp_path / "ro", "4m") as mount:
        db = mount / "queue.sqlite3"
        _make_db(db, make_payload)
        before, dump = _sha(db), _dump(db)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        for result in (_accept(payload_file, db), _cli("infra", "status", "--db", str(db))):
            _assert_one_line_error(result, db, "read-only")
        assert _sha(db) == before and _dump(db) == dump
        assert sorted(p.name for p in mount.iterdir()) == ["queue.sqlite3", "runs"]


def test_read_only_directory_for_a_new_database(tmp_path, payload_file):
    with _tmpfs(tmp_path / "ro-new", "1m") as mount:
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        db = mount / "queue.sqlite3"
        result = _accept(payload_file, db)
        assert result.returncode == 1 and str(db) in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert list(mount.iterdir()) == []


@pytest.mark.parametrize("verb", [["infra", "status"], ["infra", "status", "--summary"],
                                  ["infra", "export", "run-0123456789abcdef0123"]])
@pytest.mark.parametrize("file", ["missing", "empty", "missing-dir"])
def test_a_reader_never_creates_a_queue(tmp_path, verb, file):
    """status and export on a path that holds no queue: exit 1 naming it, and nothing is created
    (an empty queue made from a mistyped --db would report depth 0)."""
    db = {"missing": tmp_path / "queue.db", "empty": tmp_path / "queue.db",
          "missing-dir": tmp_path / "no" / "such" / "queue.db"}[file]
    if file == "empty":
        db.write_bytes(b"")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = _cli(*verb, "--db", str(db))
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.startswith(f"benchseal: error: queue database {db}"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    if file == "empty":
        assert db.read_bytes() == b""
