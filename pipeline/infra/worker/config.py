"""What a worker is given and what one piece of its work reports: ``WorkerConfig``, the ``Finalizer``
hook, ``RunOutcome``, and the two ways an attempt fails (``InfraFailure``: requeued; ``ImageRefused``:
the run fails, unretried)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipeline.attest.images import SigstoreEndpoints
from pipeline.core.contracts import Grading, PublicationRequest, RunState
from pipeline.core.errors import PolicyNotLoaded
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.intake.policy_home import PolicySource
from pipeline.infra.queue.sql import RunRecord, open_queue

Finalizer = Callable[[RunRecord, Grading, Path], Sequence[PublicationRequest]]


KEEP_TASK_IMAGES = 200  # HumanEval's 164 task images stay warm between its runs
# Runner images (one per agent release, each some hundred MB of layers of its own) of sealed runs kept in
# the sandbox engine: a re-run of the last few releases starts warm, and the engine does not grow per release.
KEEP_RUNNER_IMAGES = 3


class InfraFailure(Exception):
    """An infrastructure problem during an attempt: the run is requeued."""


class ImageRefused(Exception):
    """An image does not carry the signatures the policy requires: the run fails, unretried."""


@dataclass(frozen=True)
class WorkerConfig:
    db: Path | None = None
    policy: InfraPolicy | None = None
    # The installed policy file, re-read at every claim (``claim_policy``); over ``policy`` when set.
    policy_source: PolicySource | None = None
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
    # Task images of sealed runs kept in the sandbox engine, most recently used first (pipeline.infra.worker.prune).
    keep_task_images: int = KEEP_TASK_IMAGES
    # Runner images of sealed runs kept in the sandbox engine, most recently used first (the same rule).
    keep_runner_images: int = KEEP_RUNNER_IMAGES
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


def claim_policy(config: WorkerConfig) -> InfraPolicy:
    """The policy a claim runs under: the installed file as it is now (``PolicySource``: PolicyNotLoaded when it
    changed and does not load, recorded beside this worker's heartbeat), else the policy given, else the default
    file."""
    if config.policy_source is not None:
        try:
            return config.policy_source.current()
        except PolicyNotLoaded as exc:
            # Where `infra status` and `doctor host` look (the log says it once); its next claim attempt clears it.
            with open_queue(config.db, url_file=config.queue_url_file) as queue:
                queue.worker_problem(config.worker_id, str(exc))
            raise
    return config.policy or load_policy()


def now_utc() -> str:
    """The current time as gradings and run records carry it (UTC, ISO 8601, ``Z``)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
