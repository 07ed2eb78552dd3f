"""``benchseal worker``: claim queued runs and run their Harbor trials in the runner image.

By default (``--publish none``, what deploy/benchseal-worker.service runs) the worker grades
and signs nothing: benchmark.yml's seal job exports the graded run and seals it with the
infra workflow's identity. With ``--publish github|local`` each terminal run also gets signed
evidence and a publication outbox row (same transaction as the terminal state): with
``--signer local`` (the private instance, only when asked for) or, inside a GitHub Actions job,
``--signer ambient``; outside Actions the ambient signer is refused at startup, before a run is
claimed. ``--with-publisher`` delivers the outbox beside the worker. Exit codes: 0 stopped
cleanly; 1 a failed check; 2 usage error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from pipeline.cli.attest import sigstore_endpoints
from pipeline.cli.signers import SignerKind, signer_factory
from pipeline.core import paths
from pipeline.core.errors import UsageError
from pipeline.infra.queue.sql import QUEUE_URL_FILE_ENV, open_queue
from pipeline.infra.sandbox import engine as sandbox

PublishTarget = Literal["none", "github", "local"]


def worker(
    once: Annotated[bool, typer.Option("--once", help="Take one piece of work (a run to plan or grade, or a batch of trials and more of the same run), then exit.")] = False,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=8, help="Claim loops (runs or trial batches) handled in parallel.")] = 1,
    trial_batch: Annotated[int | None, typer.Option("--trial-batch", min=1, max=64, help="Trials claimed at once and run in one runner container (default: the suite's trial_concurrency).")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="SQLite queue database (default: state dir infra/queue.sqlite3; not with a PostgreSQL queue URL).")] = None,
    queue_url_file: Annotated[Path | None, typer.Option("--queue-url-file", help="File holding the PostgreSQL queue URL (also BENCHSEAL_QUEUE_URL_FILE or BENCHSEAL_QUEUE_URL; never the URL itself in argv).")] = None,
    policy_path: Annotated[Path | None, typer.Option("--policy", help="Infra policy (default: policies/infra.yaml).")] = None,
    base_ref: Annotated[str | None, typer.Option("--base-ref", help="Task base image by digest (default: images/base.lock.json).")] = None,
    suites_dir: Annotated[Path | None, typer.Option("--suites-dir", help="Where suites live (default: <repo>/suites).")] = None,
    term_grace: Annotated[float, typer.Option("--term-grace", min=0, help="Seconds a run may finish after SIGTERM before its lease is released.")] = 30.0,
    publish: Annotated[PublishTarget, typer.Option("--publish", help="Write signed evidence and queue its publication to this target (none: grade only).")] = "none",
    signer: Annotated[SignerKind, typer.Option("--signer", help="ambient (= auto): the environment's GitHub Actions OIDC token, nothing else; local: the private Sigstore instance, only when asked for.")] = "auto",
    local_root: Annotated[Path | None, typer.Option("--local-root", help="Root of the local target (default dist/releases).")] = None,
    api_url: Annotated[str | None, typer.Option("--api-url", help="GitHub API URL stored in publication rows (default $GITHUB_API_URL).")] = None,
    with_publisher: Annotated[bool, typer.Option("--with-publisher", help="Deliver the outbox in a thread beside the worker.")] = False,
    publish_interval: Annotated[float, typer.Option("--publish-interval", min=0.1, help="Seconds between outbox scans.")] = 10.0,
    sigstore_url: Annotated[str | None, typer.Option("--sigstore-url", envvar="BENCHSEAL_SIGSTORE_URL", help="Check image signatures against a private Sigstore instance (http://127.0.0.1:PORT); default public-good.")] = None,
    trusted_root: Annotated[Path | None, typer.Option("--trusted-root", envvar="BENCHSEAL_TRUSTED_ROOT", help="The private instance's trusted_root.json (with --sigstore-url).")] = None,
    keep_task_images: Annotated[int | None, typer.Option("--keep-task-images", min=0, help="Task images of sealed runs kept in the sandbox engine, most recently used first; the rest are pruned after each sealed run (default 200; docs/datasets.md, Pruning).")] = None,
    keep_runner_images: Annotated[int | None, typer.Option("--keep-runner-images", min=0, help="Runner images of sealed runs kept in the sandbox engine, most recently used first; the rest are pruned after each sealed run (default 3; docs/datasets.md, Pruning).")] = None,
    sandbox_engine: Annotated[str | None, typer.Option("--sandbox-engine", envvar="BENCHSEAL_SANDBOX_ENGINE", help="The rootless engine everything under test runs on (unix://PATH; default: benchseal sandbox's socket). Refused unless it answers and is rootless.")] = None,
) -> None:
    """Run the worker loop (SIGTERM/SIGINT: finish or release the current run, then exit)."""
    # lazy: pipeline.infra.worker.loop (docker, sigstore, harbor) costs 891 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.infra.intake.policy_home import PolicySource
    from pipeline.infra.worker.dataset import check_policy_datasets
    from pipeline.infra.worker.loop import WorkerConfig, run_forever, run_once

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _require_signer_credential(publish, signer)
    runs_dir = _open_queue_first(db, queue_url_file)
    engine = _checked_sandbox_engine(sandbox_engine, runs_dir)

    # The installed policy, re-read at every claim: a policy installed later is used without a restart.
    source = PolicySource(policy_path)
    policy = source.current()
    config = WorkerConfig(db=db, policy=policy, policy_source=source, base_ref=base_ref, term_grace_seconds=term_grace,
                          image_trust=sigstore_endpoints(sigstore_url, trusted_root), trial_batch=trial_batch,
                          sandbox_engine=engine)
    if keep_task_images is not None:
        config = dataclasses.replace(config, keep_task_images=keep_task_images)
    if keep_runner_images is not None:
        config = dataclasses.replace(config, keep_runner_images=keep_runner_images)
    if suites_dir is not None:
        config = dataclasses.replace(config, suites_dir=suites_dir)
    check_policy_datasets(policy, config.suites_dir)  # each suite's dataset is the bytes its digest pins, or no work
    finalize = _finalizer(publish, signer, local_root=local_root, api_url=api_url)

    def _stop(signum: int, _frame: object) -> None:
        config.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if once:
        outcome = run_once(config, finalize)
        if outcome is None:
            typer.echo(json.dumps({"run_id": None, "state": None}))
            return
        typer.echo(json.dumps({"run_id": outcome.run_id, "state": outcome.state, "reason": outcome.reason,
                               "score": outcome.grading.score if outcome.grading else None}, sort_keys=True))
        return
    publisher = None
    if with_publisher:
        # lazy: pipeline.publish.service (sigstore, PyGithub) costs 475 ms at CLI start (bench/cli.py, 2026-12-03)
        from pipeline.publish.service import start_publisher

        publisher = start_publisher(db, config.stop, publish_interval)
    run_forever(config, concurrency=concurrency, finalize=finalize)
    if publisher is not None:
        publisher.join()


def _require_signer_credential(publish: PublishTarget, signer: SignerKind) -> None:
    """With --publish, an ambient signer needs the Actions OIDC credential: refused before a run is claimed."""
    if publish != "none" and signer != "local" and not (
            os.environ.get("GITHUB_ACTIONS") == "true" and os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL")):
        # Refused before a run is claimed: an ambient signer without a token would only turn every
        # run into a retried infrastructure error.
        raise UsageError(f"--publish {publish} --signer {signer} needs the GitHub Actions OIDC credential, and this "
                         "process has none: run the worker without --publish (it grades; benchmark.yml's seal job "
                         "seals and publishes) or with --signer local for the private instance")


def _open_queue_first(db: Path | None, queue_url_file: Path | None) -> Path:
    """Open the queue once before the loop starts; returns its runs directory."""
    if queue_url_file is not None:
        if os.environ.get(QUEUE_URL_FILE_ENV):
            raise UsageError(f"--queue-url-file and {QUEUE_URL_FILE_ENV} both name a queue URL file: give exactly one")
        # Through the environment, so the publisher thread opens the same queue (never SQLite by default).
        os.environ[QUEUE_URL_FILE_ENV] = str(queue_url_file.resolve())
    # Fail before the loop starts: a bad URL, an unreachable database or a schema that is behind.
    with open_queue(db) as opened:
        return opened.runs_dir


def _checked_sandbox_engine(sandbox_engine: str | None, runs_dir: Path) -> str:
    """The rootless engine the runner runs on, checked to answer, be rootless and see ``runs_dir``."""
    # Fail closed: never a silent fallback to the host's root engine.
    engine = sandbox_engine or sandbox.default_sandbox().url
    if not engine.startswith("unix:///"):
        raise UsageError(f"--sandbox-engine must be unix:///PATH, not {engine!r}")
    sandbox.require_sandbox_engine(engine)
    # The runner gets binds of run dirs and of private dirs made in the temp dir: the engine must see both.
    sandbox.require_sees(engine, [sandbox.temp_dir(), runs_dir])
    return engine


def _finalizer(publish: PublishTarget, signer: SignerKind, *, local_root: Path | None, api_url: str | None) -> Any:
    """With --publish github|local: what seals each terminal run and queues its publication (else None)."""
    if publish == "none":
        return None
    # lazy: pipeline.publish.service (sigstore, PyGithub) costs 475 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.publish.service import worker_finalizer

    local_instance_root = None
    if signer == "local":
        local_instance_root = paths.local_trusted_root()
    # Inside an Actions job (an ambient signer is refused anywhere else): the job's own repository
    # is the infra repository whose workflow identity signs, printed in the body.
    infra_repository = os.environ.get("GITHUB_REPOSITORY") if signer != "local" else None
    # The reusable workflow that signs names itself in $BENCHSEAL_BUILDER_REF (its job_workflow_ref,
    # OWNER/REPO/.github/workflows/FILE@REF): the body pins OWNER/REPO@REF. Unset: no builder, and a
    # GitHub-identity publication is refused rather than printed with a pin nobody set.
    builder_ref = os.environ.get("BENCHSEAL_BUILDER_REF", "") if signer != "local" else ""
    repository, _, rest = builder_ref.partition("/.github/workflows/")
    builder = f"{repository}@{rest.partition('@')[2]}" if repository and "@" in rest else None
    return worker_finalizer(publish, signer_factory(signer), infra_repository=infra_repository,
                            local_root=local_root, api_url=api_url, trusted_root=local_instance_root,
                            builder=builder)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
