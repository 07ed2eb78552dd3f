"""One trial's evidence (its Harbor trial dir) packed into the queue, so the grading host publishes
every trial's dir whichever host ran it.

The host that ran a trial packs the dir with its graded record (``complete_trials``); the host
that grades the run unpacks, into ``runs/<run_id>/harbor/<trial>/``, the dirs it does not hold
itself. A pack is a gzip'd tar of regular files and directories only, under bounded sizes; an
unpack accepts nothing else (no links, devices, absolute names, ``..``, duplicates, a file and a
member under it, a name ``fsutil.name_problem`` refuses) and writes into a new directory that
replaces nothing, so a pack from a compromised host cannot reach outside its trial's dir.

Names: the packing host leaves behind (and logs) a file or directory whose name would not be plain
once it is evidence (``artifacts/evidence/harbor/<trial>/<name>``, what the export and
evidence-SHA256SUMS carry): it must keep grading, and the trial's other files are still evidence.
A pack that holds such a name anyway was not made here: it is refused whole.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.core.contracts import trial_name_problem
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import NameTree, is_plain_entry, name_problem, open_regular
from pipeline.infra.queue.sql import MAX_TRIAL_EVIDENCE_BYTES

# Unpacked size and member bounds (a gzip bomb stays a refused pack, not a full disk).
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_MEMBERS = 20_000
# Where a trial's files end up in a run dir's evidence (export member names start with it).
EVIDENCE_HARBOR = "artifacts/evidence/harbor"
log = logging.getLogger("benchseal.trial_evidence")


def evidence_name_problem(trial_name: str, name: str) -> str | None:
    """Why ``name`` (relative to the trial's dir) would not be a plain name as evidence, or None."""
    return name_problem(f"{EVIDENCE_HARBOR}/{trial_name}/{name}")


def pack_trial_dir(trial_dir: Path) -> bytes:
    """Pack ``trial_dir`` (its regular files and directories; links and special files stay behind,
    as in the evidence copy). Raises CheckFailed when the pack exceeds the queue's bound."""
    if not trial_dir.is_dir() or trial_dir.is_symlink():
        raise CheckFailed(f"{trial_dir}: not a directory")
    buffer = io.BytesIO()
    members = 0
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
        for root, dirs, files in os.walk(trial_dir):
            dirs[:] = sorted(d for d in dirs if is_plain_entry(os.path.join(root, d))
                             and _packable(trial_dir, Path(root) / d))
            for name in [*dirs, *sorted(files)]:
                path = Path(root) / name
                if not is_plain_entry(str(path)) or (name in files and not _packable(trial_dir, path)):
                    continue
                members += 1
                if members > MAX_MEMBERS:
                    raise CheckFailed(f"{trial_dir}: more than {MAX_MEMBERS} entries")
                arcname = path.relative_to(trial_dir).as_posix()
                info = tarfile.TarInfo(arcname)
                info.mtime = 0
                if path.is_dir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    continue
                # A file swapped for a link or FIFO after the listing is skipped, never followed.
                try:
                    handle, opened = open_regular(path)
                except OSError:
                    continue
                with handle:
                    info.size, info.mode = opened.st_size, 0o644
                    tar.addfile(info, handle)
                if buffer.tell() > MAX_TRIAL_EVIDENCE_BYTES:
                    raise CheckFailed(f"{trial_dir}: packed evidence exceeds {MAX_TRIAL_EVIDENCE_BYTES} bytes")
    data = buffer.getvalue()
    if len(data) > MAX_TRIAL_EVIDENCE_BYTES:
        raise CheckFailed(f"{trial_dir}: packed evidence exceeds {MAX_TRIAL_EVIDENCE_BYTES} bytes")
    return data


def evidence_copy_ignore(source: Path, target: str) -> Callable[[str, list[str]], set[str]]:
    """A ``shutil.copytree`` ``ignore`` for copying ``source`` to ``target`` (a name relative to the run
    dir, e.g. ``artifacts/evidence/harbor``): links and special files stay behind (a trial's symlink
    could name any file of the host, and consumers refuse links), and so does, logged, every entry
    whose name there would not be plain (fsutil.name_problem): the worker keeps going, and the
    export, evidence-SHA256SUMS and verify never meet a name they would refuse."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        left: set[str] = set()
        for name in names:
            path = os.path.join(directory, name)
            if not is_plain_entry(path):
                left.add(name)
                continue
            relative = f"{target}/{Path(path).relative_to(source).as_posix()}"
            problem = name_problem(relative)
            if problem:
                log.warning("%r is left out of the evidence: its name %s", relative, problem)
                left.add(name)
        return left
    return ignore


def _packable(trial_dir: Path, path: Path) -> bool:
    name = path.relative_to(trial_dir).as_posix()
    problem = evidence_name_problem(trial_dir.name, name)
    if problem:
        log.warning("%s: %r is left out of the trial's evidence: its name %s", trial_dir, name, problem)
    return problem is None


def check_trial_name(trial_name: str) -> str:
    """A trial name is ``contracts``' one rule (``<task>__<run short id>``, ``<task>__a<k>of<n>__<run short id>``
    for attempt k of n): one plain directory name, never hidden."""
    problem = trial_name_problem(trial_name)
    if problem:
        raise CheckFailed(f"trial evidence: trial name {trial_name!r} {problem}")
    return trial_name


def read_trial_pack(data: bytes) -> Iterator[tuple[str, bytes | None]]:
    """Each member of a pack as (relative name, content; None for a directory), checked: plain
    relative names, no duplicates, regular files and directories only, bounded sizes and count."""
    if len(data) > MAX_TRIAL_EVIDENCE_BYTES:
        raise CheckFailed(f"trial evidence: {len(data)} bytes, more than {MAX_TRIAL_EVIDENCE_BYTES}")
    tree = NameTree()
    count = total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                name = member.name
                problem = name_problem(name) or tree.problem(name, is_dir=member.isdir())
                if problem:
                    raise CheckFailed(f"trial evidence: member {name!r} {problem}")
                count += 1
                if count > MAX_MEMBERS:
                    raise CheckFailed(f"trial evidence: more than {MAX_MEMBERS} members")
                if member.isdir():
                    yield name, None
                    continue
                if not member.isreg():
                    raise CheckFailed(f"trial evidence: member {name!r} is not a regular file or directory")
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise CheckFailed(f"trial evidence: more than {MAX_UNPACKED_BYTES} bytes unpacked")
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - a regular member always has a file object
                    raise CheckFailed(f"trial evidence: member {name!r} has no content")
                content = source.read()
                if len(content) != member.size:
                    raise CheckFailed(f"trial evidence: member {name!r} is truncated")
                yield name, content
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise CheckFailed(f"trial evidence: not a readable pack ({type(exc).__name__}: {exc})") from None


def unpack_trial_dir(data: bytes, target: Path) -> None:
    """Unpack a pack made by ``pack_trial_dir`` into ``target``, which must not exist yet.

    Everything is checked and written into a temporary sibling first, then renamed into place:
    a refused pack leaves nothing behind."""
    if target.exists() or target.is_symlink():
        raise CheckFailed(f"{target}: already exists; trial evidence is never merged into a dir")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        staging.chmod(0o755)
        for name, content in read_trial_pack(data):
            destination = staging / name
            try:
                if content is None:
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                # O_EXCL | O_NOFOLLOW: nothing already there (a name a directory member made) is written through.
                fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
            except OSError as exc:
                raise CheckFailed(f"trial evidence: member {name!r} cannot be written ({exc.strerror})") from None
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
