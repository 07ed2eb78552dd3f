"""The infra worker: plan runs into trials, run claimed batches of trials in the runner image
(by digest), grade each run once from its trial rows, finish.

One piece of work (``run_once``):

1. remove the secret files and sockets that dead workers on this host left behind
   (``agents.reap_private_dirs``), requeue expired leases (runs and trials); claim a batch of QUEUED trials of any planned run,
   else the oldest QUEUED run (a heartbeat thread renews whichever lease is held; its failures are
   logged, never fatal);
2. a run in its run phase is planned: the payload is checked against the policy, the runner is
   pulled BY DIGEST (local RepoDigests must list exactly that reference) and its and the api's
   signatures are checked, the suite's tasks become trial rows (``plan_trials``), and the planner
   claims the first batch in the same transaction;
3. a batch runs in its own runner container on this host: leftovers of earlier batches of the same
   trials are removed (a worker killed with -9 leaves its runner container behind), the images
   are pulled and checked again, the batch's tasks are rendered (``FROM benchseal-base`` -> the base
   by digest) and prebuilt, and ``benchseal trial run`` runs them; secrets go in as 0400 files on a
   read-only mount (never Env or argv), the engine socket is the filtering proxy, a model agent
   reaches its endpoint through a relay socket (``pipeline.infra.sandbox.agents``);
4. each trial is graded from its result.json as soon as it finishes and recorded in the queue
   (``complete_trials``; with a queue shared by several hosts, with its packed trial dir), under
   the suite timeout (kill on expiry); an infrastructure error requeues the batch's unrecorded
   trials (bounded per trial);
5. the worker whose batch ends the run's last trial is handed the run: it grades from the trial
   rows (every trial exactly once), unpacks the dirs of trials that ran on other hosts
   (``pipeline.infra.worker.trial_evidence``), copies the evidence, runs the finalize hook (evidence +
   signing), then ONE terminal transaction with the publication outbox rows.

A grader that dies, or a last trial that ends by lease expiry, leaves the run QUEUED in its
finalize phase: the next claim grades it the same way. A run whose planning attempts are used up
is finalized like every other terminal run (INFRA_ERROR, no score), through ``complete``; so is a
run with a trial whose attempts ran out (its completed trials graded as they are).

SIGTERM: the running batch is given ``term_grace_seconds`` to finish, then its container is
killed and its unrecorded trials released (no attempt counted).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from pipeline.attest.images import ImageIdentityPolicy, SigstoreEndpoints, image_identity, verify_image
from pipeline.core.contracts import DispatchPayload, Grading, PublicationRequest, RunState, TrialRecord, trial_short_id
from pipeline.core.digests import ImageRef, parse_ref, require_repo_digest
from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.core.errors import CheckFailed, Error, InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_json
from pipeline.core.paths import REPO_ROOT
from pipeline.core.registry_auth import docker_auth_config
from pipeline.imaging.base import ensure_base
from pipeline.imaging.names import PREFIX_ENV, ImageNames, configured_names
from pipeline.infra.intake.policy import InfraPolicy, SourcePolicy, load_policy
from pipeline.infra.queue.sql import PlannedTrial, Queue, RunRecord, TrialBatch, batch_label, open_queue
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.agents import RunnerAgentSetup, prepare_runner_agent, reap_private_dirs
from pipeline.infra.worker.grading import (
    RecordedTrial,
    RunnerInfo,
    grade_run,
    grade_trial,
    grade_trials,
    infra_error_grading,
    read_plan,
)
from pipeline.infra.worker.trial_evidence import (
    check_trial_name,
    evidence_copy_ignore,
    pack_trial_dir,
    unpack_trial_dir,
)
from pipeline.runner.trial import discover_tasks, plan_trials
from pipeline.runner.tunings import DISABLE_ENV

log = logging.getLogger("benchseal.worker")

Finalizer = Callable[[RunRecord, Grading, Path], Sequence[PublicationRequest]]
BASE_PLACEHOLDER = "benchseal-base"
CONTAINER_PREFIX = "benchseal-infra-"
SANDBOX_ENGINE_ENV = "BENCHSEAL_SANDBOX_ENGINE"
LABEL_RUN = "benchseal.infra.run_id"
LABEL_TRIALS = "benchseal.infra.trials"  # the trial names a runner container runs (one batch)
LABEL_BATCH = "benchseal.infra.batch"  # queue.batch_label(lease token) of that batch
# cosign failures that say the registry or Sigstore could not be reached (retry), not that a
# signature is missing or wrong (refuse).
_UNREACHABLE = ("connection refused", "i/o timeout", "no such host", "tls handshake timeout", "connection reset",
                "503 service unavailable", "502 bad gateway", "context deadline exceeded")
_FROM_RE = re.compile(r"^\s*FROM\s+(\S+)(.*)$", re.IGNORECASE)


class InfraFailure(Exception):
    """An infrastructure problem during an attempt: the run is requeued."""


class ImageRefused(Exception):
    """An image does not carry the signatures the policy requires: the run fails, unretried."""


@dataclass(frozen=True)
class WorkerConfig:
    db: Path | None = None
    policy: InfraPolicy | None = None
    # PostgreSQL queue URL file (else BENCHSEAL_QUEUE_URL[_FILE], else the SQLite file ``db``).
    queue_url_file: Path | None = None
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    suites_dir: Path = REPO_ROOT / "suites"
    # Base image for task environments; default: the base lock, else pipeline.imaging.base.ensure_base (resolve_base_ref).
    base_ref: str | None = None
    docker_socket: str = "/var/run/docker.sock"  # the host engine: pulls by digest, signature checks
    # The rootless sandbox engine everything under test runs on (runner, trial containers, gateways):
    # ``unix://PATH``; default $BENCHSEAL_SANDBOX_ENGINE, else the local sandbox service's socket.
    sandbox_engine: str | None = None
    heartbeat_seconds: float | None = None  # default: lease_seconds / 3
    term_grace_seconds: float = 30.0
    trial_concurrency: int | None = None  # default: the suite's trial_concurrency in the policy
    # Trials claimed at once and run in one runner container (default: trial_concurrency).
    trial_batch: int | None = None
    # Build each task's environment image once (cached by content) and hand it to Harbor by
    # image id, so no trial runs `compose build`; False leaves the builds to Harbor (bench ablation).
    prebuild_task_images: bool = True
    # Names of pipeline.runner.trial.TUNINGS to turn off in the runner (bench ablation only).
    harbor_disable: tuple[str, ...] = ()
    # Where the images' keyless signatures are checked: public-good unless a private instance
    # is named explicitly (benchseal worker --sigstore-url/--trusted-root, release --local).
    image_trust: SigstoreEndpoints = field(default_factory=SigstoreEndpoints.public_good)
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    state: RunState
    grading: Grading | None
    reason: str | None
    runner_digest: str | None = None


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# --- images --------------------------------------------------------------------

def _docker() -> Any:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise InfraFailure(f"Docker Engine unavailable: {exc}") from exc
    return client


def sandbox_url(config: WorkerConfig | None = None) -> str:
    configured = (config.sandbox_engine if config is not None else None) or os.environ.get(SANDBOX_ENGINE_ENV)
    return configured or sandbox.default_sandbox().url


def _sandbox(config: WorkerConfig | None = None) -> Any:
    """A client of the sandbox engine, refused (never replaced by the host engine) unless it answers
    and is rootless."""
    url = sandbox_url(config)
    try:
        sandbox.require_sandbox_engine(url)
    except InfrastructureError as exc:
        raise InfraFailure(str(exc)) from None
    return docker.DockerClient(base_url=url, timeout=120)


def sandbox_image(host: Any, sandboxed: Any, ref: ImageRef) -> str:
    """The one place an admitted image crosses into the sandbox: ``ref`` was pulled by digest on the
    host (RepoDigests checked) and its signatures checked there; the sandbox gets the same image by
    id (the sha256 of its config, which pins every layer) and everything there names it by that id."""
    image_id = pull_by_digest(host, ref)
    return sandbox.copy_image(host, sandboxed, image_id)


def pull_by_digest(client: Any, ref: ImageRef) -> str:
    """Pull ``ref`` by digest; return the local image id once RepoDigests contains exactly ``ref``."""

    # Same credentials as the push, handed to the engine in the X-Registry-Auth header (never argv);
    # {} rather than None so the SDK does not look credentials up on its own.
    auth_config = docker_auth_config(ref.registry, ref.repository)
    try:
        # Already in the engine under exactly this digest: content-addressed, nothing to fetch
        # (saves a registry round trip per image on every run).
        image = client.images.get(ref.ref)
        if ref.ref in (image.attrs.get("RepoDigests") or []):
            image_id: str = image.id
            return image_id
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise InfraFailure(f"inspecting {ref.ref} failed: {exc.explanation or exc}") from exc
    try:
        client.api.pull(ref.name, tag=ref.digest, auth_config=auth_config)
        image = client.images.get(ref.ref)
    except docker.errors.APIError as exc:
        raise InfraFailure(f"pull {ref.ref} failed: {exc.explanation or exc}") from exc
    require_repo_digest(ref, image.attrs.get("RepoDigests") or [])
    pulled_id: str = image.id
    return pulled_id


def signer_identities(payload: DispatchPayload, source: SourcePolicy) -> list[ImageIdentityPolicy]:
    """The identities ``source``'s policy admits for ``payload`` (``sources[].signer``), in policy
    order, each pinned to the payload's commit (``image_identity``): a tag deleted and pushed again
    at another commit names no other release."""
    return [image_identity(source.repository, payload.source.tag, payload.source.commit, workflow=signer.workflow,
                           ref=signer.ref) for signer in source.signer]


def require_signed_images(payload: DispatchPayload, source: SourcePolicy, trust: SigstoreEndpoints) -> None:
    """Raise ImageRefused unless the runner and the api each carry a signature and the SLSA
    provenance and CycloneDX attestations of ONE identity ``source``'s policy admits (its release
    workflow at the payload's tag, or at an exact ref the policy names, always at the payload's
    commit), checked by cosign for the exact digest, before anything pulled is used."""
    admitted = signer_identities(payload, source)
    for role in ("runner", "api"):
        ref = parse_ref(getattr(payload, role), f"payload.{role}")
        loopback = ref.registry.split(":", 1)[0] in ("127.0.0.1", "localhost")
        refusals = []
        for expected in admitted:
            try:
                verify_image(ref.ref, expected, trust, allow_http_registry=loopback)
            except CheckFailed as exc:
                text = str(exc).lower()
                if any(sign in text for sign in _UNREACHABLE):
                    raise InfraFailure(f"could not check the signatures of {role} {ref.ref}: {exc}") from None
                refusals.append(f"{expected.describe()}: {exc}")
                continue
            break
        else:
            raise ImageRefused(f"{role} {ref.ref} is not signed by "
                               + " nor ".join(e.identity for e in admitted) + ": " + "; ".join(refusals))


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
                 from_image: str | None = None) -> None:
    """Copy a suite (only ``tasks``, when given) and point every task Dockerfile's placeholder FROM at ``base``
    (by ``from_image``, its id in the sandbox engine, when given)."""
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
        lines = dockerfile.read_text(encoding="utf-8").splitlines(keepends=True)
        out = []
        for line in lines:
            match = _FROM_RE.match(line)
            if match:
                if match.group(1) != BASE_PLACEHOLDER:
                    raise CheckFailed(f"{dockerfile}: FROM {match.group(1)} is not the {BASE_PLACEHOLDER} placeholder")
                line = f"FROM {from_image or base.ref}{match.group(2)}\n"
            out.append(line)
        dockerfile.write_text("".join(out), encoding="utf-8")


TASK_IMAGE_LABEL = "benchseal.task.hash"
_TASK_IMAGE_VERSION = "benchseal-task-image/1"


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


def prebuild_task_images(client: Any, suite_dir: Path) -> dict[str, str]:
    """Build each task's environment image once and pin it in the rendered task.toml by image id.

    The image id is the sha256 of the image config (content-addressed). Images are found
    again by the label ``benchseal.task.hash`` (a hash of the rendered environment dir,
    whose FROM names the base by digest), so a warm run builds nothing. Tasks that already
    name a ``docker_image`` or have no Dockerfile are left to Harbor. Returns {task: image id}.
    """


    pinned: dict[str, str] = {}
    for task_toml in sorted(suite_dir.glob("*/task.toml")):
        task_dir = task_toml.parent
        env_dir = task_dir / "environment"
        config = tomllib.loads(task_toml.read_text(encoding="utf-8"))
        if not (env_dir / "Dockerfile").is_file() or (config.get("environment") or {}).get("docker_image"):
            continue
        digest = _task_context_hash(env_dir)
        found = sorted(image.id for image in client.images.list(filters={"label": f"{TASK_IMAGE_LABEL}={digest}"}))
        if found:
            image_id = found[0]
        else:
            try:
                image, _ = client.images.build(path=str(env_dir), rm=True, forcerm=True, pull=False,
                                               labels={TASK_IMAGE_LABEL: digest})
            except (docker.errors.BuildError, docker.errors.APIError) as exc:
                raise InfraFailure(f"building the environment image of task {task_dir.name} failed: {exc}") from exc
            image_id = image.id
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", image_id or ""):
            raise CheckFailed(f"task {task_dir.name}: the engine returned image id {image_id!r}")
        _pin_docker_image(task_toml, image_id)
        pinned[task_dir.name] = image_id
    return pinned


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
    task_toml.write_text(text, encoding="utf-8")


# --- containers ------------------------------------------------------------------

def kill_leftovers(client: Any, run_id: str) -> list[str]:
    """Remove runner containers of earlier attempts of ``run_id`` and the trial containers they started."""
    removed: list[str] = []
    short = trial_short_id(run_id)

    def remove(container: Any) -> None:
        try:
            container.remove(force=True)
            removed.append(str((container.attrs.get("Names") or [container.id])[0]).lstrip("/"))
        except docker.errors.NotFound:
            pass  # gone between listing and removal (its own teardown, or another worker's)

    # sparse=True: no per-container inspect while listing, which races with containers that
    # other runs on this engine remove meanwhile.
    for container in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_RUN}={run_id}"}):
        remove(container)
    # Harbor's compose projects are named after the trial names, which end in the run's short id.
    for container in client.containers.list(all=True, sparse=True, filters={"label": "com.docker.compose.project"}):
        project = (container.attrs.get("Labels") or {}).get("com.docker.compose.project", "")
        if short and short in project:
            remove(container)
    return removed


def sweep_orphan_batches(client: Any, queue: Queue) -> list[str]:
    """Remove runner containers on this engine whose batch no longer holds a lease (its worker died
    and the trials were retried elsewhere, or ended): with nobody waiting on them they would run on
    unbounded. A batch still holding its lease (another worker of this host) is left alone."""
    removed: list[str] = []
    for container in client.containers.list(all=True, sparse=True, filters={"label": LABEL_BATCH}):
        labels = container.attrs.get("Labels") or {}
        run_id, label = labels.get(LABEL_RUN), labels.get(LABEL_BATCH)
        if not run_id or not label or label in queue.held_batches(str(run_id)):
            continue
        try:
            queue.get_run(str(run_id))
        except ValidationError:
            continue  # a run of another queue on this engine: not this worker's to judge
        # Its trials that run again right now (possibly on this engine, under the same compose
        # project names) are left alone: that batch removed this one's leftovers when it started.
        running = {t.trial_name for t in queue.trials(str(run_id)) if t.state == "RUNNING"}
        names = [n for n in str(labels.get(LABEL_TRIALS, "")).split(",") if n and n not in running]
        removed += kill_trial_leftovers(client, str(run_id), names, only_batch=str(label))
    return removed


def kill_trial_leftovers(client: Any, run_id: str, trial_names: Sequence[str], *, only_batch: str | None = None) -> list[str]:
    """Remove what an earlier batch of these trials left on this engine (a worker killed with -9
    leaves its runner container running): runner containers that ran any of them and the trial
    containers of their compose projects. Other batches of the same run are left alone."""
    wanted = {name.lower() for name in trial_names if name}
    removed: list[str] = []

    def remove(container: Any) -> None:
        try:
            container.remove(force=True)
            removed.append(str((container.attrs.get("Names") or [container.id])[0]).lstrip("/"))
        except docker.errors.NotFound:
            pass

    for container in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_RUN}={run_id}"}):
        labels = container.attrs.get("Labels") or {}
        ran = {n.lower() for n in str(labels.get(LABEL_TRIALS, "")).split(",") if n}
        if only_batch is not None:
            if labels.get(LABEL_BATCH) == only_batch:
                remove(container)
            continue
        if ran & wanted or not ran:
            remove(container)
    for container in client.containers.list(all=True, sparse=True, filters={"label": "com.docker.compose.project"}):
        project = (container.attrs.get("Labels") or {}).get("com.docker.compose.project", "").lower()
        if any(name in project for name in wanted):
            remove(container)
    return removed


@dataclass(frozen=True)
class _Engines:
    """The host engine (pulls by digest, RepoDigests) and the sandbox engine (runs everything)."""

    host: Any
    sandbox: Any
    runner_id: str  # the runner image's id in the sandbox (sandbox_image)


def _inspect_runner(engines: _Engines, container: Any, expected: ImageRef) -> RunnerInfo:
    """What a sandbox container ran: its image id there, and the digest the host engine pulled that
    same id by (the sandbox has the image by id only; equal ids are equal configs and layers)."""
    container.reload()
    image_id = container.attrs.get("Image")
    digest = None
    try:
        image = engines.host.images.get(image_id)
        for entry in image.attrs.get("RepoDigests") or []:
            name, _, candidate = entry.partition("@")
            if name == expected.name:
                digest = candidate if candidate == expected.digest else digest or candidate
    except Exception:  # inspection failure leaves the digest unknown, never fakes it
        log.warning("could not inspect runner image %s", image_id)
    return RunnerInfo(image_id=image_id, digest=digest)


class _Heartbeat(threading.Thread):
    def __init__(self, queue: Queue, run_id: str, token: str, lease: float, every: float) -> None:
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self._queue, self._run_id, self._token, self._lease, self._every = queue, run_id, token, lease, every
        self.done = threading.Event()
        self.lost = False
        self.failures = 0

    _what = ""  # "trial " for a batch of trials: names the lease in the log

    def _beat(self) -> bool:
        return self._queue.heartbeat(self._run_id, self._token, self._lease)

    def run(self) -> None:
        while not self.done.wait(self._every):
            try:
                if not self._beat():
                    self.lost = True
                    log.error("run %s: %slease lost", self._run_id, self._what)
            except Exception as exc:  # a failed heartbeat must never kill the trials
                self.failures += 1
                log.warning("run %s: %sheartbeat failed: %s", self._run_id, self._what, exc)


def _copy_evidence(run_dir: Path) -> None:
    """Copy Harbor trial dirs and logs into artifacts/ (every outcome): the trial dirs in ``harbor/`` (those
    that ran on this host, and those the grader unpacked from the queue) and the runner logs of this host's batches."""
    artifacts = run_dir / "artifacts"
    # Every trial has ended, so no batch is running: one that died with its worker left the sandbox's files.
    sandbox.reclaim(run_dir / "batches")
    for batch in sorted((run_dir / "batches").glob("*")) if (run_dir / "batches").is_dir() else []:
        source = batch / "logs"
        if source.is_dir():
            target = artifacts / "evidence" / "batches" / batch.name / "logs"
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target, symlinks=True,
                            ignore=evidence_copy_ignore(source, target.relative_to(run_dir).as_posix()))
    for name in ("harbor", "logs"):
        source = run_dir / name
        if source.is_dir():
            target = artifacts / "evidence" / name
            if target.exists():
                shutil.rmtree(target)
            # Links, special files and names evidence cannot carry stay behind (logged).
            shutil.copytree(source, target, symlinks=True,
                            ignore=evidence_copy_ignore(source, target.relative_to(run_dir).as_posix()))
    for name in ("trials.json", "grading.json"):
        if (run_dir / name).is_file():
            (artifacts / "evidence").mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / name, artifacts / "evidence" / name)


