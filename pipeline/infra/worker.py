"""The infra worker: claim a run, run its trials in the runner image (by digest), grade, finish.

One attempt (``run_once``):

1. remove the secret files and sockets that dead workers on this host left behind
   (``agents.reap_private_dirs``), requeue expired leases, claim the oldest QUEUED run,
   start a heartbeat thread (its failures are logged, never fatal to the trial);
2. pull the runner and base images BY DIGEST and check the local RepoDigests
   list exactly that reference for that repository (refuse otherwise);
3. copy the suite into the run dir, render each task Dockerfile's
   ``FROM benchseal-base`` to the base reference by digest;
4. kill leftovers of earlier attempts of this run (a worker killed with -9
   leaves its runner container behind), then start the runner container by
   digest with an engine socket and the run dir mounted at the same path,
   running ``benchseal trial run``; secrets go in as 0400 files on a read-only
   mount (never Env or argv), the engine socket is the filtering proxy (trial
   containers: network none, or a model agent's per-container model gateway), a model
   agent reaches its endpoint through a relay socket (``pipeline.infra.agents``);
5. wait under the suite timeout (kill on expiry), record what the container ran
   (``docker inspect`` Image + RepoDigests), copy evidence into artifacts/ in
   every outcome, grade from result.json, write grading.json;
6. finalize hook (evidence + signing) then ONE terminal transaction with the
   publication outbox rows; infrastructure errors requeue instead, until the
   attempts are used up (then INFRA_ERROR, no score).

Attempts used up, by an infrastructure error or by a worker that died on the
final attempt (its lease expired): the run is finalized like every other
terminal run. Whatever trials completed are graded (INFRA_ERROR, no score),
the evidence is copied, the finalizer runs, and ``complete`` writes the terminal
state with its outbox rows in one transaction. A dead worker's run is finalized
by the next worker that claims it (phase ``finalize``), after it stopped the
dead attempt's containers.

SIGTERM: the running attempt is given ``term_grace_seconds`` to finish, then its
container is killed and the lease released (the attempt is not counted).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.attest import SigstoreEndpoints
from pipeline.contracts import DispatchPayload, Grading, PublicationRequest, RunState, trial_short_id
from pipeline.digests import ImageRef, parse_ref, require_repo_digest
from pipeline.documents import base_lock_path, read_base_lock
from pipeline.errors import CheckFailed, Error, InfrastructureError, ValidationError
from pipeline.fsutil import atomic_write_json
from pipeline.infra.agents import RunnerAgentSetup, prepare_runner_agent, reap_private_dirs
from pipeline.infra.grading import RunnerInfo, grade_run, infra_error_grading, read_plan
from pipeline.infra.policy import InfraPolicy, SourcePolicy, load_policy
from pipeline.infra.queue import Queue, RunRecord, open_queue
from pipeline.infra.trial import DISABLE_ENV
from pipeline.paths import REPO_ROOT

log = logging.getLogger("benchseal.worker")

Finalizer = Callable[[RunRecord, Grading, Path], Sequence[PublicationRequest]]
BASE_PLACEHOLDER = "benchseal-base"
CONTAINER_PREFIX = "benchseal-infra-"
LABEL_RUN = "benchseal.infra.run_id"
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
    docker_socket: str = "/var/run/docker.sock"
    heartbeat_seconds: float | None = None  # default: lease_seconds / 3
    term_grace_seconds: float = 30.0
    trial_concurrency: int | None = None  # default: the suite's trial_concurrency in the policy
    # Build each task's environment image once (cached by content) and hand it to Harbor by
    # image id, so no trial runs `compose build`; False leaves the builds to Harbor (bench ablation).
    prebuild_task_images: bool = True
    # Names of pipeline.infra.trial.TUNINGS to turn off in the runner (bench ablation only).
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
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise InfraFailure(f"Docker Engine unavailable: {exc}") from exc
    return client


def pull_by_digest(client: Any, ref: ImageRef) -> str:
    """Pull ``ref`` by digest; return the local image id once RepoDigests contains exactly ``ref``."""
    import docker.errors

    from pipeline.registry_auth import docker_auth_config

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


def signer_identities(payload: DispatchPayload, source: SourcePolicy) -> list[Any]:
    """The identities ``source``'s policy admits for ``payload`` (``sources[].signer``), in policy order."""
    from pipeline.attest import ImageIdentityPolicy

    identities = []
    for signer in source.signer:
        if signer.ref == "tag":
            identities.append(ImageIdentityPolicy.release_workflow(source.repository, payload.source.tag,
                                                                   signer.workflow))
        else:
            # An explicit ref does not name the payload's release: the signing run must have run at
            # the payload's commit (the certificate's GitHub workflow SHA).
            identities.append(ImageIdentityPolicy.release_workflow(
                source.repository, payload.source.tag, signer.workflow, ref=signer.ref, commit=payload.source.commit))
    return identities


