"""The images a batch runs on: the runner and the base pulled BY DIGEST on the host engine (local
RepoDigests must list exactly that reference) and handed to the sandbox engine by id
(``sandbox_image``), the task environments' base (``resolve_base_ref``), the suite rendered onto that
base (``render_suite``: ``FROM benchseal-base`` -> the base) and its task images prebuilt once, by
content, and reused only by the id the worker recorded (``prebuild_task_images``). The images' signatures are checked by the claim loop
(``pipeline.infra.worker.loop.require_signed_images``), then the agent the runner carries
(``check_runner_agent``)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import docker
import docker.errors

from pipeline.core import paths, strictjson
from pipeline.core.contracts import AgentArtifact, DispatchPayload, load_model
from pipeline.core.datasets import BASE_PLACEHOLDER as BASE_PLACEHOLDER  # re-exported (the claim loop, tests)
from pipeline.core.datasets import FROM_RE
from pipeline.core.digests import ImageRef, parse_ref, require_repo_digest
from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.core.errors import CheckFailed, ValidationError, escape_text
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.registry_auth import docker_auth_config
from pipeline.imaging.agentlayers import AGENT_LABEL
from pipeline.imaging.base import ensure_base
from pipeline.imaging.names import PREFIX_ENV, ImageNames, configured_names
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.worker.config import ImageRefused, InfraFailure, WorkerConfig

log = logging.getLogger("benchseal.worker")


def sandbox_image(host: Any, sandboxed: Any, ref: ImageRef) -> str:
    """The one place an admitted image crosses into the sandbox: ``ref`` was pulled by digest on the
    host (RepoDigests checked) and its signatures checked there; the sandbox gets the same image by
    id (the sha256 of its config, which pins every layer) and everything there names it by that id."""
    image_id = pull_by_digest(host, ref)
    return sandbox.copy_image(host, sandboxed, image_id)


def local_id(client: Any, ref: ImageRef) -> str | None:
    """The id of the image the engine holds under exactly ``ref`` (in its RepoDigests), or None."""
    try:
        image = client.images.get(ref.ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise InfraFailure(f"inspecting {ref.ref} failed: {exc.explanation or exc}") from exc
    image_id: str = image.id
    return image_id if ref.ref in (image.attrs.get("RepoDigests") or []) else None


def pull_by_digest(client: Any, ref: ImageRef) -> str:
    """Pull ``ref`` by digest; return the local image id once RepoDigests contains exactly ``ref``."""

    # Same credentials as the push, handed to the engine in the X-Registry-Auth header (never argv);
    # {} rather than None so the SDK does not look credentials up on its own.
    auth_config = docker_auth_config(ref.registry, ref.repository)
    # Already in the engine under exactly this digest: content-addressed, nothing to fetch
    # (saves a registry round trip per image on every run).
    present = local_id(client, ref)
    if present is not None:
        return present
    try:
        client.api.pull(ref.name, tag=ref.digest, auth_config=auth_config)
        image = client.images.get(ref.ref)
    except docker.errors.APIError as exc:
        raise InfraFailure(f"pull {ref.ref} failed: {exc.explanation or exc}") from exc
    require_repo_digest(ref, image.attrs.get("RepoDigests") or [])
    pulled_id: str = image.id
    return pulled_id


def resolve_base_ref(config: WorkerConfig, runner: ImageRef) -> ImageRef:
    """The task environments' base: ``config.base_ref``, else the base lock (``$BENCHSEAL_BASE_LOCK`` or
    images/base.lock.json), else built now under the configured image names (pipeline.imaging.names), or,
    when none are configured, beside the runner (``<prefix>runner`` -> ``<prefix>base``)."""
    if config.base_ref:
        return parse_ref(config.base_ref, "base_ref")
    names = configured_names()
    entry = read_base_lock().images.get("base")
    if entry is not None:
        ref = parse_ref(entry.ref, f"{base_lock_path()} images.base.ref")
        # A configured prefix is the only place images come from: never another registry's base.
        if os.environ.get(PREFIX_ENV) is not None and names is not None and ref.name != names.name("base"):
            raise InfraFailure(f"the base lock {base_lock_path()} names {ref.name}, not {names.name('base')} "
                               f"(${PREFIX_ENV}): refusing a base from elsewhere; rebuild the lock with that prefix")
        return ref
    if names is None:
        if not runner.name.endswith("runner"):
            raise InfraFailure(f"no base image: {base_lock_path()} has none and no image prefix is configured "
                               f"($BENCHSEAL_IMAGE_PREFIX), and the runner {runner.name} is not named <prefix>runner")
        names = ImageNames(runner.name.removesuffix("runner"), "the runner's name")
    refs: dict[str, ImageRef] = ensure_base(names)
    return refs["base"]


def render_suite(source: Path, target: Path, base: ImageRef, *, tasks: set[str] | None = None,
                 from_image: str | None = None, bases: Mapping[str, str] | None = None) -> None:
    """Copy a suite (only ``tasks``, when given) and point every task Dockerfile's placeholder FROM at ``base``
    (by ``from_image``, its id in the sandbox engine, when given), and an environment Dockerfile's FROM of a
    registry image pinned by digest at that image's id in ``bases`` (``task_images.load_task_bases``)."""
    if target.exists():
        shutil.rmtree(target)
    if tasks is None:
        shutil.copytree(source, target, symlinks=False)
    else:
        missing = sorted(t for t in tasks if not (source / t / "task.toml").is_file())
        if missing:
            raise CheckFailed(f"suite {source.name}: tasks {missing} are planned but not in {source}")
        target.mkdir(parents=True)
        for task in sorted(tasks):
            shutil.copytree(source / task, target / task, symlinks=False)
    for dockerfile in sorted(target.glob("*/environment/Dockerfile")) + sorted(target.glob("*/tests/Dockerfile")):
        if dockerfile.parent.name == "environment" and _names_prebuilt_image(dockerfile.parent.parent / "task.toml"):
            continue  # never built: the task runs on its image pinned by digest (pipeline.infra.worker.task_images)
        lines = dockerfile.read_text(encoding="utf-8").splitlines(keepends=True)
        out = []
        for line in lines:
            match = FROM_RE.match(line)
            if match:
                image = match.group(1)
                if image == BASE_PLACEHOLDER:
                    line = f"FROM {from_image or base.ref}{match.group(2)}\n"
                elif dockerfile.parent.name == "environment" and bases and image in bases:
                    line = f"FROM {bases[image]}{match.group(2)}\n"  # loaded by digest and checked: by id
                else:
                    raise CheckFailed(f"{dockerfile}: FROM {image} is not the {BASE_PLACEHOLDER} placeholder "
                                      "nor a base the worker loaded by digest")
            out.append(line)
        dockerfile.write_text("".join(out), encoding="utf-8")