# --- one attempt -----------------------------------------------------------------

def run_once(config: WorkerConfig, finalize: Finalizer | None = None) -> RunOutcome | None:
    """Take one piece of work; None when nothing was claimable.

    First a batch of QUEUED trials of any planned run (this is how one run spreads over several
    hosts); else the oldest QUEUED run: in its run phase it is checked and planned into trials (the
    planner claims the first batch in the same transaction), in its finalize phase it is graded.
    After a batch, the worker keeps taking batches of the same run while there are any; the worker
    whose batch ends the run's last trial grades and completes it (RunOutcome with the terminal
    state); otherwise the outcome says RUNNING (other workers hold the rest of its trials).
    """
    policy = config.policy or load_policy()
    # Secret files and sockets of attempts whose worker died (kill -9) on this host: gone before any claim.
    reap_private_dirs()
    with open_queue(config.db, url_file=config.queue_url_file) as queue:
        for run_id in queue.requeue_expired():
            log.warning("run %s: leases expired; requeued or ended", run_id)
        _sweep(queue, config)
        if config.stop.is_set():
            return None
        batch = queue.claim_trials(config.worker_id, policy.lease_seconds, _batch_size(config, policy, None))
        if batch is None:
            record = queue.claim(config.worker_id, policy.lease_seconds)
            if record is None:
                return None
            token = record.lease_token
            if token is None:  # pragma: no cover - claim always sets a token
                raise CheckFailed(f"run {record.run_id}: claimed without a lease token")
            beat = _Heartbeat(queue, record.run_id, token, policy.lease_seconds,
                              config.heartbeat_seconds or policy.lease_seconds / 3)
            beat.start()
            try:
                if record.phase == "finalize" and record.trials_planned > 0:
                    return _grade_planned(queue, record, token, policy, finalize, _now())
                if record.phase == "finalize":
                    return _finalize_abandoned(queue, record, token, policy, finalize)
                planned = _plan(queue, record, token, config, policy, finalize)
            finally:
                beat.done.set()
                beat.join(timeout=5)
            if isinstance(planned, RunOutcome):
                return planned
            batch = planned
        return _work_batches(queue, batch, config, policy, finalize)