def require_signed_images(payload: DispatchPayload, source: SourcePolicy, trust: SigstoreEndpoints) -> None:
    """Raise ImageRefused unless the runner and the api each carry a signature and the SLSA
    provenance and CycloneDX attestations of ONE identity ``source``'s policy admits (its release
    workflow at the payload's tag, or at an exact ref the policy names), checked by cosign for the
    exact digest, before anything pulled is used."""
    from pipeline.attest import verify_image

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
                refusals.append(f"{expected.identity}{f' at commit {expected.sha}' if expected.sha else ''}: {exc}")
                continue
            break
        else:
            raise ImageRefused(f"{role} {ref.ref} is not signed by "
                               + " nor ".join(e.identity for e in admitted) + ": " + "; ".join(refusals))


def resolve_base_ref(config: WorkerConfig, runner: ImageRef) -> ImageRef:
    """The task environments' base: ``config.base_ref``, else the base lock (``$BENCHSEAL_BASE_LOCK`` or
    images/base.lock.json), else built now under the configured image names (pipeline.imaging.names), or,
    when none are configured, beside the runner (``<prefix>runner`` -> ``<prefix>base``)."""
    from pipeline.imaging.base import ensure_base
    from pipeline.imaging.names import PREFIX_ENV, ImageNames, configured_names

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


