"""Leaving the sandbox as the worker found it (issue 36.5): a sealed run's staged copies removed, and task
images pruned by one rule, never an image a run in flight uses.

The rule (docs/datasets.md "Pruning"), applied after each piece of work (``after_work``):

1. A sealed run's staged copies on this host go: ``<run dir>/dataset`` and ``<run dir>/batches/*/suite`` (the
   evidence, the trials' dirs and logs stay), whether this worker sealed it or another host did (the run's use
   record, written from its first batch here, says this host holds copies of it).
2. Task images are the images the worker itself put into the sandbox engine for a run's tasks: each
   task's prebuilt ``docker_image`` and registry base (pulled by digest, ``task_images``) and each image it
   built from a task's Dockerfile (``images.prebuild_task_images``). Each batch records the ids it used in
   ``<state>/cache/task-image-use/<run id>`` (``task_image_use``), with the time it last used each; benchseal's
   base is never pruned. Runner images (the one a run names, pulled by digest and put into the sandbox by id)
   follow the same rule in records of their own, ``<state>/cache/runner-image-use`` (``runner_image_use``),
   with their own count (``WorkerConfig.keep_runner_images``): each agent release brings a runner of its own,
   so without this the sandbox engine grew by one runner per release, without bound.
3. An image named by the record of a run that is not sealed in the queue (QUEUED, CLAIMED, RUNNING, or a run
   the queue does not know, until its record is stale: 5.) is kept, whatever else names it. Of the others,
   the ``keep`` most recently used (``WorkerConfig.keep_task_images``, default ``KEEP_TASK_IMAGES``) are kept
   and the rest removed by id, without force: an image a container still uses, or another image builds on,
   stays for a later prune.
4. The host engine's copies: a task image or registry base is pulled there first (``task_images``). Before each
   such pull ``TaskImageUse.host_pull`` records in ``.host`` whether the image (by id) was already there and
   which reference the pull adds; an image that was there before is never the worker's to remove. The others
   go by the same ranking (kept while a run in flight names them or among the ``keep`` most recently used),
   by id without force, and only while every name the image has is one the worker's own pulls gave it (no
   tag, no other digest: an operator's name on it keeps it).
5. Records do not outlive their use: a record whose run is sealed or unknown to the queue, untouched for
   ``STALE_RECORD_SECONDS``, is folded into ``.released`` ({image id: last used} of no run in flight) and
   removed, so its images stay known and fall under the ranking; a run the queue holds in flight keeps its
   record whatever its age.

Nothing is found by name, tag or label (anything that can build through the sandbox can set those): only by
the ids in the worker's own records, whose directory nobody else can write, read against the queue's states.
A batch holds a shared lock on the records from before it loads or reuses an image until its record names
it; a prune holds the lock exclusively, so it never sees a run in flight that has picked an image but not
yet recorded it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import docker.errors

from pipeline.core import paths
from pipeline.core.contracts import RunState
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.infra.queue.interface import Queue
from pipeline.infra.queue.records import TERMINAL_STATES
from pipeline.infra.queue.sql import open_queue
from pipeline.infra.worker.config import KEEP_TASK_IMAGES, InfraFailure, WorkerConfig
from pipeline.infra.worker.containers import _docker, _sandbox

_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")
_RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_RECORD = 1 << 20
_WRITE_LOCK = ".write-lock"  # held briefly by each record update (the prune holds ".lock" exclusively instead)
_BASES = ".bases"  # {image id: first recorded}: benchseal's base(s) the worker built task images FROM
_RELEASED = ".released"  # {image id: last used}: folded from records of runs sealed or unknown, long untouched
_HOST = ".host"  # {image id: {"present_before": bool, "refs": [...]}}: the host engine's copies (host_pull)
_REF_RE = re.compile(r"[^\s@]{1,512}@sha256:[0-9a-f]{64}")
# A record of a run the queue reports sealed, or does not know (a test's, another queue's, a reset queue's),
# is folded into .released once untouched this long: a run's batches rewrite its record, and a state home
# serves one queue, so a week without a write is no run in flight here.
STALE_RECORD_SECONDS = 7 * 24 * 3600

log = logging.getLogger("benchseal.worker")


def use_records() -> Path:
    """``<state home>/cache/task-image-use``: one file per run, {image id: last used (epoch seconds)}."""
    return paths.home() / "cache" / "task-image-use"


def runner_use_records() -> Path:
    """``<state home>/cache/runner-image-use``: the runner images' records, in the task images' format."""
    return paths.home() / "cache" / "runner-image-use"


def _private_dir(records: Path) -> Path:
    """``records`` created if needed; CheckFailed unless this user owns it and nobody else can write it."""
    records.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = records.stat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise CheckFailed(f"{records}: the task image use records must be a directory owned by uid {os.geteuid()} "
                          f"and writable by nobody else (owner {info.st_uid}, mode {info.st_mode & 0o7777:o})")
    return records


@contextmanager
def _locked(records: Path, how: int, name: str = ".lock") -> Iterator[None]:
    # flock locks an open file description: two opens conflict across threads of one process as across processes.
    fd = os.open(records / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)  # releases the lock


def _record_path(records: Path, run_id: str) -> Path:
    if not _RUN_RE.fullmatch(run_id):
        raise CheckFailed(f"run id {run_id!r} cannot name a task image use record")
    return records / run_id


def _load(path: Path) -> tuple[Any, float]:
    """A record's JSON and its mtime; CheckFailed unless it is a regular file of this user alone."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise CheckFailed(f"{path}: not a task image use record of this worker")
        raw = handle.read(_MAX_RECORD + 1)
    try:
        return (json.loads(raw) if len(raw) <= _MAX_RECORD else None), info.st_mtime
    except ValueError:
        return None, info.st_mtime