def _sweep(queue: Queue, config: WorkerConfig | None = None) -> None:
    """Best effort: an engine that cannot be reached now is the next claim's problem, not this one's."""
    try:
        client = _sandbox(config)
    except (InfraFailure, CheckFailed):
        return
    try:
        for name in sweep_orphan_batches(client, queue):
            log.warning("removed container %s of a batch that no longer holds its lease", name)
    except Exception as exc:
        log.warning("sweeping orphaned batches failed: %s", exc)
    finally:
        client.close()


def _batch_size(config: WorkerConfig, policy: InfraPolicy, suite: str | None) -> int:
    """Trials one runner container takes at once: --trial-batch, else the suite's trial_concurrency."""
    if config.trial_batch is not None:
        return config.trial_batch
    if config.trial_concurrency is not None:
        return config.trial_concurrency
    if suite is not None and suite in policy.suites:
        return policy.trial_concurrency(suite)
    return max((policy.trial_concurrency(name) for name in policy.suites), default=1)


def _plan(
    queue: Queue, record: RunRecord, token: str, config: WorkerConfig, policy: InfraPolicy, finalize: Finalizer | None
) -> RunOutcome | TrialBatch:
    """Check the run (policy, images by digest and signature, suite) and split it into trials."""
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    started = _now()
    queue.start(run_id, token)
    failure: str | None = None
    client: Any = None
    try:
        runner_ref = parse_ref(payload.runner, "payload.runner")
        source = policy.check_payload(payload)  # the repository and both images, as accept checked them
        client = _docker()
        # Nothing of this run runs anywhere yet (it is not planned): anything left on the sandbox
        # engine under its label is an earlier planning attempt's.
        _remove_run_leftovers(run_id, config, strict=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        pull_by_digest(client, runner_ref)  # a missing runner stays an infrastructure error (retried)
        require_signed_images(payload, source, config.image_trust)  # before anything pulled is used
        suite_src = config.suites_dir / payload.suite
        if not suite_src.is_dir():
            raise CheckFailed(f"suite {payload.suite!r} not found under {config.suites_dir}")
        specs = plan_trials(run_id, discover_tasks(suite_src))
    except ValidationError as exc:
        failure = f"rejected: {exc.diagnostics()}"  # the payload no longer passes the policy: retrying cannot help
    except ImageRefused as exc:
        failure = f"refused by policy: {exc}"
    except (InfraFailure, CheckFailed, InfrastructureError) as exc:
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir, policy)
    except Exception as exc:  # an unexpected engine/SDK error is still an infrastructure error, never a stuck run
        log.exception("run %s: unexpected error", run_id)
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir, policy)
    finally:
        if client is not None:
            client.close()
    if failure is not None:
        runner = RunnerInfo(image_id=None, digest=None)
        grading = grade_run(run_dir, record, policy, runner, started_at=started, finished_at=_now(), failure=failure)
        atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
        _copy_evidence(run_dir)
        try:
            publications = list(finalize(record, grading, run_dir)) if finalize else []
        except Exception as exc:
            log.exception("run %s: finalize failed", run_id)
            return _infra(queue, record, token, f"finalize failed: {type(exc).__name__}: {exc}", started, finalize,
                          run_dir, policy)
        queue.complete(run_id, token, grading, publications)
        return RunOutcome(run_id=run_id, state=grading.status, grading=grading, reason=grading.reason)
    batch = queue.plan_trials(
        run_id, token, [PlannedTrial(task=s.task, trial_name=s.trial_name) for s in specs],
        max_attempts=record.max_attempts, claim=_batch_size(config, policy, payload.suite),
        worker=config.worker_id, lease_seconds=policy.lease_seconds)
    if batch is None:  # pragma: no cover - a planned run always has a first trial to claim
        raise CheckFailed(f"run {run_id}: planned but its first batch could not be claimed")
    log.info("run %s: planned %d trials", run_id, len(specs))
    return batch


