"""Atomic file writes: readers see the old file or the new one, never a torn one."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def canonical_json(data: Any) -> str:
    """Stable JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, canonical_json(data))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Streamed SHA-256 (hex) of a file of any size."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def is_plain_relative_name(name: str) -> bool:
    """A '/'-separated name that stays inside the directory it is resolved in: not empty, not absolute,
    no empty, '.' or '..' part, no backslash or NUL (what an archive member may be called)."""
    return (bool(name) and not name.startswith("/") and "\\" not in name and "\0" not in name
            and not any(part in ("", ".", "..") for part in name.split("/")))


def is_plain_entry(path: str | os.PathLike[str]) -> bool:
    """A regular file or a real directory, judged by lstat: a symlink to either is not, nor a FIFO or device."""
    mode = os.lstat(path).st_mode
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)
