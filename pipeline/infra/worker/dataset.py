"""A run's dataset, staged by its pinned content digest (issue 36).

A suite in the infra policy names its dataset: a directory under the worker's suites root
(``--suites-dir``) and that directory's content digest (``pipeline.core.datasets``). For a run the
worker copies exactly the files the digest covers into ``<run dir>/dataset`` (written beside it,
then renamed into place), re-hashes the copy (``verify_staged``) and plans and renders the run's
tasks from that copy only: a task the digest does not cover never reaches a trial, and a source,
cache or copy whose bytes differ is refused in one line (``DatasetRefused`` /
``DatasetDigestMismatch``) before anything runs. A later batch on the same host re-hashes the
staged copy instead of trusting it. The digest a batch verified travels with each of its trials
(``RecordedTrial.dataset_digest``) into the grading, summary.json and the history key.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.datasets import dataset_entries, digest_entries, verify_staged
from pipeline.core.digests import ImageRef
from pipeline.core.errors import DatasetDigestMismatch, DatasetRefused
from pipeline.infra.intake.policy import DatasetPolicy, InfraPolicy
from pipeline.infra.worker.task_images import check_task_bases, check_task_images

STAGED = "dataset"  # <run dir>/dataset: this host's verified copy of the run's dataset
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StagedDataset:
    path: Path
    digest: str
    # {task: its prebuilt image}, each pinned by digest from a registry the suite admits (task_images).
    task_images: dict[str, ImageRef]
    # {task: the registry images its Dockerfile builds FROM}, pinned and admitted the same way (task_bases).
    task_bases: dict[str, tuple[ImageRef, ...]] = field(default_factory=dict)


def _field(suite: str) -> str:
    return f"suites.{suite}.dataset"


def check_source(suite: str, dataset: DatasetPolicy, suites_root: Path) -> Path:
    """The suite's dataset directory under ``suites_root``, refused unless its content digest is the pinned one."""
    source = suites_root / dataset.path
    try:
        actual = digest_entries(dataset_entries(source))
    except DatasetRefused as exc:
        inside = "" if exc.path == str(source) else f": {exc.path}"
        raise DatasetRefused(f"{_field(suite)}: {source}{inside}", exc.rule) from None
    if actual != dataset.digest:
        raise DatasetDigestMismatch(_field(suite), f"the directory {source} has content digest {actual}, not the "
                                    f"pinned {dataset.digest} (the policy's digest must be what `benchseal dataset "
                                    "digest` prints for it)")
    return source


def check_policy_datasets(policy: InfraPolicy, suites_root: Path) -> None:
    """Every suite's dataset directory matches its pinned digest (the worker's check before it takes any work)."""
    for name, suite in sorted(policy.suites.items()):
        source = check_source(name, suite.dataset, suites_root)
        check_task_images(policy, name, source)
        check_task_bases(policy, name, source)


def stage_dataset(policy: InfraPolicy, suite: str, suites_root: Path, run_dir: Path) -> StagedDataset:
    """``run_dir/dataset``: the suite's pinned dataset, copied here once and re-hashed on every call."""
    dataset = policy.dataset(suite)
    target = run_dir / STAGED
    if not os.path.lexists(target):
        source = check_source(suite, dataset, suites_root)
        # Only the entries the digest covers are copied, each opened without following links.
        entries = dataset_entries(source)
        scratch = run_dir / f".{STAGED}-{uuid.uuid4().hex}"
        try:
            made: set[Path] = set()  # each directory made once, not once per file (a dataset has thousands)
            for entry in entries:
                _copy_file(source / entry.path, scratch, entry.path, entry.executable, made)
            # Readable by the runner (another uid in the sandbox) whatever the worker's umask (its unit's is 077):
            # directories as files are, 755, set explicitly on every directory the copy made.
            for directory in sorted(made):
                os.chmod(directory, 0o755)  # noqa: S103 - read by the runner's uid, as the files are
            verify_staged(scratch, dataset.digest)
            try:
                os.rename(scratch, target)
            except OSError:
                if not os.path.lexists(target):
                    raise
                # Another batch of the run staged it first (two workers sharing this run dir): re-hashed below.
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    try:
        verify_staged(target, dataset.digest)  # the copy at hand, re-hashed: never trusted for what it claims
    except DatasetRefused as exc:
        inside = "" if exc.path == str(target) else f": {exc.path}"
        raise type(exc)(f"{_field(suite)}: staged copy {target}{inside}", exc.rule) from None
    # A task image by tag, or from a registry the suite does not admit: refused before anything runs.
    return StagedDataset(path=target, digest=dataset.digest, task_images=check_task_images(policy, suite, target),
                         task_bases=check_task_bases(policy, suite, target))


def _copy_file(source: Path, root: Path, rel: str, executable: bool, made: set[Path]) -> None:
    """Copy one entry to ``root/rel``; ``made``: the directories under ``root`` (and ``root``) made so far."""
    target = root / rel
    if target.parent not in made:
        target.parent.mkdir(parents=True, exist_ok=True)
        made.update((target.parent, *(d for d in target.parent.parents if d.is_relative_to(root))))
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise DatasetRefused(str(source), "is no longer a regular file")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o755 if executable else 0o644)
        with os.fdopen(out, "wb") as writer:
            while chunk := reader.read(_CHUNK):
                writer.write(chunk)
    os.chmod(target, 0o755 if executable else 0o644)  # the umask must not change the executable bit
