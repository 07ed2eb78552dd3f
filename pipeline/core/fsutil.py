"""Atomic file writes (readers see the old file or the new one, never a torn one), staged directories,
and the one rule for a relative name that travels between hosts (``name_problem``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.core.errors import CheckFailed


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


# The one rule for a name that travels (an export member, a trial-pack member, a checksummed file):
# a name it accepts is the same string on every host, in every SHA256SUMS line, and in every
# one-line message, so producer and consumer agree on it byte for byte.
MAX_NAME_PART_BYTES = 255  # NAME_MAX of Linux file systems (ext4, xfs, btrfs, tmpfs, overlayfs)
# A whole relative name: well under PATH_MAX (4096) with the directory it is resolved in.
MAX_NAME_BYTES = 1024


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain relative name, or None when it is.

    A plain relative name is '/'-separated parts, each 1-255 bytes of UTF-8, the whole at most
    MAX_NAME_BYTES: not absolute, no empty, '.' or '..' part, no backslash, no part with a leading
    or trailing space (sha256sum readers and shells trim it), every character printable as
    ``str.isprintable`` says (the rule of ``errors.escape_text``: no control Cc, incl. NUL, CR, LF;
    no format Cf, i.e. bidi controls and zero-width characters; no line/paragraph separator Zl/Zp,
    no surrogate Cs (undecodable bytes), private-use Co or unassigned Cn character (as of the
    running Python's Unicode version), no space other than U+0020), and in Unicode NFC: two
    accepted names that differ stay different under any normalisation a file system applies
    (macOS stores NFD), so no two collide. Upper and lower case are different names (Linux).
    """
    if not name:
        return "is empty"
    if name.startswith("/"):
        return "is absolute"
    if not name.isprintable():
        char = next(char for char in name if not char.isprintable())
        return f"has the non-printable character U+{ord(char):04X}"
    if "\\" in name:
        return "has a backslash"
    if unicodedata.normalize("NFC", name) != name:
        return f"is not in Unicode NFC form (it is {name!a})"
    encoded = name.encode("utf-8")
    if len(encoded) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    # Whole-string operations, not a loop over the parts: an export may hold 100,000 deep names.
    parts = name.split("/")
    if "" in parts or "." in parts or ".." in parts:
        return "has an empty, '.' or '..' part"
    if name[0] == " " or name[-1] == " " or " /" in name or "/ " in name:
        return "has a part with a leading or trailing space"
    if max(map(len, encoded.split(b"/"))) > MAX_NAME_PART_BYTES:
        return f"has a part longer than {MAX_NAME_PART_BYTES} bytes"
    return None


def is_plain_relative_name(name: str) -> bool:
    """``name`` passes ``name_problem`` (what an archive member or a checksummed file may be called)."""
    return name_problem(name) is None


class NameTree:
    """The names of one tree as they arrive (an archive's members): each is named once, and no name
    is both a file and a directory (a file, then a member under it, or the reverse), which a file
    system cannot hold and an unpack would otherwise meet half-way through writing."""

    def __init__(self, max_dirs: int = 200_000) -> None:
        # A bound on what the tree keeps: deep names that share no parent would otherwise cost memory
        # quadratic in their depth.
        self._max_dirs = max_dirs
        self._files: set[str] = set()
        self._dirs: set[str] = set()
        self._named: set[str] = set()

    def problem(self, name: str, *, is_dir: bool = False) -> str | None:
        """Why ``name`` cannot join the tree (nothing is added then), or None once it has."""
        if name in self._named:
            return "appears twice"
        if not is_dir and name in self._dirs:
            return "is a file and a directory"
        # Nearest parent first, up to the first one already known as a directory (its own parents were
        # checked when it joined): each parent is looked at once over the whole tree, however deep.
        new_parents = []
        end = name.rfind("/")
        while end > 0:
            parent = name[:end]
            if parent in self._dirs:
                break
            if parent in self._files:
                return f"is under {parent!r}, which is a file"
            new_parents.append(parent)
            if len(self._dirs) + len(new_parents) > self._max_dirs:
                return f"makes more than {self._max_dirs} directories"
            end = name.rfind("/", 0, end)
        self._named.add(name)
        (self._dirs if is_dir else self._files).add(name)
        self._dirs.update(new_parents)
        return None


@contextmanager
def staged_dir(dest: Path) -> Iterator[Path]:
    """A new directory next to ``dest`` for the block to fill, renamed to ``dest`` when the block ends
    and removed when it raises: ``dest`` is then whole, or as it was (absent, or the empty directory it
    was; rename replaces an empty directory). Callers check ``dest`` is new or empty first."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # A short prefix: dest's own name may be up to NAME_MAX already.
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name[:40]}.", suffix=".staging", dir=dest.parent))
    except OSError as exc:
        raise CheckFailed(f"{dest}: no directory can be staged next to it ({exc.strerror})") from None
    try:
        yield staging
        staging.chmod(0o755)
        try:
            os.rename(staging, dest)
        except OSError as exc:  # dest was filled or replaced meanwhile: it is left as it is
            raise CheckFailed(f"{dest}: cannot be put in place ({exc.strerror})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def is_plain_entry(path: str | os.PathLike[str]) -> bool:
    """A regular file or a real directory, judged by lstat: a symlink to either is not, nor a FIFO or device."""
    mode = os.lstat(path).st_mode
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


class NotRegularFile(OSError):
    """What ``open_regular`` found is not a regular file (a FIFO, device, directory...)."""


def open_regular(path: str | os.PathLike[str]) -> tuple[BinaryIO, os.stat_result]:
    """``path`` opened for reading as the regular file it is now, with what fstat says of it.

    A link at its last component is never followed (O_NOFOLLOW) and what was opened is checked, so a
    file swapped for a link or a FIFO after a listing is refused; O_NONBLOCK keeps a FIFO from
    hanging the open (it changes nothing for a regular file). OSError when it cannot be opened,
    NotRegularFile when it is no regular file; the caller closes the handle (``with handle:``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{os.fspath(path)}: not a regular file")
        return os.fdopen(fd, "rb"), info
    except BaseException:
        os.close(fd)
        raise


# sun_path holds 108 bytes with its NUL: a longer socket path cannot be bound as it is.
UNIX_PATH_MAX = 107


def bind_unix(listener: socket.socket, path: Path) -> None:
    """Bind ``listener`` at ``path``, also where the path is longer than a Unix socket address may be (a deep
    state or temp dir): then through ``/proc/self/fd/<its directory>/<name>``, which names the same place."""
    if len(os.fsencode(str(path))) <= UNIX_PATH_MAX:
        listener.bind(str(path))
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listener.bind(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)
