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

This module is the claim loop (claims, planning with its signature checks, batches, ``run_once`` /
``run_forever``); the pieces it calls live beside it: ``config`` (WorkerConfig, RunOutcome, the failures),
``images`` (pulls by digest, the base, the rendered suite and task images), ``containers`` (the engines,
the runner container of a batch, leftovers) and ``finalize`` (grading hand-off, evidence copy, the end of a run).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.attest.images import ImageIdentityPolicy, SigstoreEndpoints, image_identity, verify_image
from pipeline.core.contracts import DispatchPayload, RunState, trial_attempt
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.errors import (
    CheckFailed,
    Error,
    InfrastructureError,
    PolicyNotLoaded,
    PolicyRefused,
    ValidationError,
)
from pipeline.core.fsutil import atomic_write_json
from pipeline.infra.intake.policy import InfraPolicy, SourcePolicy
from pipeline.infra.intake.policy_home import check_accepted_policy
from pipeline.infra.queue.sql import (
    TERMINAL_STATES,
    PlannedTrial,
    Queue,
    RunRecord,
    TrialBatch,
    TrialClaim,
    batch_label,
    open_queue,
)
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.sandbox.agents import reap_private_dirs, trial_usage
from pipeline.infra.sandbox.relay import UsageTally
from pipeline.infra.worker.config import (
    Finalizer,
    ImageRefused,
    InfraFailure,
    RunOutcome,
    WorkerConfig,
    claim_policy,
    now_utc,
)
from pipeline.infra.worker.containers import (
    LABEL_BATCH,
    LABEL_RUN,
    LABEL_TRIALS,
    _batch_container_name,
    _BatchRun,
    _docker,
    _Engines,
    _remove_run_leftovers,
    _run_container,
    _sandbox,
    kill_trial_leftovers,
    sandbox_url,
    sweep_orphan_batches,
)
from pipeline.infra.worker.dataset import stage_dataset
from pipeline.infra.worker.finalize import (
    _adopt_trial_dir,
    _copy_evidence,
    _finalize_abandoned,
    _grade_planned,
    _infra,
    exhausted_grading,
)
from pipeline.infra.worker.grading import RecordedTrial, RunnerInfo, grade_run, grade_trial, read_plan
from pipeline.infra.worker.images import (
    BASE_PLACEHOLDER,
    TASK_IMAGE_LABEL,
    _pin_docker_image,
    _task_context_hash,
    check_runner_agent,
    prebuild_task_images,
    pull_by_digest,
    render_suite,
    resolve_base_ref,
    sandbox_image,
)
from pipeline.infra.worker.prune import after_work, note_staged, runner_image_use, task_image_use
from pipeline.infra.worker.task_images import load_task_bases, load_task_images, pull_recorded
from pipeline.infra.worker.trial_evidence import pack_trial_dir
from pipeline.runner.plan import discover_tasks, plan_trials, select_tasks, suite_grading, task_grading
from pipeline.runner.readiness import make_ready_dir, mark_ready

# What callers and tests import from here: the worker's names from before it was split into
# config.py, images.py, containers.py and finalize.py.
__all__ = [
    "BASE_PLACEHOLDER",
    "LABEL_BATCH",
    "LABEL_RUN",
    "LABEL_TRIALS",
    "TASK_IMAGE_LABEL",
    "Finalizer",
    "ImageRefused",
    "InfraFailure",
    "RunOutcome",
    "WorkerConfig",
    "_Heartbeat",
    "_adopt_trial_dir",
    "_copy_evidence",
    "_pin_docker_image",
    "_sandbox",
    "_task_context_hash",
    "exhausted_grading",
    "prebuild_task_images",
    "pull_by_digest",
    "render_suite",
    "require_signed_images",
    "resolve_base_ref",
    "run_forever",
    "run_once",
    "sandbox_image",
    "sandbox_url",
    "signer_identities",
    "sweep_orphan_batches",
]

log = logging.getLogger("benchseal.worker")

# cosign failures that say the registry or Sigstore could not be reached (retry), not that a
# signature is missing or wrong (refuse).
_UNREACHABLE = ("connection refused", "i/o timeout", "no such host", "tls handshake timeout", "connection reset",
                "503 service unavailable", "502 bad gateway", "context deadline exceeded")