class _TrialHeartbeat(_Heartbeat):
    _what = "trial "

    def _beat(self) -> bool:
        return self._queue.heartbeat_trials(self._run_id, self._token, self._lease)


def _work_batches(queue: Queue, batch: TrialBatch, config: WorkerConfig, policy: InfraPolicy,
                  finalize: Finalizer | None) -> RunOutcome:
    """Run ``batch`` and further batches of the same run; grade the run if this worker ends its last trial."""
    run_id = batch.run.run_id
    current: TrialBatch | None = batch
    while current is not None:
        ended = _run_batch(queue, current, config, policy)
        if ended == "released":
            return RunOutcome(run_id=run_id, state="QUEUED", grading=None, reason="released on SIGTERM")
        if isinstance(ended, RunRecord):
            grader_token = ended.lease_token or ""
            beat = _Heartbeat(queue, run_id, grader_token, policy.lease_seconds,
                              config.heartbeat_seconds or policy.lease_seconds / 3)
            beat.start()
            try:
                return _grade_planned(queue, ended, grader_token, policy, finalize, _now())
            finally:
                beat.done.set()
                beat.join(timeout=5)
        if config.stop.is_set():
            break
        current = queue.claim_trials(config.worker_id, policy.lease_seconds,
                                     _batch_size(config, policy, batch.run.payload.suite), run_id=run_id)
    return RunOutcome(run_id=run_id, state="RUNNING", grading=None, reason="other workers hold the run's remaining trials")


