"""A graded run leaves the infra host for sealing: exported by the benchseal user, imported by the job.

The worker service grades and never signs (it has no OIDC token). benchmark.yml's ``seal`` job
(``permissions: id-token: write``) gets the graded run through one narrow sudo-admitted wrapper
(``deploy/benchseal-export``: one run id on stdin) that runs ``benchseal infra export RUN_ID``,
and seals it with ``benchseal evidence --from-export``.

What travels is exactly what sealing reads, as an uncompressed tar on stdout:

* ``run.json`` (the run's state and the accepted payload), ``grading.json``; for a scored run
  ``comparison.json`` (its comparison with the repository's previous release, from the queue's history);
* ``artifacts/evidence/**`` (the trial evidence ``evidence-SHA256SUMS`` covers): regular files
  and directories only (symlinks are never followed nor exported, as the evidence stage skips them).

run.json, grading.json and comparison.json are written from the queue database (the truth), not read from the
run dir. Both ends fail closed: export refuses a run that is not terminal or has no grading, or
more than ``MAX_EXPORT_BYTES``, or an evidence file whose name ``fsutil.name_problem`` refuses
(the worker's evidence copy leaves such names behind, so one here was put there by something
else), all before the first byte is written; a trial pack from another host that holds such a name
is left out, and said, as any refused pack is.
Import accepts only those names (plain relative names: no absolute paths, no ``..``, no control,
format or separator characters, no undecodable bytes, parts of at most 255 bytes; no links or
devices, no duplicates, no file with a member under it, the same size bound) and requires
``run.json`` and ``grading.json`` to name the run the caller expects; it unpacks into a staging
directory next to the new or empty destination and renames it into place once all of that holds,
so a refused export leaves the destination as it was.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from pipeline.core.contracts import Grading, RunStatus, load_model, validate_run_id
from pipeline.core.documents import Comparison, load_document
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import NameTree, NotRegularFile, canonical_json, name_problem, open_regular, staged_dir
from pipeline.infra.queue.sql import TERMINAL_STATES, Queue, RunRecord
from pipeline.infra.worker.trial_evidence import check_trial_name, read_trial_pack

MAX_EXPORT_BYTES = 512 * 1024 * 1024
MAX_MEMBERS = 100_000
TOP_FILES = ("run.json", "grading.json")
COMPARISON = "comparison.json"  # optional: only a scored run recorded in the history has one
EVIDENCE = "artifacts/evidence"
TERMINAL = TERMINAL_STATES  # the run states an export may hold (pipeline.infra.queue.records)
log = logging.getLogger("benchseal.export")


def _evidence_files(run_dir: Path) -> Iterator[tuple[str, Path]]:
    evidence = run_dir / EVIDENCE
    if evidence.is_symlink() or (run_dir / "artifacts").is_symlink():
        raise CheckFailed(f"{evidence}: is a symlink")
    if not evidence.is_dir():
        return
    # One walk that never enters a linked directory (os.walk without followlinks lists it, never descends it): the
    # per-file check of every parent it replaces cost 5 s of a 164-task run's 8.5 s export (docs/performance.md).
    found: list[Path] = []
    for top, _dirs, names in os.walk(evidence):
        found.extend(Path(top, name) for name in names)
    for path in sorted(found):
        # Symlinks (Harbor's trial dirs may hold some) are not evidence: evidence-SHA256SUMS skips them too.
        if path.is_symlink() or not path.is_file():
            continue
        name = path.relative_to(run_dir).as_posix()
        problem = name_problem(name)
        if problem:
            raise CheckFailed(f"{name!r}: {problem}; an export holds plain relative names only")
        yield name, path


def packs_not_here(queue: Queue, run_id: str, run_dir: Path) -> dict[str, bytes]:
    """trial name -> the pack in the queue, for each trial whose dir this host's evidence lacks (it ran
    on another host and another host graded the run). Empty for a queue on one host."""
    if not queue.spans_hosts:
        return {}
    harbor = run_dir / EVIDENCE / "harbor"
    packs: dict[str, bytes] = {}
    for row in queue.trials(run_id):
        if (harbor / row.trial_name).is_dir():
            continue
        data = queue.trial_evidence(run_id, row.idx)
        if data is not None:
            packs[row.trial_name] = data
    return packs


def trial_pack_files(trial_packs: Mapping[str, bytes], present: set[str], budget: int) -> list[tuple[str, bytes]]:
    """The evidence files of the trials whose dir is not under ``present`` (names in the export), from
    the packs the hosts that ran them recorded in the queue (a pack that is refused is left out, and said).
    More than ``budget`` bytes unpacked is refused before the rest is read."""
    files: list[tuple[str, bytes]] = []
    for trial_name, data in sorted(trial_packs.items()):
        prefix = f"{EVIDENCE}/harbor/{trial_name}/"
        if any(name.startswith(prefix) for name in present):
            continue
        try:
            check_trial_name(trial_name)
            if prefix[:-1] in present:
                raise CheckFailed(f"{prefix[:-1]} is a file here")
            members = [(prefix + name, content) for name, content in read_trial_pack(data) if content is not None]
            for name, _ in members:
                problem = name_problem(name)
                if problem:
                    raise CheckFailed(f"{name!r} {problem}")
        except CheckFailed as exc:
            log.error("trial %s: its packed dir is left out of the export: %s", trial_name, exc)
            continue
        files.extend(members)
        budget -= sum(len(content) for _, content in members)
        if budget < 0:
            raise CheckFailed(f"the trials' packed dirs exceed the export limit ({MAX_EXPORT_BYTES} bytes)")
    return files


def export_run(record: RunRecord, run_dir: Path, out: IO[bytes], trial_packs: Mapping[str, bytes] | None = None,
               comparison: Comparison | None = None) -> int:
    """Write the graded run ``record`` (files under ``run_dir``) to ``out`` as a tar; return its content bytes.

    run.json and grading.json come from the queue database; the evidence files from the run dir,
    and, for trials whose dir is not there (they ran on another host, and this host did not grade
    the run), from ``trial_packs`` (trial name -> the pack recorded in the queue). ``comparison``: the
    queue's record of the run's comparison with the previous release (``Queue.comparison``).
    """
    run_id = validate_run_id(record.run_id)
    if record.state not in TERMINAL or record.grading is None:
        raise CheckFailed(f"run {run_id} is {record.state}, not terminal: it has not been graded yet")
    if record.grading.run_id != run_id or record.grading.status != record.state:
        raise CheckFailed(f"run {run_id}: its grading is for {record.grading.run_id} ({record.grading.status})")
    documents = {
        "run.json": canonical_json(record.status().model_dump(mode="json")).encode(),
        "grading.json": canonical_json(record.grading.model_dump(mode="json")).encode(),
    }
    if comparison is not None:
        documents[COMPARISON] = canonical_json(comparison.to_json_dict()).encode()
    files = list(_evidence_files(run_dir))
    local = sum(len(data) for data in documents.values()) + sum(path.stat().st_size for _, path in files)
    packed = trial_pack_files(trial_packs or {}, {name for name, _ in files}, MAX_EXPORT_BYTES - local)
    count = len(files) + len(packed) + len(documents)
    total = local + sum(len(data) for _, data in packed)
    if total > MAX_EXPORT_BYTES or count > MAX_MEMBERS:
        raise CheckFailed(f"run {run_id}: {count} files, {total} bytes: more than the export limit "
                          f"({MAX_MEMBERS} files, {MAX_EXPORT_BYTES} bytes)")
    tree = NameTree()  # the reader's own check, before the first byte is written
    for name in [*documents, *(name for name, _ in packed), *(name for name, _ in files)]:
        problem = tree.problem(name)
        if problem:
            raise CheckFailed(f"run {run_id}: export member {name!r} {problem}")
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [*documents.items(), *packed]:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
        for name, path in files:
            # A file swapped for a symlink or FIFO after the listing is refused, never followed.
            try:
                handle, info = open_regular(path)
            except NotRegularFile:
                raise CheckFailed(f"{path}: not a regular file") from None
            except OSError as exc:
                raise CheckFailed(f"{path}: cannot be exported ({exc.strerror})") from None
            with handle:
                tar.addfile(_info(name, info.st_size), handle)
    return total


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise CheckFailed(f"{path}: missing; the run is not graded") from None
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"{path}: not readable JSON ({exc})") from None


def _member_problem(tree: NameTree, member: tarfile.TarInfo) -> str | None:
    """Why the export may not hold ``member``, or None."""
    name = member.name
    if not member.isfile():
        return f"is not a regular file (type {member.type!r})"
    problem = name_problem(name)
    if name not in (*TOP_FILES, COMPARISON) and (problem or not name.startswith(EVIDENCE + "/")):
        return (f"is not run.json, grading.json, {COMPARISON} or under {EVIDENCE}/"
                + (f": the name {problem}" if problem else ""))
    return tree.problem(name)


def import_run(source: IO[bytes], dest: Path, run_id: str) -> Path:
    """Unpack an export into the empty (or new) directory ``dest``; check it is ``run_id``'s graded run.

    Everything is unpacked and checked in a staging directory next to ``dest``, renamed to ``dest``
    at the end: on any refusal ``dest`` is left as it was (absent, or empty)."""
    validate_run_id(run_id, "--run-id")
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise ValidationError("RUN_DIR", "must be a new or empty directory", str(dest))
    with staged_dir(dest) as staging:
        _unpack(source, staging, run_id)
    return dest


def _unpack(source: IO[bytes], dest: Path, run_id: str) -> None:
    tree = NameTree()
    seen: set[str] = set()
    made: set[Path] = set()  # each directory made once, not once per member (a 164-task run has thousands)
    total = 0
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                name = member.name
                problem = _member_problem(tree, member)
                if problem:
                    raise CheckFailed(f"export: {name!r} {problem}")
                seen.add(name)
                total += member.size
                if total > MAX_EXPORT_BYTES or len(seen) > MAX_MEMBERS:
                    raise CheckFailed(f"export: more than {MAX_MEMBERS} files or {MAX_EXPORT_BYTES} bytes")
                handle = tar.extractfile(member)
                if handle is None:  # pragma: no cover - isfile() members always have data
                    raise CheckFailed(f"export: {name!r} has no data")
                target = dest / name
                try:
                    if target.parent not in made:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        made.add(target.parent)
                    # O_EXCL | O_NOFOLLOW: nothing already there is written through (NameTree rules it out too).
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                except OSError as exc:
                    raise CheckFailed(f"export: {name!r} cannot be written ({exc.strerror})") from None
                with os.fdopen(fd, "wb") as out:
                    remaining = member.size
                    while remaining:
                        chunk = handle.read(min(remaining, 1 << 20))
                        if not chunk:
                            raise CheckFailed(f"export: {name!r} is truncated")
                        out.write(chunk)
                        remaining -= len(chunk)
    except tarfile.TarError as exc:
        raise CheckFailed(f"export: not a valid tar stream ({exc})") from None
    except (EOFError, zlib.error, OSError) as exc:
        raise CheckFailed(f"export: cannot be read ({type(exc).__name__}: {exc})") from None
    for name in TOP_FILES:
        if name not in seen:
            raise CheckFailed(f"export: {name} is missing; the run is not graded")
    status = load_model(RunStatus, _json(dest / "run.json"), "run.json")
    grading = load_model(Grading, _json(dest / "grading.json"), "grading.json")
    if status.run_id != run_id or grading.run_id != run_id:
        raise CheckFailed(f"export: run.json/grading.json are for {status.run_id}/{grading.run_id}, not the "
                          f"expected {run_id}")
    if status.state not in TERMINAL or grading.status != status.state:
        raise CheckFailed(f"export: run {run_id} is {status.state} with grading {grading.status}: not a graded "
                          f"terminal run")
    if COMPARISON in seen:
        if grading.status != "SUCCEEDED":
            raise CheckFailed(f"export: run {run_id} is {grading.status} but has a {COMPARISON}: only a scored run has one")
        load_document(Comparison, dest / COMPARISON)


def export_bytes(record: RunRecord, run_dir: Path, trial_packs: Mapping[str, bytes] | None = None,
                 comparison: Comparison | None = None) -> bytes:
    """The export in memory (tests)."""
    buffer = io.BytesIO()
    export_run(record, run_dir, buffer, trial_packs, comparison)
    return buffer.getvalue()