def render_suite(source: Path, target: Path, base: ImageRef) -> None:
    """Copy a suite and point every task Dockerfile's placeholder FROM at ``base`` (by digest)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, symlinks=False)
    for dockerfile in sorted(target.glob("*/environment/Dockerfile")) + sorted(target.glob("*/tests/Dockerfile")):
        lines = dockerfile.read_text(encoding="utf-8").splitlines(keepends=True)
        out = []
        for line in lines:
            match = _FROM_RE.match(line)
            if match:
                if match.group(1) != BASE_PLACEHOLDER:
                    raise CheckFailed(f"{dockerfile}: FROM {match.group(1)} is not the {BASE_PLACEHOLDER} placeholder")
                line = f"FROM {base.ref}{match.group(2)}\n"
            out.append(line)
        dockerfile.write_text("".join(out), encoding="utf-8")


TASK_IMAGE_LABEL = "benchseal.task.hash"
_TASK_IMAGE_VERSION = "benchseal-task-image/1"


def _task_context_hash(env_dir: Path) -> str:
    """sha256 over a task environment dir: relative paths, exec bits, contents (the FROM line pins the base)."""
    import hashlib

    h = hashlib.sha256(_TASK_IMAGE_VERSION.encode() + b"\n")
    for path in sorted(p for p in env_dir.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(env_dir).as_posix()
        if path.is_symlink():
            raise CheckFailed(f"{path}: task environment files must not be symlinks")
        h.update(_json_line(rel, bool(path.stat().st_mode & 0o111), hashlib.sha256(path.read_bytes()).hexdigest()))
    return h.hexdigest()


def _json_line(*items: object) -> bytes:
    import json

    return json.dumps(list(items)).encode() + b"\n"


def prebuild_task_images(client: Any, suite_dir: Path) -> dict[str, str]:
    """Build each task's environment image once and pin it in the rendered task.toml by image id.

    The image id is the sha256 of the image config (content-addressed). Images are found
    again by the label ``benchseal.task.hash`` (a hash of the rendered environment dir,
    whose FROM names the base by digest), so a warm run builds nothing. Tasks that already
    name a ``docker_image`` or have no Dockerfile are left to Harbor. Returns {task: image id}.
    """
    import tomllib

    import docker.errors

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
    import tomllib

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

def _container_name(run_id: str, attempt: int) -> str:
    return f"{CONTAINER_PREFIX}{run_id}-a{attempt}"


def kill_leftovers(client: Any, run_id: str) -> list[str]:
    """Remove runner containers of earlier attempts of ``run_id`` and the trial containers they started."""
    import docker.errors

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


def _inspect_runner(client: Any, container: Any, expected: ImageRef) -> RunnerInfo:
    container.reload()
    image_id = container.attrs.get("Image")
    digest = None
    try:
        image = client.images.get(image_id)
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

    def run(self) -> None:
        while not self.done.wait(self._every):
            try:
                if not self._queue.heartbeat(self._run_id, self._token, self._lease):
                    self.lost = True
                    log.error("run %s: lease lost", self._run_id)
            except Exception as exc:  # a failed heartbeat must never kill the trial
                self.failures += 1
                log.warning("run %s: heartbeat failed: %s", self._run_id, exc)


def _copy_evidence(run_dir: Path) -> None:
    """Copy Harbor trial dirs and logs into artifacts/ (every outcome)."""
    artifacts = run_dir / "artifacts"
    for name in ("harbor", "logs"):
        source = run_dir / name
        if source.is_dir():
            target = artifacts / "evidence" / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target, symlinks=True, ignore_dangling_symlinks=True)
    for name in ("trials.json", "grading.json"):
        if (run_dir / name).is_file():
            (artifacts / "evidence").mkdir(parents=True, exist_ok=True)
            shutil.copy2(run_dir / name, artifacts / "evidence" / name)


def _archive_previous_attempt(run_dir: Path, attempt: int) -> None:
    previous = run_dir / "harbor"
    if previous.exists():
        target = run_dir / "attempts" / str(max(attempt - 1, 0))
        target.mkdir(parents=True, exist_ok=True)
        for name in ("harbor", "trials.json", "logs"):
            if (run_dir / name).exists():
                shutil.move(str(run_dir / name), str(target / name))


# --- one attempt -----------------------------------------------------------------

def run_once(config: WorkerConfig, finalize: Finalizer | None = None) -> RunOutcome | None:
    """Claim one run and take it through one attempt; None when nothing was queued."""
    policy = config.policy or load_policy()
    # Secret files and sockets of attempts whose worker died (kill -9) on this host: gone before any claim.
    reap_private_dirs()
    with open_queue(config.db, url_file=config.queue_url_file) as queue:
        for run_id in queue.requeue_expired():
            log.warning("run %s: lease expired; requeued or ended", run_id)
        if config.stop.is_set():
            return None
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
            if record.phase == "finalize":
                return _finalize_abandoned(queue, record, token, policy, finalize)
            return _attempt(queue, record, token, config, policy, finalize)
        finally:
            beat.done.set()
            beat.join(timeout=5)


def _attempt(
    queue: Queue, record: RunRecord, token: str, config: WorkerConfig, policy: InfraPolicy, finalize: Finalizer | None
) -> RunOutcome:
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    started = _now()
    queue.start(run_id, token)
    runner = RunnerInfo(image_id=None, digest=None)
    failure: str | None = None
    released = False
    client: Any = None
    try:
        runner_ref = parse_ref(payload.runner, "payload.runner")
        source = policy.check_payload(payload)  # the repository and both images, as accept checked them
        client = _docker()
        # A worker killed with -9 leaves its runner container running: stop it
        # before this attempt touches the run dir, so two attempts never overlap.
        for name in kill_leftovers(client, run_id):
            log.warning("run %s: removed leftover container %s", run_id, name)
        _archive_previous_attempt(run_dir, record.attempts)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        pull_by_digest(client, runner_ref)  # a missing runner stays an infrastructure error (retried)
        require_signed_images(payload, source, config.image_trust)  # before anything pulled is used
        base = resolve_base_ref(config, runner_ref)
        pull_by_digest(client, base)
        suite_src = config.suites_dir / payload.suite
        if not suite_src.is_dir():
            raise CheckFailed(f"suite {payload.suite!r} not found under {config.suites_dir}")
        render_suite(suite_src, run_dir / "suite", base)
        if config.prebuild_task_images:
            prebuild_task_images(client, run_dir / "suite")
        runner, failure, released = _run_container(client, record, runner_ref, run_dir, config, policy)
    except ValidationError as exc:
        # The payload no longer passes the policy: retrying cannot help.
        failure = f"rejected: {exc.diagnostics()}"
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
    if released:
        queue.release(run_id, token, "worker stopping (SIGTERM)")
        _copy_evidence(run_dir)
        return RunOutcome(run_id=run_id, state="QUEUED", grading=None, reason="released on SIGTERM", runner_digest=runner.digest)
    if failure is None and not (run_dir / "trials.json").is_file():
        return _infra(queue, record, token, "runner produced no trials.json", started, finalize, run_dir, policy, runner)
    if failure is None and runner.digest != runner_ref.digest:
        failure = f"runner container ran {runner.digest}, not {runner_ref.digest}"
    grading = grade_run(run_dir, record, policy, runner, started_at=started, finished_at=_now(), failure=failure)
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    try:
        publications = list(finalize(record, grading, run_dir)) if finalize else []
    except Exception as exc:
        log.exception("run %s: finalize failed", run_id)
        return _infra(queue, record, token, f"finalize failed: {type(exc).__name__}: {exc}", started, finalize, run_dir,
                      policy, runner)
    queue.complete(run_id, token, grading, publications)
    return RunOutcome(run_id=run_id, state=grading.status, grading=grading, reason=grading.reason, runner_digest=runner.digest)


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


def _leftover_runner(client: Any, run_id: str, runner: str) -> RunnerInfo:
    """What the dead attempt's runner container ran, if it is still there (never guessed)."""
    containers = client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    if not containers:
        return RunnerInfo(image_id=None, digest=None)
    return _inspect_runner(client, containers[0], parse_ref(runner, "payload.runner"))


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
        client = _docker()
        runner = _leftover_runner(client, run_id, record.payload.runner)
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