def _run_batch(queue: Queue, batch: TrialBatch, config: WorkerConfig, policy: InfraPolicy) -> RunRecord | str | None:
    """Run one batch in its own runner container; record each trial's graded result.

    Returns the run (under a fresh lease) when this batch ended its last trial, "released" on
    SIGTERM, else None. An infrastructure failure requeues the batch's trials (bounded per trial).
    """
    record, token = batch.run, batch.lease_token
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    names = tuple(t.trial_name for t in batch.trials)
    out = run_dir / "batches" / f"{min(t.idx for t in batch.trials):04d}-{token[:12]}"
    recorded: set[int] = set()
    handed: list[RunRecord] = []

    def record_trials(runner: RunnerInfo, *, final: bool, failure: str | None = None) -> None:
        """Record the batch's finished trials (all remaining ones when ``final``), each exactly once."""
        plan = read_plan(out)
        todo: dict[int, str] = {}
        packed: dict[int, bytes] = {}
        for trial in batch.trials:
            path = out / "harbor" / trial.trial_name / "result.json"
            if trial.idx in recorded or not (final or _finished(path)):
                continue
            graded = grade_trial(path, trial.task, trial.trial_name, payload.agent, runner,
                                 plan.harbor_version if plan else None)
            todo[trial.idx] = RecordedTrial(
                trial=graded, failure=failure if final else None, agent_version=plan.agent_version if plan else None,
                model=plan.model if plan else None, host=socket.gethostname(), batch_dir=str(out)).to_json()
            if queue.spans_hosts:
                evidence = _pack_evidence(run_id, path.parent)
                if evidence is not None:
                    packed[trial.idx] = evidence
        if not todo:
            return
        got = queue.complete_trials(run_id, token, todo, lease_seconds=policy.lease_seconds, evidence=packed)
        recorded.update(todo)
        if got is not None:
            handed.append(got)

    expected_digest = parse_ref(payload.runner, "payload.runner").digest

    def on_poll(runner: RunnerInfo) -> None:
        if runner.digest != expected_digest:
            return  # a wrong runner: its trials are recorded at the end, with the failure
        try:
            record_trials(runner, final=False)
        except Exception as exc:  # recorded at the end instead; a finished trial is never lost by this
            log.warning("run %s: recording finished trials failed: %s", run_id, exc)

    beat = _TrialHeartbeat(queue, run_id, token, policy.lease_seconds, config.heartbeat_seconds or policy.lease_seconds / 3)
    beat.start()
    client: Any = None
    sandboxed: Any = None
    try:
        try:
            runner_ref = parse_ref(payload.runner, "payload.runner")
            source = policy.check_payload(payload)
            client = _docker()
            sandboxed = _sandbox(config)
            for name in kill_trial_leftovers(sandboxed, run_id, names):
                log.warning("run %s: removed leftover container %s", run_id, name)
            pull_by_digest(client, runner_ref)
            require_signed_images(payload, source, config.image_trust)  # every host checks before it runs anything
            runner_id = sandbox_image(client, sandboxed, runner_ref)
            base = resolve_base_ref(config, runner_ref)
            base_id = sandbox_image(client, sandboxed, base)
            suite_src = config.suites_dir / payload.suite
            if not suite_src.is_dir():
                raise CheckFailed(f"suite {payload.suite!r} not found under {config.suites_dir}")
            render_suite(suite_src, out / "suite", base, tasks={t.task for t in batch.trials}, from_image=base_id)
            if config.prebuild_task_images:
                prebuild_task_images(sandboxed, out / "suite")
            # The sandbox engine (the service user) works in this batch's dir and nowhere else of the run's.
            sandbox.grant(out)
            concurrency = min(len(batch.trials), config.trial_concurrency or policy.trial_concurrency(payload.suite))
            runner, failure, released = _run_container(
                _Engines(client, sandboxed, runner_id), record, runner_ref, run_dir, config, policy,
                _BatchRun(suite_dir=out / "suite", out_dir=out, name=_batch_container_name(run_id, token),
                          trial_names=names, concurrency=concurrency, label=batch_label(token), on_poll=on_poll))
        except (ValidationError, ImageRefused, InfraFailure, CheckFailed, InfrastructureError) as exc:
            log.error("run %s: batch %s failed: %s", run_id, list(names), exc)
            return _fail_rest(queue, run_id, token, f"{type(exc).__name__}: {exc}", policy, recorded, batch, handed)
        except Exception as exc:
            log.exception("run %s: unexpected error in batch %s", run_id, list(names))
            return _fail_rest(queue, run_id, token, f"{type(exc).__name__}: {exc}", policy, recorded, batch, handed)
        finally:
            for engine in (client, sandboxed):
                if engine is not None:
                    engine.close()
    finally:
        beat.done.set()
        beat.join(timeout=5)
    if released:
        if len(recorded) < len(batch.trials):
            queue.release_trials(run_id, token, "worker stopping (SIGTERM)")
        return handed[0] if handed else "released"
    if failure is None and runner.digest != parse_ref(payload.runner, "payload.runner").digest:
        failure = f"runner container ran {runner.digest}, not {parse_ref(payload.runner, 'payload.runner').digest}"
    if failure is not None and len(recorded) == len(batch.trials):
        # Every trial had finished and was recorded before the batch failed: nothing is left to carry it.
        log.error("run %s: %s (after every trial of the batch had finished)", run_id, failure)
    # The batch's failure (timeout, a wrong runner) rides on the trials it left unfinished, and fails the run.
    record_trials(runner, final=True, failure=failure)
    _collect_trial_dirs(run_dir, out, names, token)
    return handed[0] if handed else None