def signer_identities(payload: DispatchPayload, source: SourcePolicy) -> list[ImageIdentityPolicy]:
    """The identities ``source``'s policy admits for ``payload`` (``sources[].signer``), in policy
    order, each pinned to the payload's commit (``image_identity``): a tag deleted and pushed again
    at another commit names no other release."""
    return [image_identity(source.repository, payload.source.tag, payload.source.commit, workflow=signer.workflow,
                           ref=signer.ref, builder=signer.builder) for signer in source.signer]


def require_signed_images(payload: DispatchPayload, source: SourcePolicy, trust: SigstoreEndpoints) -> None:
    """Raise ImageRefused unless the runner and the api each carry a signature and the SLSA
    provenance and CycloneDX attestations of ONE identity ``source``'s policy admits (its release
    workflow at the payload's tag, or at an exact ref the policy names, always at the payload's
    commit), checked by cosign for the exact digest, before anything pulled is used."""
    admitted = signer_identities(payload, source)
    for role in ("runner", "api"):
        ref = parse_ref(getattr(payload, role), f"payload.{role}")
        signer, refusals = signed_by_one_of(ref, admitted, trust, role)
        if signer is None:
            raise ImageRefused(f"{role} {ref.ref} is not signed by "
                               + " nor ".join(e.identity for e in admitted) + ": " + "; ".join(refusals))


def signed_by_one_of(image: ImageRef, admitted: Sequence[ImageIdentityPolicy], trust: SigstoreEndpoints, what: str,
                     ) -> tuple[ImageIdentityPolicy | None, list[str]]:
    """The first of ``admitted`` whose signature and attestations cosign verifies on ``image`` (None and
    each identity's refusal otherwise); InfraFailure when the registry or Sigstore could not be reached
    (retry), never a refusal."""
    loopback = image.registry.split(":", 1)[0] in ("127.0.0.1", "localhost")
    refusals = []
    for expected in admitted:
        try:
            verify_image(image.ref, expected, trust, allow_http_registry=loopback)
        except CheckFailed as exc:
            if any(sign in str(exc).lower() for sign in _UNREACHABLE):
                raise InfraFailure(f"could not check the signatures of {what} {image.ref}: {exc}") from None
            refusals.append(f"{expected.describe()}: {exc}")
            continue
        return expected, refusals
    return None, refusals


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


class _TrialHeartbeat(_Heartbeat):
    """Renews a batch's trial lease while it holds a trial: the lease covers the trials not recorded yet, so once
    the recorder has recorded (or given back) every one there is nothing left to renew, and the queue's "no row"
    then is no loss. Under load a runner's teardown after its last trial (containers removed, the tree reclaimed)
    outlasted a beat's period, and every such batch logged "trial lease lost" while nothing was lost. When the
    batch ended the run's last trial, the run (handed over under a fresh lease, this worker's to grade) is renewed
    instead until the batch is over and the grader's own heartbeat takes over: nothing renewed it in between."""

    _what = "trial "

    def __init__(self, queue: Queue, run_id: str, token: str, lease: float, every: float,
                 recorder: _BatchRecorder) -> None:
        super().__init__(queue, run_id, token, lease, every)
        self._recorder = recorder

    def _beat(self) -> bool:
        with self._recorder.lock:  # a recording in flight ends before the settled check (it cannot race the beat)
            handed = self._recorder.handed_run()
            if handed is not None and handed.lease_token:
                self._what = "grading "
                return self._queue.heartbeat(self._run_id, handed.lease_token, self._lease)
            if self._recorder.settled():
                self.done.set()
                return True
            return self._queue.heartbeat_trials(self._run_id, self._token, self._lease)


# --- one attempt -----------------------------------------------------------------

def run_once(config: WorkerConfig, finalize: Finalizer | None = None, *, prune: bool = True) -> RunOutcome | None:
    """``_run_once``; then runs sealed (here or on another host) leave the sandbox as the worker found them
    (``prune.after_work``). ``prune=False``: the caller runs ``after_work`` itself (the local release, beside sealing)."""
    outcome = _run_once(config, finalize)
    if outcome is not None and prune:
        after_work(config, outcome.run_id if outcome.state in TERMINAL_STATES else None)
    return outcome