def _names_prebuilt_image(task_toml: Path) -> bool:
    """The task.toml sets ``[environment] docker_image`` (its grammar and registry are checked on the staged
    dataset before any rendering: ``task_images.check_task_images``)."""
    try:
        environment = tomllib.loads(task_toml.read_text(encoding="utf-8")).get("environment")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # rendered as before; planning already refused an unreadable task.toml
    return isinstance(environment, dict) and "docker_image" in environment


TASK_IMAGE_LABEL = "benchseal.task.hash"  # for operators (prune); never read back: anyone's build could carry it
_TASK_IMAGE_VERSION = "benchseal-task-image/1"
_IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


def _task_context_hash(env_dir: Path) -> str:
    """sha256 over a task environment dir: relative paths, exec bits, contents (the FROM line pins the base)."""
    h = hashlib.sha256(_TASK_IMAGE_VERSION.encode() + b"\n")
    for path in sorted(p for p in env_dir.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(env_dir).as_posix()
        if path.is_symlink():
            raise CheckFailed(f"{path}: task environment files must not be symlinks")
        h.update(_json_line(rel, bool(path.stat().st_mode & 0o111), hashlib.sha256(path.read_bytes()).hexdigest()))
    return h.hexdigest()


def _json_line(*items: object) -> bytes:
    return json.dumps(list(items)).encode() + b"\n"


def task_image_records() -> Path:
    """Where the worker records the task images IT built: ``<state home>/cache/task-images/<context hash>``,
    each file the image id. Owned by the worker, writable by nobody else (the sandbox's user included)."""
    return paths.home() / "cache" / "task-images"


def _private_records(records: Path) -> Path:
    """``records`` created if needed; CheckFailed unless it is a directory of this user that nobody else can
    write (a record anyone else could plant would pick the image a trial runs)."""
    try:
        records.mkdir(parents=True)
        os.chmod(records, 0o700)  # whatever the umask
    except FileExistsError:
        pass
    info = records.stat()  # through a symlinked cache dir (a test home's): the directory it names
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise CheckFailed(f"{records}: the task image records must be a directory owned by uid {os.geteuid()} "
                          f"and writable by nobody else (owner {info.st_uid}, mode {info.st_mode & 0o7777:o})")
    return records


def _recorded_id(records: Path, context_hash: str) -> str | None:
    """The image id recorded for ``context_hash``, or None (no record, or one this worker did not write alone)."""
    try:
        fd = os.open(records / context_hash, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None  # not trusted: rebuilt, and the record replaced
        text = handle.read(100).decode("ascii", "replace").strip()
    return text if _IMAGE_ID_RE.fullmatch(text) else None


def _image_present(client: Any, image_id: str) -> bool:
    """The engine holds exactly ``image_id`` (an id is the sha256 of the config, which names every layer)."""
    try:
        found: str = client.images.get(image_id).id
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        raise InfraFailure(f"inspecting task image {image_id} failed: {exc.explanation or exc}") from exc
    return found == image_id


def _build_task_image(client: Any, env_dir: Path, context_hash: str, task: str) -> str:
    """Build ``env_dir`` without the build cache (no layer of an image someone else built) and without a network
    (its FROM names a base by id, so nothing is fetched: what the build makes is fixed by the context and that
    base) and return the full id the engine reports for it (its ``aux`` message, not a line a step could print)."""
    image_id: str | None = None
    try:
        for chunk in client.api.build(path=str(env_dir), rm=True, forcerm=True, pull=False, nocache=True,
                                      network_mode="none",
                                      labels={TASK_IMAGE_LABEL: context_hash}, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                raise InfraFailure(f"building the environment image of task {task} failed: "
                                   f"{escape_text(str(chunk.get('error') or chunk.get('errorDetail'))[:2000])}")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                image_id = aux["ID"]
    except docker.errors.APIError as exc:
        raise InfraFailure(f"building the environment image of task {task} failed: {exc}") from exc
    if not _IMAGE_ID_RE.fullmatch(image_id or "") or not _image_present(client, str(image_id)):
        raise CheckFailed(f"task {task}: the engine reported image id {image_id!r} for its build")
    return str(image_id)


# Builds at once when the caller names no bound (the worker passes the suite's trial_concurrency): plain Harbor
# builds one per running trial, 3 at a time at its default concurrency.
BUILD_CONCURRENCY = 3


def prebuild_task_images(client: Any, suite_dir: Path, records: Path | None = None, *,
                         concurrency: int = BUILD_CONCURRENCY,
                         record_use: Callable[[Iterable[str]], None] | None = None,
                         on_ready: Callable[[Iterable[str]], None] | None = None) -> dict[str, str]:
    """Build each task's environment image once and pin it in the rendered task.toml by image id.

    An image is reused only by the id this worker recorded when it built it (``records``, default
    ``task_image_records()``, keyed by a hash of the rendered environment dir, whose FROM names the
    base by id), after the engine shows that exact id: a warm run builds nothing, and an image
    missing (or a record not the worker's own) is built again. Nothing is looked up by label or tag,
    which any build through the engine proxy could set. Tasks that already name a ``docker_image``
    or have no Dockerfile are left to Harbor. The missing images are built in parallel, one build per
    distinct context, at most ``concurrency`` at once. ``record_use`` is handed each id the batch uses as
    soon as it is known (reused, or built and checked), before any task is pinned to it, so when a build
    fails the others' ids are recorded before the first failure (by task name) is raised: nothing built
    goes unrecorded (the prune's use records). ``on_ready`` is handed the tasks that may start, as they
    may: at once those this leaves to Harbor, then each context's tasks once their task.toml names its
    image (written atomically: a runner reading it concurrently sees the old file or the pinned one).
    Returns {task: image id}.
    """
    records = _private_records(records or task_image_records())
    contexts: dict[str, list[Path]] = {}  # context hash -> the task.toml files of the tasks built from it
    left: list[str] = []  # tasks with an image of their own, or none to build: Harbor's, ready at once
    for task_toml in sorted(suite_dir.glob("*/task.toml")):
        env_dir = task_toml.parent / "environment"
        config = tomllib.loads(task_toml.read_text(encoding="utf-8"))
        if not (env_dir / "Dockerfile").is_file() or (config.get("environment") or {}).get("docker_image"):
            left.append(task_toml.parent.name)
            continue
        contexts.setdefault(_task_context_hash(env_dir), []).append(task_toml)
    if on_ready is not None and left:
        on_ready(left)
    pinned: dict[str, str] = {}

    def use(digest: str, image_id: str) -> None:
        """``image_id`` (checked) serves context ``digest``: recorded, its tasks pinned to it, then ready."""
        if record_use is not None:
            record_use([image_id])
        for task_toml in contexts[digest]:
            _pin_docker_image(task_toml, image_id)
            pinned[task_toml.parent.name] = image_id
        if on_ready is not None:
            on_ready(task_toml.parent.name for task_toml in contexts[digest])

    ids: dict[str, str] = {}
    missing: dict[str, str] = {}  # context hash -> the first task built from it (named by its failure)
    for digest, tomls in contexts.items():
        image_id = _recorded_id(records, digest)
        if image_id is not None and _image_present(client, image_id):
            ids[digest] = image_id
            use(digest, image_id)
        else:
            missing[digest] = tomls[0].parent.name
    failures = _build_missing(client, suite_dir, missing, records, ids, concurrency, on_built=use)
    if failures:
        raise failures[0]
    return pinned


def _build_and_record(client: Any, env_dir: Path, context_hash: str, task: str, records: Path) -> str:
    image_id = _build_task_image(client, env_dir, context_hash, task)
    atomic_write_text(records / context_hash, image_id + "\n", mode=0o600)  # the worker's own record, at once
    return image_id


def _build_missing(client: Any, suite_dir: Path, missing: Mapping[str, str], records: Path, ids: dict[str, str],
                   concurrency: int, on_built: Callable[[str, str], None]) -> list[BaseException]:
    """Build each missing context (hash -> task), at most ``concurrency`` at once, each recorded in ``records`` as
    soon as its build is checked (and put into ``ids``, then handed to ``on_built`` in this thread); returns the
    failures, by task name. After a failure no further build starts; those already running finish and are
    recorded."""
    if not missing:
        return []
    workers = max(1, min(len(missing), concurrency))
    failures: list[tuple[str, BaseException]] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="task-image-build") as pool:
        futures = {pool.submit(_build_and_record, client, suite_dir / task / "environment", digest, task, records): digest
                   for digest, task in sorted(missing.items(), key=lambda item: item[1])}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)  # each handed on as it ends
            for future in done:
                digest = futures[future]
                if future.cancelled():
                    continue
                failure = future.exception()
                if failure is not None:
                    failures.append((missing[digest], failure))
                    continue
                ids[digest] = future.result()
                on_built(digest, ids[digest])
            if failures:
                for future in pending:
                    future.cancel()  # not started yet: the batch fails anyway
    failures.sort(key=lambda item: item[0])
    for task, failure in failures[1:]:
        log.error("building the environment image of task %s failed too: %s", task, failure)
    return [failure for _, failure in failures]


def _pin_docker_image(task_toml: Path, image_id: str) -> None:
    """Set ``[environment] docker_image`` in a rendered task.toml (the suite's own file is never touched)."""
    text = task_toml.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    header = next((i for i, line in enumerate(lines) if line.strip() == "[environment]"), None)
    entry = f'docker_image = "{image_id}"\n'
    if header is None:
        text = text + ("" if text.endswith("\n") else "\n") + "\n[environment]\n" + entry
    else:
        lines.insert(header + 1, entry)
        text = "".join(lines)
    if tomllib.loads(text).get("environment", {}).get("docker_image") != image_id:
        raise CheckFailed(f"{task_toml}: could not pin docker_image")
    atomic_write_text(task_toml, text, mode=0o644)  # the runner may be reading it: the old file or this one


def check_runner_agent(client: Any, ref: ImageRef, payload: DispatchPayload) -> None:
    """The runner ``ref`` carries exactly the payload's agent artifact (or none when the payload names none).

    Read from the image config's label (bound to the digest the signature covers), before any
    container of the image runs; the runner compares its baked manifest again and asks the
    agent for its version.
    """
    try:
        labels = client.images.get(ref.ref).attrs.get("Config", {}).get("Labels") or {}
    except docker.errors.APIError as exc:
        raise InfraFailure(f"inspecting {ref.ref} failed: {exc.explanation or exc}") from exc
    raw = labels.get(AGENT_LABEL)
    expected = payload.agent_artifact
    if expected is None:
        return  # a calibration or Harbor agent: whatever release agent the image also carries is not run
    if raw is None:
        raise ImageRefused(f"runner {ref.ref} carries no release agent; the payload names "
                           f"{expected.name} {expected.version}")
    try:
        carried = load_model(AgentArtifact, strictjson.loads(raw), f"runner label {AGENT_LABEL}")
    except (ValueError, ValidationError) as exc:
        raise ImageRefused(f"runner {ref.ref}: label {AGENT_LABEL} is not an agent artifact: {exc}") from None
    if carried != expected:
        differing = [name for name in AgentArtifact.model_fields if getattr(carried, name) != getattr(expected, name)]
        raise ImageRefused(f"runner {ref.ref} carries agent {carried.name} {carried.package}@{carried.version}, "
                           f"not the payload's ({', '.join(differing)} differ)")