def _finished(result: Path) -> bool:
    """A trial's result.json is complete (Harbor writes finished_at when the trial has ended)."""
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("finished_at"))


def _fail_rest(queue: Queue, run_id: str, token: str, reason: str, policy: InfraPolicy, recorded: set[int],
               batch: TrialBatch, handed: list[RunRecord]) -> RunRecord | None:
    """An infrastructure failure of the batch: the trials not recorded yet are requeued (bounded)."""
    if len(recorded) >= len(batch.trials):
        return handed[0] if handed else None
    got = queue.fail_trials(run_id, token, reason, lease_seconds=policy.lease_seconds)
    return got or (handed[0] if handed else None)


def _collect_trial_dirs(run_dir: Path, out: Path, names: Sequence[str], token: str) -> None:
    """Move the batch's Harbor trial dirs to ``run_dir/harbor/<trial>`` (where this host keeps every trial it
    ran; an earlier attempt's dir of the same trial goes to ``attempts/<trial>/``)."""
    for name in names:
        source = out / "harbor" / name
        if not source.is_dir():
            continue
        target = run_dir / "harbor" / name
        if target.exists():
            keep = run_dir / "attempts" / name / f"replaced-by-{token[:12]}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(target), str(keep))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))


def _remove_run_leftovers(run_id: str, config: WorkerConfig | None = None, *, strict: bool = False) -> None:
    """Every trial of the run has ended: nothing of it may still run on the sandbox engine (a batch whose
    worker died leaves its runner container running). Best effort (unless ``strict``): grading goes on
    without Docker."""
    try:
        client = _sandbox(config)
    except (InfraFailure, CheckFailed) as exc:
        if strict:
            raise
        log.warning("run %s: cannot look for leftover containers: %s", run_id, exc)
        return
    try:
        for name in kill_leftovers(client, run_id):
            log.warning("run %s: removed leftover container %s", run_id, name)
    except Exception as exc:
        log.warning("run %s: removing leftover containers failed: %s", run_id, exc)
    finally:
        client.close()


def _pack_evidence(run_id: str, trial_dir: Path) -> bytes | None:
    """The trial's dir packed for the queue (workers on several hosts), or None (logged) when it cannot be."""
    if not trial_dir.is_dir():
        return None
    try:
        return pack_trial_dir(trial_dir)
    except (CheckFailed, OSError) as exc:
        log.warning("run %s: trial %s: its dir is not packed into the queue (%s); only this host keeps it",
                    run_id, trial_dir.name, exc)
        return None


def _ran_here(run_dir: Path, recorded: RecordedTrial) -> bool:
    """The graded attempt ran in a batch of this host's run dir (its trial dir is here, or was)."""
    return recorded.host == socket.gethostname() and Path(recorded.batch_dir).resolve().is_relative_to(run_dir.resolve())


def _adopt_trial_dir(queue: Queue, run_id: str, run_dir: Path, idx: int, recorded: RecordedTrial) -> None:
    """Put the graded attempt's trial dir at ``run_dir/harbor/<trial>``: a dir of this host whose worker
    died before collecting it is moved there; a trial that ran on another host is unpacked from the queue
    (``harbor-origin/<trial>.json`` says from which pack, so a second grading keeps what is there)."""
    trial_name = recorded.trial.trial_name
    target = run_dir / "harbor" / trial_name
    if _ran_here(run_dir, recorded):
        source = Path(recorded.batch_dir) / "harbor" / trial_name
        if source.is_dir() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(target))
        return
    try:
        check_trial_name(trial_name)
    except CheckFailed as exc:
        log.error("run %s: %s", run_id, exc)
        return
    data = queue.trial_evidence(run_id, idx)
    if data is None:
        log.warning("run %s: trial %s ran on %s and its dir is not in the queue: the evidence lacks it",
                    run_id, trial_name, recorded.host)
        return
    digest = hashlib.sha256(data).hexdigest()
    origin = run_dir / "harbor-origin" / f"{trial_name}.json"
    try:
        unpacked_before = json.loads(origin.read_text(encoding="utf-8")).get("sha256") == digest
    except (OSError, ValueError, AttributeError):
        unpacked_before = False
    if unpacked_before and target.is_dir() and not target.is_symlink():
        return
    if target.exists() or target.is_symlink():
        # An earlier attempt of this trial ran here; the graded one ran elsewhere.
        keep = run_dir / "attempts" / trial_name / f"replaced-by-{digest[:12]}"
        if keep.exists():
            shutil.rmtree(keep)
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(target), str(keep))
    try:
        unpack_trial_dir(data, target)
    except CheckFailed as exc:
        log.error("run %s: trial %s: the dir packed on %s is refused: %s", run_id, trial_name, recorded.host, exc)
        return
    atomic_write_json(origin, {"trial_name": trial_name, "host": recorded.host, "batch_dir": recorded.batch_dir,
                               "sha256": digest})


def _batch_container_name(run_id: str, token: str) -> str:
    return f"{CONTAINER_PREFIX}{run_id}-b{token[:12]}"