def _run_container(
    client: Any, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig, policy: InfraPolicy
) -> tuple[RunnerInfo, str | None, bool]:
    """Run the runner container; return (what it ran, failure reason or None, released on SIGTERM)."""
    run_id = record.run_id
    command = ["trial", "run", "--suite-dir", str(run_dir / "suite"), "--out", str(run_dir), "--run-id", run_id,
               "--concurrency", str(config.trial_concurrency or policy.trial_concurrency(record.payload.suite)),
               "--agent", record.payload.agent]
    # Secrets as 0400 files mounted read-only (never Env/argv), the model relay socket, the agent version pin.
    # The engine socket is a filtering proxy: its own trial containers, binds under run_dir, no pulls
    # (the worker pulled the base by digest already).
    # A model-backed agent's trial containers each get a model gateway (the runner image) as their only way out.
    agent_setup = prepare_runner_agent(policy, record.payload, run_dir=run_dir, docker_socket=config.docker_socket,
                                       runner_image=runner_ref.ref, labels={LABEL_RUN: run_id})
    try:
        return _run_started_container(client, record, runner_ref, run_dir, config, command, agent_setup,
                                      policy.suite_timeout(record.payload.suite))
    finally:
        agent_setup.close()


def _run_started_container(
    client: Any, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig,
    command: list[str], agent_setup: RunnerAgentSetup, payload_suite_timeout: float,
) -> tuple[RunnerInfo, str | None, bool]:
    import docker.errors
    import requests.exceptions

    run_id = record.run_id
    try:
        container = client.containers.run(
            runner_ref.ref,
            command=command + agent_setup.args,
            entrypoint=["python3", "-m", "pipeline"],
            name=_container_name(run_id, record.attempts),
            labels={LABEL_RUN: run_id, "benchseal.stage": "infra"},
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
        while True:
            try:
                exit_code = int(container.wait(timeout=1)["StatusCode"])
                break
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                pass
            if (run_dir / "trials.json").is_file():
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
        runner = _inspect_runner(client, container, runner_ref)
        (run_dir / "logs" / "runner.log").write_bytes(container.logs(stdout=True, stderr=True)[-2_000_000:])
        # When the runner started and ended (engine clock): runner start to first trial, in the benchmark.
        state = container.attrs.get("State") or {}
        atomic_write_json(run_dir / "logs" / "runner-state.json",
                          {key: state.get(key) for key in ("StartedAt", "FinishedAt", "ExitCode")})
    finally:
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            log.warning("could not remove runner container %s", container.name)
        if failure or released:
            kill_leftovers(client, run_id)
    if exit_code is not None and exit_code != 0 and failure is None and not released:
        if exit_code == 2:
            failure = "trial run rejected its input (exit 2)"
        elif not (run_dir / "trials.json").is_file():
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
