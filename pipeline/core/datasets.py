"""The one content digest of a Harbor-format dataset directory, and the check of a staged copy.

A dataset is a directory of tasks (``<task>/task.toml``, ``instruction.md``, ``environment/``,
``tests/``, ``solution/``) and possibly files beside them. Its digest covers every regular file
under the root, by name, executable bit and bytes, in one canonical order, so a score can name the
exact bytes of the tasks it ran and a staged copy (a cache, a download) can be checked against it::

    digest   = "sha256:" HEX(SHA256(manifest))
    manifest = "benchseal.dataset/1" LF *line           ; lines sorted by the UTF-8 bytes of path
    line     = mode SP HEX(SHA256(file bytes)) SP path LF
    mode     = "755" / "644"                            ; "755" when any execute bit is set
    path     = the file's name relative to the root, '/'-separated, UTF-8

``HEX`` is 64 lowercase hex digits. ``path`` is a plain relative name (``fsutil.name_problem``:
printable, NFC, no absolute name, no empty, '.' or '..' part), so no line can be forged by a name;
directories are not entries (an empty directory changes nothing). Owner, other mode bits, times
and extended attributes are not covered: Harbor reads none of them.

Refused, one line naming the path and the rule (``DatasetRefused``): a symlink, a special file
(FIFO, socket, device), a name that is not UTF-8 or not a plain relative name, and a dataset with
no task (no ``<task>/task.toml``). Nothing is followed or opened through a link: a walk sees
what is on disk, a file is opened with ``O_NOFOLLOW`` and checked to be regular after it is open.

A task may name a prebuilt image instead of building ``environment/Dockerfile``: its task.toml's
``[environment] docker_image`` must then be ``<registry>/<repository>@sha256:<64 hex>``
(``pipeline.core.digests.parse_ref``), so the dataset's digest also pins the images its tasks run in;
``task_images`` reads them, refusing a tag or anything else in one line naming the task and the field
(``[verifier.environment] docker_image`` is refused outright: the verifier runs in the task's environment).
A task built from ``environment/Dockerfile`` names its base on each ``FROM`` line: ``benchseal-base``
(benchseal's own base) or a registry image pinned the same way; ``task_bases`` reads those, refusing any
other form (a tag, a stage name, a build argument, ``scratch``) in one line naming the task.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import stat
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.digests import ImageRef, parse_ref, validate_digest
from pipeline.core.errors import DatasetDigestMismatch, DatasetRefused, ValidationError
from pipeline.core.fsutil import name_problem

MANIFEST_HEADER = "benchseal.dataset/1"
BASE_PLACEHOLDER = "benchseal-base"  # a task Dockerfile's FROM for benchseal's own base (rendered onto it by id)
FROM_RE = re.compile(r"^\s*FROM\s+(\S+)(.*)$", re.IGNORECASE)
TASK_FILE = "task.toml"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class DatasetEntry:
    """One file of a dataset: its relative POSIX name, whether it is executable, the sha256 of its bytes."""

    path: str
    executable: bool
    sha256: str


def check_entry_name(path: str) -> None:
    """Refuse a name that is not a plain relative UTF-8 name (the rule every source of entries keeps)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise DatasetRefused(path, "the name is not UTF-8") from None
    problem = name_problem(path)
    if problem is not None:
        raise DatasetRefused(path, f"the name {problem}")


def manifest(entries: Iterable[DatasetEntry]) -> bytes:
    """The canonical manifest of ``entries`` (module docstring); refuses bad names, duplicates, no task."""
    lines: list[tuple[bytes, bytes]] = []
    for entry in entries:
        check_entry_name(entry.path)
        if len(entry.sha256) != 64 or entry.sha256.strip("0123456789abcdef"):
            raise DatasetRefused(entry.path, "the file's sha256 must be 64 lowercase hex digits")
        name = entry.path.encode("utf-8")
        lines.append((name, b"%s %s %s\n" % (b"755" if entry.executable else b"644", entry.sha256.encode(), name)))
    lines.sort()
    for (first, _), (second, _) in itertools.pairwise(lines):
        if first == second:
            raise DatasetRefused(first.decode("utf-8"), "the name appears twice")
    if not any(name.count(b"/") == 1 and name.endswith(b"/" + TASK_FILE.encode()) for name, _ in lines):
        raise DatasetRefused(".", f"the dataset holds no task (no <task>/{TASK_FILE})")
    return MANIFEST_HEADER.encode() + b"\n" + b"".join(line for _, line in lines)


def digest_entries(entries: Iterable[DatasetEntry]) -> str:
    """``sha256:<hex>`` of the manifest of ``entries``."""
    return "sha256:" + hashlib.sha256(manifest(entries)).hexdigest()


def dataset_entries(root: Path) -> list[DatasetEntry]:
    """Every regular file under ``root`` as an entry; refuses links, special files and bad names."""
    try:
        top = os.lstat(root)
    except OSError as exc:
        raise DatasetRefused(str(root), f"cannot read the dataset directory: {exc.strerror}") from None
    if not stat.S_ISDIR(top.st_mode):
        raise DatasetRefused(str(root), "the dataset must be a directory (not a link or a file)")
    found: list[DatasetEntry] = []
    _walk(root, "", found)
    return found