def _grade_planned(queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None,
                   started: str) -> RunOutcome:
    """Grade a run whose trials have all ended, from the queue's trial rows (every trial exactly once),
    then evidence, finalizer and ONE terminal transaction with the outbox rows."""
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    if record.state == "CLAIMED":
        queue.start(run_id, token)
    _remove_run_leftovers(run_id)
    trials: list[TrialRecord] = []
    failure: str | None = None
    exhausted: list[str] = []
    meta: dict[str, Any] = {}
    for row in queue.trials(run_id):
        if row.result is None:
            trials.append(TrialRecord(task=row.task, trial_name=row.trial_name, agent_name=payload.agent,
                                      outcome="infra_error", reward=None, exception_type="TrialAttemptsExhausted"))
            exhausted.append(f"{row.task} ({row.attempts} attempts; {row.reason or 'no reason recorded'})")
            continue
        recorded = RecordedTrial.parse(row.result, row.task, row.trial_name, payload.agent)
        if isinstance(recorded, TrialRecord):
            log.error("run %s: trial %s has an unreadable record in the queue; graded as an infrastructure error",
                      run_id, row.trial_name)
            trials.append(recorded)
            continue
        _adopt_trial_dir(queue, run_id, run_dir, row.idx, recorded)
        trials.append(recorded.trial)
        failure = failure or recorded.failure
        meta["agent_version"] = meta.get("agent_version") or recorded.agent_version
        meta["model"] = meta.get("model") or recorded.model
    versions = sorted({t.harbor_version for t in trials if t.harbor_version})
    grading = grade_trials(record, policy, tuple(trials), started_at=started, finished_at=_now(), failure=failure,
                           harbor_version=versions[0] if versions else None, agent_version_pin=meta.get("agent_version"),
                           model=meta.get("model"))
    if exhausted:
        # The attempt rules, per trial: a trial whose attempts ran out on infrastructure errors ends the
        # run as INFRA_ERROR with no score; the trials that completed are graded as they are.
        reason = f"trial attempts exhausted: {'; '.join(exhausted)[:1500]}"
        grading = grading.model_copy(update={"status": "INFRA_ERROR", "score": None, "reason": reason})
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "trials.json", {
        "run_id": run_id, "agent": payload.agent, "agent_version": meta.get("agent_version"),
        "harbor_version": grading.harbor_version, "model": meta.get("model"),
        "trials": [{"task": t.task, "trial_name": t.trial_name} for t in trials]})
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    publications: list[PublicationRequest] = []
    if finalize is not None:
        try:
            publications = list(finalize(record, grading, run_dir))
        except Exception as exc:
            log.exception("run %s: finalize failed", run_id)
            if record.finalize_attempts < finalize_claims(record):
                queue.fail_infra(run_id, token, f"finalize failed: {type(exc).__name__}: {exc}")
                return RunOutcome(run_id=run_id, state="QUEUED", grading=None, reason="finalize failed; queued for grading")
            log.error("run %s: finalization tried %d times; completing without publications", run_id,
                      record.finalize_attempts)
    queue.complete(run_id, token, grading, publications)
    digests = sorted({t.runner_digest for t in trials if t.runner_digest})
    return RunOutcome(run_id=run_id, state=grading.status, grading=grading, reason=grading.reason,
                      runner_digest=digests[0] if digests else None)


def _infra(
    queue: Queue, record: RunRecord, token: str, reason: str, started: str, finalize: Finalizer | None, run_dir: Path,
    policy: InfraPolicy, runner: RunnerInfo | None = None,
) -> RunOutcome:
    log.error("run %s attempt %d: %s", record.run_id, record.attempts, reason)
    _copy_evidence(run_dir)
    if record.attempts < record.max_attempts:
        state = queue.fail_infra(record.run_id, token, reason)
        return RunOutcome(run_id=record.run_id, state=state, grading=None, reason=reason)
    # Attempts used up: this worker keeps its lease and finalizes the run now.
    reason = f"attempts exhausted ({record.attempts}); last error: {reason}"
    queue.begin_finalize(record.run_id, token, reason)
    return _finalize(queue, record, token, policy, finalize, reason, started, runner, run_dir)


def exhausted_grading(run_dir: Path, record: RunRecord, policy: InfraPolicy, runner: RunnerInfo, reason: str,
                      *, started_at: str) -> Grading:
    """INFRA_ERROR, no score; the trials of the last attempt that completed are graded as they are."""
    if read_plan(run_dir):
        graded = grade_run(run_dir, record, policy, runner, started_at=started_at, finished_at=_now(), failure=reason)
        return graded.model_copy(update={"status": "INFRA_ERROR", "score": None, "reason": reason})
    return infra_error_grading(record, reason, started_at=started_at, finished_at=_now())


FINALIZE_CLAIMS_MIN = 3


def finalize_claims(record: RunRecord) -> int:
    """How many finalize claims may run the finalizer: a worker that keeps dying there must not block the run forever."""
    return max(record.max_attempts, FINALIZE_CLAIMS_MIN)


def _finalize(
    queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None, reason: str,
    started: str, runner: RunnerInfo | None, run_dir: Path,
) -> RunOutcome:
    """End a run whose attempts are used up, like every other terminal run: grading, evidence, finalizer, ONE complete."""
    grading = exhausted_grading(run_dir, record, policy, runner or RunnerInfo(image_id=None, digest=None), reason,
                                started_at=started)
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    publications: list[PublicationRequest] = []
    allowed = finalize_claims(record)
    if finalize is not None and record.finalize_attempts <= allowed:
        try:
            publications = list(finalize(record, grading, run_dir))
        except Exception as exc:
            log.exception("run %s: finalize failed on a run whose attempts are used up", record.run_id)
            if record.finalize_attempts < allowed:
                # Retried by the next claim (phase finalize); the terminal state waits for its publication.
                queue.fail_infra(record.run_id, token, f"finalize failed: {type(exc).__name__}: {exc}")
                return RunOutcome(run_id=record.run_id, state="QUEUED", grading=None, reason=reason)
            publications = []
    elif finalize is not None:
        # Workers died finalizing this run more often than it has attempts: end it without running the hook again.
        log.error("run %s: finalization tried %d times; completing without publications", record.run_id,
                  record.finalize_attempts)
    queue.complete(record.run_id, token, grading, publications)
    return RunOutcome(run_id=record.run_id, state=grading.status, grading=grading, reason=grading.reason,
                      runner_digest=runner.digest if runner else None)


def _leftover_runner(engines: _Engines, run_id: str, runner: str) -> RunnerInfo:
    """What the dead attempt's runner container ran, if it is still there (never guessed)."""
    containers = engines.sandbox.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    if not containers:
        return RunnerInfo(image_id=None, digest=None)
    return _inspect_runner(engines, containers[0], parse_ref(runner, "payload.runner"))


def _finalize_abandoned(
    queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None
) -> RunOutcome:
    """A run whose final attempt's worker died (or whose finalizer failed): stop what is left of it, then finalize."""
    run_id = record.run_id
    run_dir = queue.run_dir(run_id)
    started = _now()
    queue.start(run_id, token)
    runner = RunnerInfo(image_id=None, digest=None)
    client: Any = None
    try:
        client = _sandbox()
        with contextlib.closing(_docker()) as host:
            runner = _leftover_runner(_Engines(host, client, ""), run_id, record.payload.runner)
        # The dead attempt's runner may still be writing trial results: stop it before grading.
        for name in kill_leftovers(client, run_id):
            log.warning("run %s: removed leftover container %s", run_id, name)
    except Exception as exc:
        if record.finalize_attempts < finalize_claims(record):
            reason = f"finalize: cannot stop the earlier attempt's containers: {type(exc).__name__}: {exc}"
            log.error("run %s: %s", run_id, reason)
            queue.fail_infra(run_id, token, reason)
            return RunOutcome(run_id=run_id, state="QUEUED", grading=None, reason=reason)
        log.error("run %s: cannot stop the earlier attempt's containers (%s); grading what is there", run_id, exc)
    finally:
        if client is not None:
            client.close()
    reason = record.reason or f"attempts exhausted ({record.attempts})"
    return _finalize(queue, record, token, policy, finalize, reason, started, runner, run_dir)


