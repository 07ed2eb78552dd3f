"""The infra worker: claim a run, run its trials in the runner image (by digest), grade, finish.

One attempt (``run_once``):

1. requeue expired leases, claim the oldest QUEUED run, start a heartbeat thread
   (its failures are logged, never fatal to the trial);
2. pull the runner and base images BY DIGEST and check the local RepoDigests
   list exactly that reference for that repository (refuse otherwise);
3. copy the suite into the run dir, render each task Dockerfile's
   ``FROM benchseal-base`` to the base reference by digest;
4. kill leftovers of earlier attempts of this run (a worker killed with -9
   leaves its runner container behind), then start the runner container by
   digest with an engine socket and the run dir mounted at the same path,
   running ``benchseal trial run``; secrets go in as 0400 files on a read-only
   mount (never Env or argv), the engine socket is the filtering proxy, a model
   agent reaches its endpoint through a relay socket (``pipeline.infra.agents``);
5. wait under the suite timeout (kill on expiry), record what the container ran
   (``docker inspect`` Image + RepoDigests), copy evidence into artifacts/ in
   every outcome, grade from result.json, write grading.json;
6. finalize hook (evidence + signing) then ONE terminal transaction with the
   publication outbox rows; infrastructure errors requeue instead, until the
   attempts are used up (then INFRA_ERROR, no score).

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

from pipeline.contracts import Grading, PublicationRequest, RunState
from pipeline.digests import ImageRef, parse_ref, require_repo_digest
from pipeline.errors import CheckFailed, Error, InfrastructureError, ValidationError
from pipeline.fsutil import atomic_write_json
from pipeline.infra.agents import RunnerAgentSetup, prepare_runner_agent
from pipeline.infra.grading import RunnerInfo, grade_run, infra_error_grading
from pipeline.infra.policy import InfraPolicy, load_policy
from pipeline.infra.queue import RunRecord, SqliteQueue
from pipeline.paths import REPO_ROOT

log = logging.getLogger("benchseal.worker")

Finalizer = Callable[[RunRecord, Grading, Path], Sequence[PublicationRequest]]
BASE_PLACEHOLDER = "benchseal-base"
BASE_LOCK = REPO_ROOT / "images" / "base.lock.json"
CONTAINER_PREFIX = "benchseal-infra-"
LABEL_RUN = "benchseal.infra.run_id"
_FROM_RE = re.compile(r"^\s*FROM\s+(\S+)(.*)$", re.IGNORECASE)


class InfraFailure(Exception):
    """An infrastructure problem during an attempt: the run is requeued."""


@dataclass(frozen=True)
class WorkerConfig:
    db: Path | None = None
    policy: InfraPolicy | None = None
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    suites_dir: Path = REPO_ROOT / "suites"
    # Base image for task environments; default: images/base.lock.json, else pipeline.build.base.ensure_base.
    base_ref: str | None = None
    docker_socket: str = "/var/run/docker.sock"
    heartbeat_seconds: float | None = None  # default: lease_seconds / 3
    term_grace_seconds: float = 30.0
    trial_concurrency: int = 3
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

    try:
        client.api.pull(ref.name, tag=ref.digest)
        image = client.images.get(ref.ref)
    except docker.errors.APIError as exc:
        raise InfraFailure(f"pull {ref.ref} failed: {exc.explanation or exc}") from exc
    require_repo_digest(ref, image.attrs.get("RepoDigests") or [])
    image_id: str = image.id
    return image_id


def resolve_base_ref(config: WorkerConfig, registry: str) -> ImageRef:
    if config.base_ref:
        return parse_ref(config.base_ref, "base_ref")
    if BASE_LOCK.is_file():
        import json

        lock = json.loads(BASE_LOCK.read_text(encoding="utf-8"))
        entry = (lock.get("images") or {}).get("base")
        if entry and entry.get("ref"):
            return parse_ref(entry["ref"], "images/base.lock.json images.base.ref")
    try:
        from pipeline.build.base import ensure_base
    except ImportError as exc:
        raise InfraFailure("no base image: images/base.lock.json is missing and pipeline.build is unavailable") from exc
    refs: dict[str, ImageRef] = ensure_base(registry)
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


# --- containers ------------------------------------------------------------------

def _container_name(run_id: str, attempt: int) -> str:
    return f"{CONTAINER_PREFIX}{run_id}-a{attempt}"


def kill_leftovers(client: Any, run_id: str) -> list[str]:
    """Remove runner containers of earlier attempts of ``run_id`` and the trial containers they started."""
    removed: list[str] = []
    short = re.sub(r"[^a-z0-9]", "", run_id.lower())[-12:]
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}, ignore_removed=True):
        container.remove(force=True)
        removed.append(container.name)
    # Harbor's compose projects are named after the trial names, which end in the run's short id.
    # ignore_removed: unrelated containers may disappear between the list and its inspects.
    for container in client.containers.list(all=True, filters={"label": "com.docker.compose.project"},
                                            ignore_removed=True):
        project = container.labels.get("com.docker.compose.project", "")
        if short and short in project:
            container.remove(force=True)
            removed.append(container.name)
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
    def __init__(self, queue: SqliteQueue, run_id: str, token: str, lease: float, every: float) -> None:
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
    with SqliteQueue(config.db) as queue:
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
            return _attempt(queue, record, token, config, policy, finalize)
        finally:
            beat.done.set()
            beat.join(timeout=5)


def _attempt(
    queue: SqliteQueue, record: RunRecord, token: str, config: WorkerConfig, policy: InfraPolicy, finalize: Finalizer | None
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
        policy.check_image("runner", runner_ref, field="payload.runner")
        client = _docker()
        # A worker killed with -9 leaves its runner container running: stop it
        # before this attempt touches the run dir, so two attempts never overlap.
        for name in kill_leftovers(client, run_id):
            log.warning("run %s: removed leftover container %s", run_id, name)
        _archive_previous_attempt(run_dir, record.attempts)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        pull_by_digest(client, runner_ref)
        base = resolve_base_ref(config, runner_ref.registry)
        pull_by_digest(client, base)
        suite_src = config.suites_dir / payload.suite
        if not suite_src.is_dir():
            raise CheckFailed(f"suite {payload.suite!r} not found under {config.suites_dir}")
        render_suite(suite_src, run_dir / "suite", base)
        runner, failure, released = _run_container(client, record, runner_ref, run_dir, config, policy)
    except ValidationError as exc:
        # The payload no longer passes the policy: retrying cannot help.
        failure = f"rejected: {exc.diagnostics()}"
    except (InfraFailure, CheckFailed, InfrastructureError) as exc:
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir)
    except Exception as exc:  # an unexpected engine/SDK error is still an infrastructure error, never a stuck run
        log.exception("run %s: unexpected error", run_id)
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir)
    finally:
        if client is not None:
            client.close()
    if released:
        queue.release(run_id, token, "worker stopping (SIGTERM)")
        _copy_evidence(run_dir)
        return RunOutcome(run_id=run_id, state="QUEUED", grading=None, reason="released on SIGTERM", runner_digest=runner.digest)
    if failure is None and not (run_dir / "trials.json").is_file():
        return _infra(queue, record, token, "runner produced no trials.json", started, finalize, run_dir)
    if failure is None and runner.digest != runner_ref.digest:
        failure = f"runner container ran {runner.digest}, not {runner_ref.digest}"
    grading = grade_run(run_dir, record, policy, runner, started_at=started, finished_at=_now(), failure=failure)
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    try:
        publications = list(finalize(record, grading, run_dir)) if finalize else []
    except Exception as exc:
        log.exception("run %s: finalize failed", run_id)
        return _infra(queue, record, token, f"finalize failed: {type(exc).__name__}: {exc}", started, None, run_dir)
    queue.complete(run_id, token, grading, publications)
    return RunOutcome(run_id=run_id, state=grading.status, grading=grading, reason=grading.reason, runner_digest=runner.digest)


def _infra(
    queue: SqliteQueue, record: RunRecord, token: str, reason: str, started: str, finalize: Finalizer | None, run_dir: Path
) -> RunOutcome:
    log.error("run %s attempt %d: %s", record.run_id, record.attempts, reason)
    _copy_evidence(run_dir)
    if record.attempts < record.max_attempts:
        state = queue.fail_infra(record.run_id, token, reason)
        return RunOutcome(run_id=record.run_id, state=state, grading=None, reason=reason)
    grading = infra_error_grading(record, f"attempts exhausted ({record.attempts}); last error: {reason}",
                                  started_at=started, finished_at=_now())
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    try:
        publications = list(finalize(record, grading, run_dir)) if finalize else []
    except Exception:
        log.exception("run %s: finalize failed on a terminal INFRA_ERROR; completing without publications", record.run_id)
        publications = []
    queue.complete(record.run_id, token, grading, publications)
    return RunOutcome(run_id=record.run_id, state="INFRA_ERROR", grading=grading, reason=grading.reason)


def _run_container(
    client: Any, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig, policy: InfraPolicy
) -> tuple[RunnerInfo, str | None, bool]:
    """Run the runner container; return (what it ran, failure reason or None, released on SIGTERM)."""
    run_id = record.run_id
    command = ["trial", "run", "--suite-dir", str(run_dir / "suite"), "--out", str(run_dir), "--run-id", run_id,
               "--concurrency", str(config.trial_concurrency), "--agent", record.payload.agent]
    # Secrets as 0400 files mounted read-only (never Env/argv), the model relay socket, the agent version pin.
    # The engine socket is a filtering proxy: its own trial containers, binds under run_dir, no pulls
    # (the worker pulled the base by digest already).
    agent_setup = prepare_runner_agent(policy, record.payload, run_dir=run_dir, docker_socket=config.docker_socket)
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
            environment={"HARBOR_TELEMETRY": "0", "DOCKER_BUILDKIT": "0"},
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