def _read(path: Path) -> dict[str, float]:
    """A use record's {image id: last used}."""
    return _read_dated(path)[0]


def _read_dated(path: Path) -> tuple[dict[str, float], float]:
    """A use record's {image id: last used} and when it was last written."""
    data, mtime = _load(path)
    if not isinstance(data, dict) or not all(isinstance(k, str) and _ID_RE.fullmatch(k)
                                             and isinstance(v, int | float) for k, v in data.items()):
        raise CheckFailed(f"{path}: not a task image use record ({{image id: last used}})")
    return {k: float(v) for k, v in data.items()}, mtime


class HostPull(NamedTuple):
    """An image the worker pulled on the host engine: whether that engine had it (by id) before the worker's
    first pull of it, and the references the worker's pulls added to it (its RepoDigests)."""

    present_before: bool
    refs: tuple[str, ...]


def _read_host(path: Path) -> dict[str, HostPull]:
    """The ``.host`` record ({image id: {"present_before": bool, "refs": [name@sha256, ...]}}), or {} if absent."""
    if not os.path.lexists(path):
        return {}
    data, _ = _load(path)
    found: dict[str, HostPull] = {}
    for key, value in (data.items() if isinstance(data, dict) else [(None, None)]):
        refs = value.get("refs") if isinstance(value, dict) else None
        if not (isinstance(key, str) and _ID_RE.fullmatch(key) and isinstance(value, dict)
                and set(value) == {"present_before", "refs"} and isinstance(value["present_before"], bool)
                and isinstance(refs, list) and all(isinstance(r, str) and _REF_RE.fullmatch(r) for r in refs)):
            raise CheckFailed(f"{path}: not the host engine's pull record "
                              '({image id: {"present_before": bool, "refs": [name@sha256:<hex>]}})')
        found[key] = HostPull(value["present_before"], tuple(refs))
    return found


def _write_host(path: Path, pulls: dict[str, HostPull]) -> None:
    atomic_write_text(path, json.dumps({k: {"present_before": v.present_before, "refs": sorted(v.refs)}
                                        for k, v in pulls.items()}, sort_keys=True) + "\n", mode=0o600)


def _write(path: Path, used: dict[str, float]) -> None:
    atomic_write_text(path, json.dumps(used, sort_keys=True) + "\n", mode=0o600)