def _run_once(config: WorkerConfig, finalize: Finalizer | None = None) -> RunOutcome | None:
    """Take one piece of work; None when nothing was claimable.

    First a batch of QUEUED trials of any planned run (this is how one run spreads over several
    hosts); else the oldest QUEUED run: in its run phase it is checked and planned into trials (the
    planner claims the first batch in the same transaction), in its finalize phase it is graded.
    After a batch, the worker keeps taking batches of the same run while there are any; the worker
    whose batch ends the run's last trial grades and completes it (RunOutcome with the terminal
    state); otherwise the outcome says RUNNING (other workers hold the rest of its trials).
    """
    policy = claim_policy(config)  # the installed policy as it is now: a changed file is loaded again, or no claim
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
                    return _grade_planned(queue, record, token, policy, finalize, now_utc(), grader=config.worker_id)
                if record.phase == "finalize":
                    return _finalize_abandoned(queue, record, token, policy, finalize, grader=config.worker_id)
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
    """Trials one runner container takes at once: --trial-batch, else --trial-concurrency, else the suite's
    trial_batch (its trial_concurrency unless the policy sets one)."""
    if config.trial_batch is not None:
        return config.trial_batch
    if config.trial_concurrency is not None:
        return config.trial_concurrency
    if suite is not None and suite in policy.suites:
        return policy.trial_batch(suite)
    return max((policy.trial_batch(name) for name in policy.suites), default=1)


def _plan(
    queue: Queue, record: RunRecord, token: str, config: WorkerConfig, policy: InfraPolicy, finalize: Finalizer | None
) -> RunOutcome | TrialBatch:
    """Check the run (policy, images by digest and signature, suite) and split it into trials."""
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    started = now_utc()
    queue.start(run_id, token)
    failure: str | None = None
    client: Any = None
    try:
        check_accepted_policy(queue.accepted_policy(run_id), policy)  # before anything of the run is touched
        runner_ref = parse_ref(payload.runner, "payload.runner")
        source = policy.check_payload(payload)  # the repository and both images, as accept checked them
        client = _docker()
        # Nothing of this run runs anywhere yet (it is not planned): anything left on the sandbox
        # engine under its label is an earlier planning attempt's.
        _remove_run_leftovers(run_id, config, strict=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        pull_by_digest(client, runner_ref)  # a missing runner stays an infrastructure error (retried)
        require_signed_images(payload, source, config.image_trust)  # before anything pulled is used
        check_runner_agent(client, runner_ref, payload)  # the release's agent, as the payload and policy name it
        # The run's tasks are the staged, re-hashed copy's: nothing the pinned digest does not cover is planned.
        staged = stage_dataset(policy, payload.suite, config.suites_dir, run_dir)
        note_staged(run_id)  # removed by a prune once the run is sealed, wherever (prune.py)
        tasks = select_tasks(discover_tasks(staged.path), payload.tasks)  # the payload's subset, if it names one
        suite_grading(staged.path, tasks)  # every task graded by exit status; not only canaries (ValidationError)
        specs = plan_trials(run_id, tasks, policy.task_attempts(payload.suite))
    except PolicyRefused as exc:
        failure = exc.diagnostics()  # accepted under another policy: nothing of it runs under this one
    except ValidationError as exc:
        failure = f"rejected: {exc.diagnostics()}"  # the payload no longer passes the policy: retrying cannot help
    except ImageRefused as exc:
        failure = f"refused by policy: {exc}"
    except (InfraFailure, CheckFailed, InfrastructureError) as exc:
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir, policy,
                      grader=config.worker_id)
    except Exception as exc:  # an unexpected engine/SDK error is still an infrastructure error, never a stuck run
        log.exception("run %s: unexpected error", run_id)
        return _infra(queue, record, token, f"{type(exc).__name__}: {exc}", started, finalize, run_dir, policy,
                      grader=config.worker_id)
    finally:
        if client is not None:
            client.close()
    if failure is not None:
        runner = RunnerInfo(image_id=None, digest=None)
        grading = grade_run(run_dir, record, policy, runner, started_at=started, finished_at=now_utc(), failure=failure,
                            graded_by=config.worker_id)  # the worker that refused it decided its outcome
        atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
        _copy_evidence(run_dir)
        try:
            publications = list(finalize(record, grading, run_dir)) if finalize else []
        except Exception as exc:
            log.exception("run %s: finalize failed", run_id)
            return _infra(queue, record, token, f"finalize failed: {type(exc).__name__}: {exc}", started, finalize,
                          run_dir, policy, grader=config.worker_id)
        queue.complete(run_id, token, grading, publications)
        return RunOutcome(run_id=run_id, state=RunState(grading.status), grading=grading, reason=grading.reason)
    batch = queue.plan_trials(
        run_id, token, [PlannedTrial(task=s.task, trial_name=s.trial_name) for s in specs],
        max_attempts=record.max_attempts, claim=_batch_size(config, policy, payload.suite),
        worker=config.worker_id, lease_seconds=policy.lease_seconds)
    if batch is None:  # pragma: no cover - a planned run always has a first trial to claim
        raise CheckFailed(f"run {run_id}: planned but its first batch could not be claimed")
    log.info("run %s: planned %d trials", run_id, len(specs))
    return batch