def _walk(directory: Path, prefix: str, found: list[DatasetEntry]) -> None:
    try:
        children = sorted(os.scandir(directory), key=lambda child: child.name)
    except OSError as exc:
        raise DatasetRefused(prefix or ".", f"cannot list the directory: {exc.strerror}") from None
    for child in children:
        rel = prefix + child.name
        check_entry_name(rel)
        mode = child.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise DatasetRefused(rel, "is a symlink (a dataset holds regular files and directories only)")
        if stat.S_ISDIR(mode):
            _walk(Path(child.path), rel + "/", found)
        elif stat.S_ISREG(mode):
            found.append(_hash_file(Path(child.path), rel))
        else:
            raise DatasetRefused(rel, "is a special file (FIFO, socket or device): a dataset holds regular files only")


def _hash_file(path: Path, rel: str) -> DatasetEntry:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DatasetRefused(rel, f"cannot be opened as a regular file: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if not stat.S_ISREG(opened.st_mode):  # swapped between the walk and the open
            raise DatasetRefused(rel, "is no longer a regular file")
        h = hashlib.sha256()
        while chunk := handle.read(_READ_CHUNK):
            h.update(chunk)
    return DatasetEntry(path=rel, executable=bool(opened.st_mode & 0o111), sha256=h.hexdigest())


def dataset_digest(root: Path) -> str:
    """The dataset digest of the directory ``root`` (module docstring)."""
    return digest_entries(dataset_entries(root))


def verify_staged(root: Path, expected: str) -> str:
    """Re-hash a staged dataset and refuse it unless its digest is ``expected``; return the digest.

    Whatever staged it (a cache, a download, a copy) is not trusted: only the bytes on disk now count.
    """
    validate_digest(expected, "dataset digest")
    actual = dataset_digest(root)
    if actual != expected:
        raise DatasetDigestMismatch(str(root), f"its content digest is {actual}, not the pinned {expected}")
    return actual


def task_image_field(task: str, section: str = "[environment]") -> str:
    """The field a task image refusal names: the task and its task.toml key."""
    return f"task {task}: task.toml {section} docker_image"


def _task_configs(dataset: Path, tasks: Iterable[str] | None) -> Iterable[tuple[str, Any]]:
    """(task, its parsed task.toml) for every task (of ``tasks``, when given); ValidationError if unreadable."""
    wanted = None if tasks is None else set(tasks)
    for task_toml in sorted(dataset.glob("*/task.toml")):
        task = task_toml.parent.name
        if wanted is not None and task not in wanted:
            continue
        try:
            yield task, tomllib.loads(task_toml.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValidationError(f"task {task}: task.toml", f"must be readable TOML ({exc})") from None


def task_images(dataset: Path, tasks: Iterable[str] | None = None) -> dict[str, ImageRef]:
    """{task: image} for every task (of ``tasks``, when given) whose task.toml names a prebuilt image;
    ValidationError naming the task and the field unless it is pinned by digest."""
    found: dict[str, ImageRef] = {}
    for task, config in _task_configs(dataset, tasks):
        verifier = config.get("verifier")
        verifier_env = verifier.get("environment") if isinstance(verifier, dict) else None
        if isinstance(verifier_env, dict) and "docker_image" in verifier_env:
            raise ValidationError(task_image_field(task, "[verifier.environment]"), "is not supported: the verifier runs in "
                                  "the task's own environment ([environment] docker_image, pinned by digest)",
                                  verifier_env["docker_image"])
        environment = config.get("environment")
        if not isinstance(environment, dict) or "docker_image" not in environment:
            continue
        found[task] = parse_ref(environment["docker_image"], task_image_field(task))
    return found


def task_base_field(task: str) -> str:
    """The field a task base refusal names: the task and its Dockerfile's FROM."""
    return f"task {task}: environment/Dockerfile FROM"


def task_bases(dataset: Path, tasks: Iterable[str] | None = None) -> dict[str, tuple[ImageRef, ...]]:
    """{task: the registry images its environment/Dockerfile builds FROM} for every task (of ``tasks``) built
    from its Dockerfile (not naming a prebuilt image). Each FROM must be ``benchseal-base`` or
    ``<registry>/<repository>@sha256:<64 hex>``; ValidationError naming the task otherwise."""
    found: dict[str, tuple[ImageRef, ...]] = {}
    for task, config in _task_configs(dataset, tasks):
        environment = config.get("environment")
        dockerfile = dataset / task / "environment" / "Dockerfile"
        if (isinstance(environment, dict) and "docker_image" in environment) or not dockerfile.is_file():
            continue  # runs on its prebuilt image (task_images), or Harbor's own environment rules apply
        try:
            lines = dockerfile.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValidationError(f"task {task}: environment/Dockerfile", f"must be readable UTF-8 ({exc})") from None
        refs: set[ImageRef] = set()
        for line in lines:
            match = FROM_RE.match(line)
            if match and match.group(1) != BASE_PLACEHOLDER:
                # parse_ref is the one grammar: a tag, an implied registry, ${ARG}, scratch or a stage name is refused.
                refs.add(parse_ref(match.group(1), task_base_field(task)))
        if refs:
            found[task] = tuple(sorted(refs, key=lambda r: r.ref))
    return found