class TaskImageUse:
    """What a batch tells the records while it holds their shared lock (``task_image_use``)."""

    def __init__(self, records: Path, run_id: str) -> None:
        self._records = records
        self._path = _record_path(records, run_id)
        self._run_id = run_id

    def images(self, image_ids: Iterable[str]) -> None:
        """Add task image ids to the run's record, now as their last use, before the batch uses them."""
        ids = self._checked(image_ids)
        # Two batches of one run may record at once (both under the shared lock): one read-modify-write at a time.
        with _locked(self._records, fcntl.LOCK_EX, _WRITE_LOCK):
            exists = os.path.lexists(self._path)
            if ids or not exists:
                current = _read(self._path) if exists else {}
                current.update(dict.fromkeys(ids, time.time()))
                _write(self._path, current)

    def bases(self, image_ids: Iterable[str]) -> None:
        """Ids a task image may be built FROM (benchseal's base): never pruned here, and where removing a built
        image's intermediate images stops."""
        ids = self._checked(image_ids)
        path = self._records / _BASES
        with _locked(self._records, fcntl.LOCK_EX, _WRITE_LOCK):
            current = _read(path) if os.path.lexists(path) else {}
            if not set(ids) <= set(current):
                current.update(dict.fromkeys(ids, time.time()))
                _write(path, current)

    def host_pull(self, host: Any, image_id: str, ref: str) -> None:
        """Called just before the worker pulls ``ref`` (config ``image_id``) on the host engine: records whether
        the engine had that image before and, if ``ref`` is not yet among its names, that the pull adds it.
        Checked and written under one lock, so a second batch pulling the same image never mistakes the
        first batch's pull for an image that was there before."""
        self._checked([image_id])
        if not _REF_RE.fullmatch(ref):
            raise CheckFailed(f"run {self._run_id}: {ref!r} is not name@sha256:<64 hex>")
        path = self._records / _HOST
        with _locked(self._records, fcntl.LOCK_EX, _WRITE_LOCK):
            pulls = _read_host(path)
            try:
                names = host.api.inspect_image(image_id).get("RepoDigests") or []
                present = True
            except docker.errors.ImageNotFound:
                names, present = [], False
            except docker.errors.APIError as exc:
                raise InfraFailure(f"inspecting {image_id} on the host engine failed: {exc.explanation or exc}") from None
            # Absent now, this pull is the worker's whatever an older entry said (that image has since gone).
            entry = (pulls.get(image_id) if present else None) or HostPull(present_before=present, refs=())
            if ref not in names and ref not in entry.refs:  # this pull gives the image that name
                entry = entry._replace(refs=(*entry.refs, ref))
            if pulls.get(image_id) != entry:
                pulls[image_id] = entry
                _write_host(path, pulls)

    def _checked(self, image_ids: Iterable[str]) -> list[str]:
        ids = sorted(set(image_ids))
        bad = [i for i in ids if not _ID_RE.fullmatch(i)]
        if bad:
            raise CheckFailed(f"run {self._run_id}: image ids {bad} are not sha256:<64 hex>")
        return ids


@contextmanager
def task_image_use(run_id: str, records: Path | None = None) -> Iterator[TaskImageUse]:
    """Hold the records' shared lock while a batch loads, reuses or builds its task images (a prune waits)."""
    root = _private_dir(records or use_records())
    use = TaskImageUse(root, run_id)
    with _locked(root, fcntl.LOCK_SH):
        use.images([])  # the record exists from the first batch: this host holds staged copies of the run
        yield use


def runner_image_use(run_id: str) -> AbstractContextManager[TaskImageUse]:
    """``task_image_use`` on the runner images' records: held while a batch pulls or reuses its runner."""
    return task_image_use(run_id, runner_use_records())


def note_staged(run_id: str, records: Path | None = None) -> None:
    """``run_id``'s record created if absent: this host holds a staged copy of it (planning stages one before any
    batch), which a prune removes once the run is sealed, here or elsewhere."""
    with task_image_use(run_id, records):
        pass


def _state(queue: Queue, run_id: str) -> str:
    """"in flight" (any state the queue holds but a terminal one), "sealed", or "unknown" (not this queue's run)."""
    try:
        state: RunState = queue.get_run(run_id).state
    except ValidationError:
        return "unknown"
    return "sealed" if state in TERMINAL_STATES else "in flight"


