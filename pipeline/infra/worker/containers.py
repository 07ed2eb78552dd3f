"""The engines and the runner containers on them: the host engine (pulls by digest, RepoDigests) and the
rootless sandbox engine (everything under test), one runner container per batch (``_run_container``: its
secrets, sockets, timeout and SIGTERM grace) and what it ran (``_inspect_runner``), and the removal of
what earlier attempts or dead workers left behind (``kill_leftovers``, ``kill_trial_leftovers``,
``sweep_orphan_batches``); when a batch ends, everything its runner created on the sandbox engine (containers,
images, volumes: the engine proxy labels them with the batch) goes with it (``remove_batch_objects``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions

from pipeline.core.contracts import trial_short_id
from pipeline.core.digests import ImageRef
from pipeline.core.errors import CLI_ERROR_PREFIX, CheckFailed, InfrastructureError, ValidationError, escape_text
from pipeline.core.fsutil import atomic_write_json
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.queue.sql import Queue, RunRecord
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.agents import RunnerAgentSetup, prepare_runner_agent
from pipeline.infra.sandbox.relay import UsageTally
from pipeline.infra.worker.config import InfraFailure, WorkerConfig
from pipeline.infra.worker.grading import RunnerInfo
from pipeline.runner.tunings import DISABLE_ENV

log = logging.getLogger("benchseal.worker")

CONTAINER_PREFIX = "benchseal-infra-"
SANDBOX_ENGINE_ENV = "BENCHSEAL_SANDBOX_ENGINE"
LABEL_RUN = "benchseal.infra.run_id"
LABEL_TRIALS = "benchseal.infra.trials"  # the trial names a runner container runs (one batch)
LABEL_BATCH = "benchseal.infra.batch"  # queue.batch_label(lease token) of that batch


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


@dataclass(frozen=True)
class _Engines:
    """The host engine (pulls by digest, RepoDigests) and the sandbox engine (runs everything)."""

    host: Any
    sandbox: Any
    runner_id: str  # the runner image's id in the sandbox (sandbox_image)


def _remove_container(client: Any, container: Any, removed: list[str]) -> None:
    """``container`` gone with its anonymous volumes (SIGKILL first when it runs)."""
    try:
        container.remove(force=True, v=True)
        removed.append(str((container.attrs.get("Names") or [container.id])[0]).lstrip("/"))
    except docker.errors.NotFound:
        pass  # gone between listing and removal (its own teardown, or another worker's)


def _remove_images_and_volumes(client: Any, label: str, removed: list[str]) -> None:
    """Images and volumes labelled ``label`` (``key=value``): what a runner built or created through the engine
    proxy. An image another run's container still runs on stays (the engine refuses); the run's end removes it."""
    for image in client.images.list(filters={"label": label}):
        try:
            client.images.remove(image.id, force=True)  # its tags and the build's untagged parents too
            removed.append(f"image {image.id}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("could not remove image %s (%s): %s", image.id, label, exc.explanation or exc)
    for volume in client.volumes.list(filters={"label": label}):
        try:
            volume.remove(force=True)
            removed.append(f"volume {volume.name}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("could not remove volume %s (%s): %s", volume.name, label, exc.explanation or exc)


def remove_batch_objects(client: Any, batch_label: str) -> list[str]:
    """Everything labelled with the batch (its runner container, the trial containers, model gateways, images
    and volumes the runner created through the engine proxy, which sets the label over the runner's own):
    the sandbox keeps nothing of a finished batch for a later run to find."""
    removed: list[str] = []
    wanted = f"{LABEL_BATCH}={batch_label}"
    for container in client.containers.list(all=True, sparse=True, filters={"label": wanted}):
        _remove_container(client, container, removed)
    _remove_images_and_volumes(client, wanted, removed)
    return removed


def kill_leftovers(client: Any, run_id: str) -> list[str]:
    """Remove runner containers of earlier attempts of ``run_id``, the trial containers they started, and the
    images and volumes they created."""
    removed: list[str] = []
    short = trial_short_id(run_id)

    def remove(container: Any) -> None:
        _remove_container(client, container, removed)

    # sparse=True: no per-container inspect while listing, which races with containers that
    # other runs on this engine remove meanwhile.
    for container in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_RUN}={run_id}"}):
        remove(container)
    # Harbor's compose projects are named after the trial names, which end in the run's short id.
    for container in client.containers.list(all=True, sparse=True, filters={"label": "com.docker.compose.project"}):
        project = (container.attrs.get("Labels") or {}).get("com.docker.compose.project", "")
        if short and short in project:
            remove(container)
    _remove_images_and_volumes(client, f"{LABEL_RUN}={run_id}", removed)
    return removed


def sweep_orphan_batches(client: Any, queue: Queue) -> list[str]:
    """Remove runner containers on this engine whose batch no longer holds a lease (its worker died
    and the trials were retried elsewhere, or ended): with nobody waiting on them they would run on
    unbounded. A batch still holding its lease (another worker of this host) is left alone."""
    removed: list[str] = []
    seen: set[str] = set()
    # Runner containers first: one of them names the trials its batch ran (trial containers and gateways
    # carry the batch label too, since the engine proxy sets it).
    found = client.containers.list(all=True, sparse=True, filters={"label": LABEL_BATCH})
    for container in sorted(found, key=lambda c: LABEL_TRIALS not in (c.attrs.get("Labels") or {})):
        labels = container.attrs.get("Labels") or {}
        run_id, label = labels.get(LABEL_RUN), labels.get(LABEL_BATCH)
        if not run_id or not label or label in seen or label in queue.held_batches(str(run_id)):
            continue
        seen.add(str(label))
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
        _remove_container(client, container, removed)

    if only_batch is not None:
        removed += remove_batch_objects(client, only_batch)
    found = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    runners = [c for c in found if LABEL_TRIALS in (c.attrs.get("Labels") or {})]
    doomed = [c for c in runners
              if {n.lower() for n in str(c.attrs["Labels"][LABEL_TRIALS]).split(",") if n} & wanted]
    # A batch whose runner still runs other trials keeps its trial containers and gateways.
    live = {(c.attrs.get("Labels") or {}).get(LABEL_BATCH) for c in runners if c not in doomed} - {None}
    for container in found if only_batch is None else []:
        labels = container.attrs.get("Labels") or {}
        if container in doomed or (container not in runners and labels.get(LABEL_BATCH) not in live):
            remove(container)
    for container in client.containers.list(all=True, sparse=True, filters={"label": "com.docker.compose.project"}):
        project = (container.attrs.get("Labels") or {}).get("com.docker.compose.project", "").lower()
        if any(name in project for name in wanted):
            remove(container)
    return removed


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


def _batch_container_name(run_id: str, token: str) -> str:
    return f"{CONTAINER_PREFIX}{run_id}-b{token[:12]}"


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


@dataclass(frozen=True)
class _BatchRun:
    """Where one runner container works: its suite (the batch's tasks only), output dir, name and labels."""
    suite_dir: Path
    out_dir: Path
    name: str
    trial_names: tuple[str, ...]
    concurrency: int
    label: str  # batch_label of the batch's lease
    attempts: int = 1  # trials per task the run was planned with (the suite's ``attempts``)
    # Called about once a second while the container runs, with what it runs (records finished trials).
    on_poll: Callable[[RunnerInfo], None] | None = None
    # Where the model relays count the batch's model usage (the recorder's: it outlives the relays).
    usage: UsageTally | None = None
    # The worker's readiness marks (``pipeline.runner.readiness``): a task's trials wait for its mark. None: all
    # of the batch's task images were ready before the runner started.
    ready_dir: Path | None = None
    # Polled with on_poll: a reason to stop the runner now (a task image's build failed), or None.
    abort: Callable[[], str | None] | None = None


def _run_container(
    engines: _Engines, record: RunRecord, runner_ref: ImageRef, run_dir: Path, config: WorkerConfig, policy: InfraPolicy,
    batch: _BatchRun,
) -> tuple[RunnerInfo, str | None, bool]:
    """Run the runner container on one batch; return (what it ran, failure reason or None, released on SIGTERM)."""
    run_id = record.run_id
    command = ["trial", "run", "--suite-dir", str(batch.suite_dir), "--out", str(batch.out_dir), "--run-id", run_id,
               "--concurrency", str(batch.concurrency), "--agent", record.payload.agent]
    if batch.attempts > 1:
        # The batch's suite dir says which tasks it runs, not which of their attempts: name them. Left out
        # with one attempt per task, so the command is what a runner from before attempts accepts.
        command += ["--attempts", str(batch.attempts), *(arg for name in batch.trial_names for arg in ("--trial", name))]
    if batch.ready_dir is not None:
        command += ["--ready-dir", str(batch.ready_dir)]
    artifact = record.payload.agent_artifact
    if artifact is not None and artifact.kind == "python":
        # A Python release agent runs in a container of its own, of this same image (pipeline.runner.agent_box).
        command += ["--agent-image", engines.runner_id]
    # Secrets as 0400 files mounted read-only (never Env/argv), the model relay socket, the agent version pin.
    # The engine socket is a filtering proxy: its own trial containers, binds under run_dir, no pulls
    # (the worker pulled the base by digest already).
    # A model-backed agent's trial containers each get a model gateway (the runner image) as their only way out.
    agent_setup = prepare_runner_agent(policy, record.payload, run_dir=run_dir,
                                       docker_socket=sandbox_url(config).removeprefix("unix://"),
                                       runner_image=engines.runner_id,
                                       labels={LABEL_RUN: run_id, LABEL_BATCH: batch.label},
                                       sandbox_user=sandbox.default_sandbox().user, usage=batch.usage,
                                       granted=batch.out_dir)
    try:
        return _run_started_container(engines, record, runner_ref, run_dir, config, command, agent_setup,
                                      policy.suite_timeout(record.payload.suite), batch)
    finally:
        agent_setup.close()
        # What the sandbox wrote (as its user and sub-uids) is the worker's again before anything reads or moves it.
        sandbox.reclaim(batch.out_dir)


def _runner_error(log_path: Path) -> str:
    """``: <the runner's one-line error>`` (its CLI prints ``CLI_ERROR_PREFIX`` + the error), or nothing."""
    try:
        lines = log_path.read_bytes()[-8192:].decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    errors = [line.removeprefix(CLI_ERROR_PREFIX) for line in lines if line.startswith(CLI_ERROR_PREFIX)]
    return f": {escape_text(errors[-1][:500])}" if errors else ""


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
            stop = batch.abort() if batch.abort is not None else None
            if stop is not None:
                container.kill()
                failure = stop
                break
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
            container.remove(force=True, v=True)
        except docker.errors.APIError:
            log.warning("could not remove runner container %s", container.name)
        if failure or released:
            kill_trial_leftovers(client, run_id, batch.trial_names)
        try:  # whatever the batch's runner made on the engine, however it ended
            for name in remove_batch_objects(client, batch.label):
                log.info("run %s: removed %s, left by its batch", run_id, name)
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            log.warning("run %s: removing what its batch left failed: %s", run_id, exc)
    if exit_code is not None and exit_code != 0 and failure is None and not released:
        if exit_code == 2:
            failure = "trial run rejected its input (exit 2)" + _runner_error(out / "logs" / "runner.log")
        elif not (out / "trials.json").is_file():
            raise InfraFailure(f"runner container exited {exit_code} before planning trials"
                               + _runner_error(out / "logs" / "runner.log"))
    return runner, failure, released
