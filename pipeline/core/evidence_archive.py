"""``evidence-logs.tar.gz``: every file ``evidence-SHA256SUMS`` lists, as one release asset.

A release is flat, so the trial evidence (verifier output, agent logs, trajectories, result.json)
travels as this one archive. SHA256SUMS lists it like any top-level file, so it is signed through
SHA256SUMS's bundle (no signing path of its own). A consumer downloads it and evidence-SHA256SUMS,
extracts it beside them and runs ``sha256sum -c evidence-SHA256SUMS``.

The one home of its format, written by the evidence stage and read by verify. Deterministic: the
same files give the same bytes (entries in evidence-SHA256SUMS's order, regular files only, no
directory entries, mtime 0, uid/gid 0 with no owner names, mode 0644, PAX format, gzip with mtime 0
and no file name), so re-sealing a run writes the same archive and SHA256SUMS does not change.
Names are the relative names evidence-SHA256SUMS lists (``evidence/...``): no absolute names, no
``..``, no links. The reader accepts exactly that and nothing else: every member a regular file
whose name and sha256 evidence-SHA256SUMS lists, each listed name once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import NotRegularFile, atomic_write_bytes, name_problem, open_regular
from pipeline.core.layout import EVIDENCE_ARCHIVE, NESTED_SUMS

__all__ = ["EVIDENCE_ARCHIVE", "archive_bytes", "check_archive", "write_archive"]
# One archive larger than this is not a run's evidence (the export itself is bounded at 512 MiB).
MAX_ARCHIVE_MEMBERS = 100_000
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024


def archive_bytes(root: Path, names: Sequence[str]) -> bytes:
    """The archive of ``root``'s files ``names`` (relative, as evidence-SHA256SUMS lists them), in that
    order. Each must be a regular file (opened without following a link) with a plain name."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            problem = name_problem(name)
            if problem:
                raise CheckFailed(f"{EVIDENCE_ARCHIVE}: {name!r} {problem}")
            try:
                handle, info = open_regular(root / name)
            except NotRegularFile:
                raise CheckFailed(f"{EVIDENCE_ARCHIVE}: {name} is not a regular file") from None
            except OSError as exc:  # a link (ELOOP: O_NOFOLLOW) or a file gone since the listing
                raise CheckFailed(f"{EVIDENCE_ARCHIVE}: {name} is not a regular file ({exc.strerror})") from None
            with handle:
                member = tarfile.TarInfo(name)
                member.size, member.mode, member.mtime = info.st_size, 0o644, 0
                member.uid = member.gid = 0
                member.uname = member.gname = ""
                tar.addfile(member, handle)
    out = io.BytesIO()
    # mtime=0 and no file name in the gzip header: the same tar gives the same bytes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def write_archive(root: Path, names: Sequence[str], out: Path) -> Path:
    atomic_write_bytes(out, archive_bytes(root, names))
    return out


def check_archive(data: bytes | Path, listed: Mapping[str, str], source: str = EVIDENCE_ARCHIVE) -> None:
    """Require the archive ``data`` (its bytes, or its file: streamed) to hold exactly the files ``listed`` (name -> sha256 hex, as
    evidence-SHA256SUMS says): regular-file members only, each listed name once with that sha256.
    CheckFailed names the first member or name that differs."""
    seen: set[str] = set()
    total = 0
    try:
        opened = (tarfile.open(name=data, mode="r:gz") if isinstance(data, Path)
                  else tarfile.open(fileobj=io.BytesIO(data), mode="r:gz"))
        with opened as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_ARCHIVE_MEMBERS:
                    raise CheckFailed(f"{source}: more than {MAX_ARCHIVE_MEMBERS} members")
                name = member.name
                problem = name_problem(name)
                if problem:
                    raise CheckFailed(f"{source}: member {name!r} {problem}")
                if not member.isreg():
                    raise CheckFailed(f"{source}: member {name} is not a regular file (links and directories "
                                      "are not evidence)")
                if name in seen:
                    raise CheckFailed(f"{source}: member {name} appears twice")
                seen.add(name)
                if name not in listed:
                    raise CheckFailed(f"{source}: member {name} is not listed in {NESTED_SUMS}")
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise CheckFailed(f"{source}: more than {MAX_UNPACKED_BYTES} bytes unpacked")
                content = tar.extractfile(member)
                if content is None:  # pragma: no cover - a regular member always has a file object
                    raise CheckFailed(f"{source}: member {name} has no content")
                digest = hashlib.sha256()
                while chunk := content.read(1 << 20):
                    digest.update(chunk)
                if digest.hexdigest() != listed[name]:
                    raise CheckFailed(f"{source}: member {name} does not match {NESTED_SUMS}")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise CheckFailed(f"{source}: not a readable tar.gz ({type(exc).__name__}: {exc})") from None
    missing = sorted(set(listed) - seen)
    if missing:
        raise CheckFailed(f"{source}: lacks {missing[0]}, which {NESTED_SUMS} lists"
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