class Pruned(NamedTuple):
    """The ids one prune removed from each engine."""

    sandbox: list[str]
    host: list[str]


def prune_task_images(queue: Queue, sandboxed: Any, keep: int = KEEP_TASK_IMAGES,
                      records: Path | None = None, host: Any | None = None) -> Pruned:
    """Apply the rule (module docstring) once to the images of one set of ``records`` (default: the task images'),
    in ``sandboxed`` and, when given, the ``host`` engine's copies."""
    if keep < 0:
        raise CheckFailed(f"the number of images kept must be 0 or more, not {keep}")
    root = _private_dir(records or use_records())
    with _locked(root, fcntl.LOCK_EX):
        now = time.time()
        protected: set[str] = set()
        done: dict[str, tuple[str, dict[str, float]]] = {}  # run id: (state, record) of runs not in flight
        stale: set[str] = set()
        for path in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
            used, written = _read_dated(path)  # an untrusted record stops the prune: it could be protecting an image
            state = _state(queue, path.name)
            if state == "in flight":
                protected.update(used)  # whatever its age
                continue
            if now - max([written, *used.values()]) >= STALE_RECORD_SECONDS:
                stale.add(path.name)
            elif state == "unknown":
                protected.update(used)  # nothing says it is done: kept until it is stale
                continue
            done[path.name] = (state, used)
        released_path = root / _RELEASED
        released = _read(released_path) if os.path.lexists(released_path) else {}
        last: dict[str, float] = {}
        for used in (released, *(u for _, u in done.values())):
            for image_id, when in used.items():
                if image_id not in protected:
                    last[image_id] = max(when, last.get(image_id, 0.0))
        ranked = sorted(last, key=lambda i: (-last[i], i))
        bases_path = root / _BASES
        bases = set(_read(bases_path)) if os.path.lexists(bases_path) else set()
        removed, gone = _remove(sandboxed, ranked[keep:], frozenset(protected | set(last) | bases))
        host_removed = [] if host is None else _prune_host(host, root / _HOST,
                                                          frozenset(protected | bases | set(ranked[:keep])))
        folded = {i: t for i, t in released.items() if i not in gone}
        for run_id, (state, used) in done.items():
            if state == "sealed":  # an unknown run's dir is not this queue's to touch
                try:
                    remove_staged(queue.run_dir(run_id))  # sealed, perhaps by another host: its copies here go
                except OSError as exc:
                    log.warning("run %s: removing its staged copies failed: %s", run_id, exc)
                    continue  # its record stays: tried again by the next prune
            left = {i: t for i, t in used.items() if i not in gone}
            if run_id in stale:
                for image_id, when in left.items():  # its images stay known, ranked with the rest
                    folded[image_id] = max(when, folded.get(image_id, 0.0))
                os.unlink(root / run_id)
            elif not left:
                os.unlink(root / run_id)
            elif left != used:
                _write(root / run_id, left)
        if folded != released:
            _write(released_path, folded)
        return Pruned(removed, host_removed)


def _prune_host(host: Any, path: Path, kept: frozenset[str]) -> list[str]:
    """The host engine's copies the worker pulled (``.host``), but for ``kept``: each removed by id, without
    force, while every name it has is one the worker's pulls gave it; returns the ids removed. An entry goes
    with its image (removed here or by anyone): a later pull records afresh."""
    pulls = _read_host(path)
    removed: list[str] = []
    left = dict(pulls)
    for image_id, pull in sorted(pulls.items()):
        try:
            info = host.api.inspect_image(image_id)
            if image_id in kept or pull.present_before:
                continue  # in use or warm; or the operator's: never the worker's to remove
            foreign = [*(info.get("RepoTags") or []), *(set(info.get("RepoDigests") or []) - set(pull.refs))]
            if foreign:  # a tag or digest the worker's pulls did not give it: removing by id would take them
                log.info("host image %s kept: also named %s", image_id, ", ".join(sorted(foreign)))
                continue
            host.images.remove(image_id, force=False, noprune=True)
            removed.append(image_id)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:  # a container uses it, or the engine refused: a later prune retries
            log.info("host image %s kept: %s", image_id, exc.explanation or exc)
            continue
        del left[image_id]
    if left != pulls:
        _write_host(path, left)
    return removed