def _work_batches(queue: Queue, batch: TrialBatch, config: WorkerConfig, policy: InfraPolicy,
                  finalize: Finalizer | None) -> RunOutcome:
    """Run ``batch`` and further batches of the same run; grade the run if this worker ends its last trial."""
    run_id = batch.run.run_id
    current: TrialBatch | None = batch
    while current is not None:
        ended = _run_batch(queue, current, config, policy)
        if ended == "released":
            return RunOutcome(run_id=run_id, state=RunState.QUEUED, grading=None, reason="released on SIGTERM")
        if isinstance(ended, RunRecord):
            grader_token = ended.lease_token or ""
            beat = _Heartbeat(queue, run_id, grader_token, policy.lease_seconds,
                              config.heartbeat_seconds or policy.lease_seconds / 3)
            beat.start()
            try:
                return _grade_planned(queue, ended, grader_token, policy, finalize, now_utc(), grader=config.worker_id)
            finally:
                beat.done.set()
                beat.join(timeout=5)
        if config.stop.is_set():
            break
        current = queue.claim_trials(config.worker_id, policy.lease_seconds,
                                     _batch_size(config, policy, batch.run.payload.suite), run_id=run_id)
    return RunOutcome(run_id=run_id, state=RunState.RUNNING, grading=None, reason="other workers hold the run's remaining trials")


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
    # Its canaries and dataset digest are set once the batch's dataset is staged (_prepare_batch).
    recorder = _BatchRecorder(queue, batch, out, policy.lease_seconds,
                              expected_digest=parse_ref(payload.runner, "payload.runner").digest,
                              worker=config.worker_id)
    beat = _TrialHeartbeat(queue, run_id, token, policy.lease_seconds, config.heartbeat_seconds or policy.lease_seconds / 3,
                           recorder)
    beat.start()
    client: Any = None
    sandboxed: Any = None
    builds: _TaskImageBuilds | None = None
    try:
        try:
            check_accepted_policy(queue.accepted_policy(run_id), policy)  # requeued (bounded), never run under it
            runner_ref = parse_ref(payload.runner, "payload.runner")
            source = policy.check_payload(payload)
            client = _docker()
            sandboxed = _sandbox(config)
            engines, builds = _prepare_batch(client, sandboxed, batch, out, runner_ref, source, config, policy,
                                             recorder, run_dir)
            concurrency = min(len(batch.trials), config.trial_concurrency or policy.trial_concurrency(payload.suite))
            runner, failure, released = _run_container(
                engines, record, runner_ref, run_dir, config, policy,
                _BatchRun(suite_dir=out / "suite", out_dir=out, name=_batch_container_name(run_id, token),
                          trial_names=names, concurrency=concurrency, label=batch_label(token),
                          on_poll=recorder.on_poll, attempts=batch_attempts(run_id, batch.trials),
                          usage=recorder.usage, ready_dir=builds.ready_dir if builds else None,
                          abort=builds.failure if builds else None))
            if builds is not None:
                builds.finish()  # a failed build: the batch's unrecorded trials are requeued, as any infra failure
        except (ValidationError, ImageRefused, InfraFailure, CheckFailed, InfrastructureError) as exc:
            log.error("run %s: batch %s failed: %s", run_id, list(names), exc)
            return recorder.fail_rest(f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("run %s: unexpected error in batch %s", run_id, list(names))
            return recorder.fail_rest(f"{type(exc).__name__}: {exc}")
        finally:
            if builds is not None:
                builds.join()  # never close the engine under a build still running
            for engine in (client, sandboxed):
                if engine is not None:
                    engine.close()
    finally:
        beat.done.set()
        beat.join(timeout=5)
    if released:
        if len(recorder.recorded) < len(batch.trials):
            queue.release_trials(run_id, token, "worker stopping (SIGTERM)")
        return recorder.handed[0] if recorder.handed else "released"
    if failure is None and runner.digest != recorder.expected_digest:
        failure = f"runner container ran {runner.digest}, not {recorder.expected_digest}"
    if failure is not None and len(recorder.recorded) == len(batch.trials):
        # Every trial had finished and was recorded before the batch failed: nothing is left to carry it.
        log.error("run %s: %s (after every trial of the batch had finished)", run_id, failure)
    # The batch's failure (timeout, a wrong runner) rides on the trials it left unfinished, and fails the run.
    recorder.record(runner, final=True, failure=failure)
    _collect_trial_dirs(run_dir, out, names, token)
    return recorder.handed_run()


def _canaries(suite_src: Path, trials: Sequence[TrialClaim]) -> frozenset[str]:
    """The batch's tasks that are tamper canaries, read from the infra's suite (unreadable: none, and the
    batch's own checks fail it)."""
    found: set[str] = set()
    for task in sorted({t.task for t in trials}):
        try:
            if task_grading(suite_src, task).canary:
                found.add(task)
        except ValidationError:
            continue
    return frozenset(found)


def batch_attempts(run_id: str, trials: Sequence[TrialClaim]) -> int:
    """The attempts per task a batch's trials were planned with, as their names say (``contracts.trial_attempt``),
    not the policy now: an edited policy never changes a planned run."""
    found = (trial_attempt(t.trial_name, t.task, run_id) for t in trials)
    return max((parsed[1] for parsed in found if parsed is not None), default=1)


def _prepare_batch(client: Any, sandboxed: Any, batch: TrialBatch, out: Path, runner_ref: ImageRef,
                   source: SourcePolicy, config: WorkerConfig, policy: InfraPolicy, recorder: _BatchRecorder,
                   run_dir: Path) -> tuple[_Engines, _TaskImageBuilds | None]:
    """Ready the batch's runner container: leftovers of earlier batches of its trials removed, the runner pulled by
    digest and the images' signatures checked (on every host, before it runs anything), the base in the sandbox by
    id, the run's dataset staged by its digest and the batch's tasks rendered from that copy onto the base (and
    prebuilt) in ``out/suite``, the runner in the sandbox by id. Missing task images build in the background
    (``_TaskImageBuilds``) while the runner copies in and runs the trials of the tasks that are ready."""
    run_id, payload = batch.run.run_id, batch.run.payload
    for name in kill_trial_leftovers(sandboxed, run_id, tuple(t.trial_name for t in batch.trials)):
        log.warning("run %s: removed leftover container %s", run_id, name)
    # The runner is recorded under the run before it is pulled or reused (prune.runner_image_use), so a prune
    # never removes it while the run is in flight, and removes it once sealed runs no longer keep it warm.
    with runner_image_use(run_id) as use:
        pull_recorded(client, runner_ref, use)
    require_signed_images(payload, source, config.image_trust)  # every host checks before it runs anything
    base = resolve_base_ref(config, runner_ref)
    base_id = sandbox_image(client, sandboxed, base)
    staged = stage_dataset(policy, payload.suite, config.suites_dir, run_dir)
    recorder.canaries = _canaries(staged.path, batch.trials)
    recorder.dataset_digest = staged.digest
    # Every task image the batch loads, reuses or builds is recorded under the run before it is used: a prune
    # (after another run is sealed) waits for this and never removes what a run in flight uses (prune.py).
    with task_image_use(run_id) as use:
        use.bases([base_id])
        # Registry bases of Dockerfile-built tasks: pulled by digest, checked, in the sandbox by id (task_images).
        bases = load_task_bases(client, sandboxed, {t: r for t, r in staged.task_bases.items() if t in recorder.tasks},
                                use)
        use.images(bases.values())
        # A planned task that is not in the staged copy is refused here (render_suite): never run.
        render_suite(staged.path, out / "suite", base, tasks={t.task for t in batch.trials}, from_image=base_id,
                     bases=bases)
        # Prebuilt task images: pulled by digest, checked, moved into the sandbox by id (task_images).
        loaded = load_task_images(client, sandboxed, out / "suite",
                                  {t: r for t, r in staged.task_images.items() if t in recorder.tasks}, use)
        use.images(image.image_id for image in loaded.values())
        recorder.task_images = {task: image.ref.ref for task, image in loaded.items()}
    # The sandbox engine (the service user) works in this batch's dir and nowhere else of the run's. The rendered
    # suite stays the worker's (readable by others: the infra's dataset, no secret), so the builds below can pin
    # its task.toml files while the runner reads them; the readiness dir is made after the grant, the worker's too.
    _readable_by_others(out / "suite")
    sandbox.grant(out, keep=("suite",))
    builds = None
    if config.prebuild_task_images:
        builds = _TaskImageBuilds(sandboxed, run_id, out, config.trial_concurrency or policy.trial_concurrency(payload.suite))
        builds.start()
    try:
        runner_id = sandbox_image(client, sandboxed, runner_ref)
    except BaseException:
        if builds is not None:
            builds.join()
        raise
    return _Engines(client, sandboxed, runner_id), builds


def _readable_by_others(tree: Path) -> None:
    """Directories 0755 and files 0644 (0755 with an exec bit) under ``tree``, whatever the worker's umask: the
    sandbox reads the rendered suite as others. A link is never followed (render_suite writes none)."""
    for root, _dirs, files in os.walk(tree):
        os.chmod(root, 0o755)  # noqa: S103 - the infra's dataset, read by the sandbox; written by the worker only
        for name in files:
            entry = Path(root, name)
            info = entry.lstat()
            if stat.S_ISREG(info.st_mode):
                os.chmod(entry, 0o755 if info.st_mode & 0o111 else 0o644)


class _TaskImageBuilds:
    """A batch's missing task images, built in a thread of their own while its runner runs (issue 36.5).

    Each task is marked ready (``pipeline.runner.readiness``) once its task.toml names its image, which was
    recorded under the run first (``task_image_use``: a prune waits); the runner starts a task's trials only
    then. A failed build is ``failure()`` (the worker stops the runner, ``_run_started_container``) and is
    raised by ``finish()``."""

    def __init__(self, sandboxed: Any, run_id: str, out: Path, concurrency: int) -> None:
        self.ready_dir = make_ready_dir(out)
        self._sandboxed, self._run_id, self._suite, self._concurrency = sandboxed, run_id, out / "suite", concurrency
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, name=f"task-images-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _build(self) -> None:
        try:
            with task_image_use(self._run_id) as use:
                # Missing images built in parallel (a slot per trial of the batch); every id recorded even if one fails.
                prebuild_task_images(self._sandboxed, self._suite, record_use=use.images,
                                     on_ready=lambda tasks: mark_ready(self.ready_dir, tasks),
                                     concurrency=self._concurrency)
        except BaseException as exc:  # handed to the batch (finish), which requeues its unrecorded trials
            self._error = exc

    def failure(self) -> str | None:
        """Why the batch must stop now (a build failed), or None."""
        error = self._error
        return None if error is None else f"building task images failed: {type(error).__name__}: {error}"

    def join(self) -> None:
        self._thread.join()

    def finish(self) -> None:
        """Wait for the builds; raise the first failure."""
        self.join()
        if self._error is not None:
            raise self._error


@dataclass
class _BatchRecorder:
    """Records a batch's finished trials in the queue (graded from their result.json), each exactly once, and
    keeps the run when a record hands it over (the batch ended the run's last trial)."""

    queue: Queue
    batch: TrialBatch
    out: Path  # the batch's dir: harbor/<trial>/result.json
    lease_seconds: float
    expected_digest: str  # the payload's runner's: another runner's trials are recorded at the end only
    worker: str | None = None  # this worker's id, recorded with each trial it ran
    recorded: set[int] = field(default_factory=set)
    handed: list[RunRecord] = field(default_factory=list)
    # Held across each queue call that ends trials of the batch and the bookkeeping of it (the heartbeat's too).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    given_back: bool = False  # the batch's unrecorded trials were handed back to the queue (fail_rest)
    # The batch's tamper canaries, from the worker's staged copy of the dataset (never from what the runner wrote).
    canaries: frozenset[str] = frozenset()
    # The content digest of the dataset copy the batch's tasks were rendered from (pipeline.infra.worker.dataset).
    dataset_digest: str | None = None
    # {task: name@sha256} of the batch's tasks that ran on a prebuilt image (recorded with each trial).
    task_images: dict[str, str] = field(default_factory=dict)
    # The model usage the batch's relays counted (pipeline.infra.sandbox.agents.trial_usage).
    usage: UsageTally = field(default_factory=UsageTally)

    @property
    def tasks(self) -> set[str]:
        return {t.task for t in self.batch.trials}

    def handed_run(self) -> RunRecord | None:
        return self.handed[0] if self.handed else None

    def record(self, runner: RunnerInfo, *, final: bool, failure: str | None = None) -> None:
        """Record the batch's finished trials (all remaining ones when ``final``), each exactly once."""
        run_id, agent = self.batch.run.run_id, self.batch.run.payload.agent
        plan = read_plan(self.out)
        todo: dict[int, str] = {}
        packed: dict[int, bytes] = {}
        for trial in self.batch.trials:
            path = self.out / "harbor" / trial.trial_name / "result.json"
            if trial.idx in self.recorded or not (final or _finished(path)):
                continue
            graded = grade_trial(path, trial.task, trial.trial_name, agent, runner,
                                 plan.harbor_version if plan else None, canary=trial.task in self.canaries,
                                 task_image=self.task_images.get(trial.task))
            if self.batch.run.payload.agent_artifact is not None:
                # A release's own agent: its model usage as the relays counted it, never what it reported itself.
                counted = trial_usage(self.usage, trial.trial_name, [t.trial_name for t in self.batch.trials])
                graded = graded.model_copy(update={
                    "model_calls": counted.calls if counted else None,
                    "input_tokens": counted.input_tokens if counted else None,
                    "output_tokens": counted.output_tokens if counted else None})
            todo[trial.idx] = RecordedTrial(
                trial=graded, failure=failure if final else None, agent_version=plan.agent_version if plan else None,
                model=plan.model if plan else None, host=socket.gethostname(), batch_dir=str(self.out),
                dataset_digest=self.dataset_digest, worker=self.worker).to_json()
            if self.queue.spans_hosts:
                evidence = _pack_evidence(run_id, path.parent)
                if evidence is not None:
                    packed[trial.idx] = evidence
        if not todo:
            return
        with self.lock:
            got = self.queue.complete_trials(run_id, self.batch.lease_token, todo, lease_seconds=self.lease_seconds,
                                             evidence=packed)
            self.recorded.update(todo)
            if got is not None:
                self.handed.append(got)

    def on_poll(self, runner: RunnerInfo) -> None:
        """Called while the runner container runs: record the trials that have finished."""
        if runner.digest != self.expected_digest:
            return  # a wrong runner: its trials are recorded at the end, with the failure
        try:
            self.record(runner, final=False)
        except Exception as exc:  # recorded at the end instead; a finished trial is never lost by this
            log.warning("run %s: recording finished trials failed: %s", self.batch.run.run_id, exc)

    def fail_rest(self, reason: str) -> RunRecord | None:
        """An infrastructure failure of the batch: the trials not recorded yet are requeued (bounded)."""
        if len(self.recorded) >= len(self.batch.trials):
            return self.handed_run()
        with self.lock:
            got = self.queue.fail_trials(self.batch.run.run_id, self.batch.lease_token, reason,
                                         lease_seconds=self.lease_seconds)
            self.given_back = True
        return got or self.handed_run()

    def settled(self) -> bool:
        """No trial of the batch is held under its lease any more: each recorded, or handed back (hold ``lock``)."""
        return self.given_back or len(self.recorded) >= len(self.batch.trials)


def _finished(result: Path) -> bool:
    """A trial's result.json is complete (Harbor writes finished_at when the trial has ended)."""
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("finished_at"))


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


# --- the loop ------------------------------------------------------------------------

def run_forever(config: WorkerConfig, concurrency: int = 1, finalize: Finalizer | None = None, poll_seconds: float = 2.0) -> None:
    """Run ``concurrency`` claim loops until ``config.stop`` is set."""
    def loop() -> None:
        while not config.stop.is_set():
            try:
                outcome = run_once(config, finalize)
            except PolicyNotLoaded:  # the policy source logs each distinct refusal once, not every poll
                outcome = None
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