@dataclass(frozen=True)
class _BatchRun:
    """Where one runner container works: its suite (the batch's tasks only), output dir, name and labels."""
    suite_dir: Path
    out_dir: Path
    name: str
    trial_names: tuple[str, ...]
    concurrency: int
    label: str  # batch_label of the batch's lease
    # Called about once a second while the container runs, with what it runs (records finished trials).
    on_poll: Callable[[RunnerInfo], None] | None = None


def _run_container(
    engines: _Engines, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig, policy: InfraPolicy,
    batch: _BatchRun,
) -> tuple[RunnerInfo, str | None, bool]:
    """Run the runner container on one batch; return (what it ran, failure reason or None, released on SIGTERM)."""
    run_id = record.run_id
    command = ["trial", "run", "--suite-dir", str(batch.suite_dir), "--out", str(batch.out_dir), "--run-id", run_id,
               "--concurrency", str(batch.concurrency), "--agent", record.payload.agent]
    # Secrets as 0400 files mounted read-only (never Env/argv), the model relay socket, the agent version pin.
    # The engine socket is a filtering proxy: its own trial containers, binds under run_dir, no pulls
    # (the worker pulled the base by digest already).
    # A model-backed agent's trial containers each get a model gateway (the runner image) as their only way out.
    agent_setup = prepare_runner_agent(policy, record.payload, run_dir=run_dir,
                                       docker_socket=sandbox_url(config).removeprefix("unix://"),
                                       runner_image=engines.runner_id, labels={LABEL_RUN: run_id},
                                       sandbox_user=sandbox.default_sandbox().user)
    try:
        return _run_started_container(engines, record, runner_ref, run_dir, config, command, agent_setup,
                                      policy.suite_timeout(record.payload.suite), batch)
    finally:
        agent_setup.close()
        # What the sandbox wrote (as its user and sub-uids) is the worker's again before anything reads or moves it.
        sandbox.reclaim(batch.out_dir)


def _run_started_container(
    engines: _Engines, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig,
    command: list[str], agent_setup: RunnerAgentSetup, payload_suite_timeout: float, batch: _BatchRun,
) -> tuple[RunnerInfo, str | None, bool]:

    run_id = record.run_id
    out = batch.out_dir
    (out / "logs").mkdir(parents=True, exist_ok=True)
    client = engines.sandbox
    try:
        container = client.containers.run(
            engines.runner_id,  # the same image as runner_ref, by id (sandbox_image)
            command=command + agent_setup.args,
            entrypoint=["benchseal"],  # the image's launcher: pipeline.cli.runner_main (images/runner/image.toml entry)
            name=batch.name,
            labels={LABEL_RUN: run_id, LABEL_TRIALS: ",".join(batch.trial_names), LABEL_BATCH: batch.label,
                    "benchseal.stage": "infra"},
            # DOCKER_BUILDKIT=0: compose builds through /build, which the engine proxy can check (not BuildKit's /grpc).
            environment={"HARBOR_TELEMETRY": "0", "DOCKER_BUILDKIT": "0",
                         **({DISABLE_ENV: ",".join(config.harbor_disable)} if config.harbor_disable else {})},
            volumes={
                str(run_dir): {"bind": str(run_dir), "mode": "rw"},
                **agent_setup.volumes,
            },
            # The runner reaches the engine through the socket, the model through the relay socket, nothing else.
            network_mode="none",
            detach=True,
        )
    except docker.errors.ImageNotFound as exc:
        raise InfraFailure(f"runner image {runner_ref.ref} not found locally: {exc}") from exc
    except docker.errors.APIError as exc:
        raise InfraFailure(f"could not start the runner container: {exc.explanation or exc}") from exc
    deadline = time.monotonic() + payload_suite_timeout
    term_deadline: float | None = None
    failure: str | None = None
    released = False
    exit_code: int | None = None
    try:
        running = _inspect_runner(engines, container, runner_ref) if batch.on_poll is not None else None
        while True:
            try:
                exit_code = int(container.wait(timeout=1)["StatusCode"])
                break
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                pass
            if batch.on_poll is not None and running is not None:
                batch.on_poll(running)
            if (out / "trials.json").is_file():
                agent_setup.drop_secrets()  # read by `trial run` before it plans: no longer on disk
            now = time.monotonic()
            if config.stop.is_set() and term_deadline is None:
                term_deadline = now + config.term_grace_seconds
            if term_deadline is not None and now >= term_deadline:
                container.kill()
                released = True
                break
            if now >= deadline:
                container.kill()
                failure = f"timed out after {payload_suite_timeout:g} s; runner container killed"
                break
        runner = _inspect_runner(engines, container, runner_ref)
        (out / "logs" / "runner.log").write_bytes(container.logs(stdout=True, stderr=True)[-2_000_000:])
        # When the runner started and ended (engine clock): runner start to first trial, in the benchmark.
        state = container.attrs.get("State") or {}
        atomic_write_json(out / "logs" / "runner-state.json",
                          {key: state.get(key) for key in ("StartedAt", "FinishedAt", "ExitCode")})
    finally:
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            log.warning("could not remove runner container %s", container.name)
        if failure or released:
            kill_trial_leftovers(client, run_id, batch.trial_names)
    if exit_code is not None and exit_code != 0 and failure is None and not released:
        if exit_code == 2:
            failure = "trial run rejected its input (exit 2)"
        elif not (out / "trials.json").is_file():
            raise InfraFailure(f"runner container exited {exit_code} before planning trials")
    return runner, failure, released


# --- the loop ------------------------------------------------------------------------

def run_forever(config: WorkerConfig, concurrency: int = 1, finalize: Finalizer | None = None, poll_seconds: float = 2.0) -> None:
    """Run ``concurrency`` claim loops until ``config.stop`` is set."""
    def loop() -> None:
        while not config.stop.is_set():
            try:
                outcome = run_once(config, finalize)
            except Error as exc:
                log.error("worker: %s", exc.diagnostics())
                outcome = None
            except Exception:  # keep the loop alive; the run's lease expires and it is requeued
                log.exception("worker: unexpected error")
                outcome = None
            if outcome is None:
                config.stop.wait(poll_seconds)

    threads = [threading.Thread(target=loop, name=f"worker-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