def _remove(client: Any, image_ids: list[str], stops: frozenset[str]) -> tuple[list[str], set[str]]:
    """Remove each image by id (no force); returns (removed, removed or already absent). An image in use or
    with children is kept; a second pass retries those (a removed task image frees its registry base)."""
    removed: list[str] = []
    gone: set[str] = set()
    pending = list(image_ids)
    for _ in range(2):
        kept = []
        for image_id in pending:
            try:
                parent = client.api.inspect_image(image_id).get("Parent") or ""
                # noprune: the engine would also delete untagged parents, the loaded base among them.
                client.images.remove(image_id, force=False, noprune=True)
                removed.append(image_id)
                gone.add(image_id)
            except docker.errors.ImageNotFound:
                gone.add(image_id)
                continue
            except docker.errors.APIError as exc:
                kept.append(image_id)
                log.info("task image %s kept: %s", image_id, exc.explanation or exc)
                continue
            _remove_build_steps(client, parent, stops)
        if not kept or len(kept) == len(pending):
            break
        pending = kept
    return removed, gone


def _remove_build_steps(client: Any, parent: str, stops: frozenset[str]) -> None:
    """The intermediate images the legacy builder left as a removed task image's parents, up to its base (an id
    in ``stops``, or any image with a name, or one another image or container still uses: kept)."""
    while parent and parent not in stops:
        try:
            info = client.api.inspect_image(parent)
            if info.get("RepoTags") or info.get("RepoDigests"):
                return
            client.images.remove(parent, force=False, noprune=True)
        except docker.errors.APIError:  # gone, or still a parent or in use: the rest of the chain stays
            return
        parent = info.get("Parent") or ""


def remove_staged(run_dir: Path) -> list[Path]:
    """A sealed run's staged copies: ``<run dir>/dataset`` and ``<run dir>/batches/*/suite``; returns those removed."""
    targets = [run_dir / "dataset", *sorted((run_dir / "batches").glob("*/suite"))]
    found = [t for t in targets if t.is_dir() and not t.is_symlink()]
    for target in found:
        shutil.rmtree(target)
    return found


def after_work(config: WorkerConfig, sealed: str | None) -> None:
    """The rule, after each piece of work: the run this worker just ``sealed`` (if any) loses its staged copies,
    then one prune (which also clears the staged copies of runs other hosts sealed). Best effort: a failure is
    logged and the next piece of work prunes again (nothing here changes a run's outcome)."""
    try:
        with open_queue(config.db, url_file=config.queue_url_file) as queue:
            if sealed is not None:
                remove_staged(queue.run_dir(sealed))
            kinds = [(kind, records, keep) for kind, records, keep in (
                ("task", use_records(), config.keep_task_images),
                ("runner", runner_use_records(), config.keep_runner_images))
                if records.is_dir() and any(not p.name.startswith(".") or p.name in (_RELEASED, _HOST)
                                            for p in records.iterdir())]
            if not kinds:
                return  # no image recorded: no engine to ask
            client = _sandbox(config)
            host = None
            try:
                if any((records / _HOST).exists() for _, records, _ in kinds):
                    try:
                        host = _docker()
                    except InfraFailure as exc:  # the sandbox's prune goes on; the host's waits for the next
                        log.warning("pruning the host engine's images skipped: %s", exc)
                pruned = [(kind, prune_task_images(queue, client, keep, records=records, host=host))
                          for kind, records, keep in kinds]
            finally:
                client.close()
                if host is not None:
                    host.close()
        for kind, each in pruned:
            for removed, engine in ((each.sandbox, "sandbox"), (each.host, "host")):
                if removed:
                    log.info("pruned %d %s images from the %s engine", len(removed), kind, engine)
    except Exception as exc:
        log.warning("pruning failed: %s: %s", type(exc).__name__, exc)
