"""Ending a run: the grader's hand-off (``_grade_planned``: every trial row graded exactly once, the
dirs of trials that ran on other hosts unpacked from the queue), the evidence copy into
``artifacts/evidence`` (``_copy_evidence``), the finalize hook, and ONE terminal transaction with the
publication outbox rows; runs whose attempts are used up end the same way (``_infra``, ``_finalize``,
``_finalize_abandoned``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import socket
from pathlib import Path
from typing import Any

from pipeline.core.contracts import Grading, PublicationRequest, RunState, TrialRecord
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_json, sha256_file
from pipeline.core.layout import ARTIFACTS_DIR, SUMMARY
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.intake.policy_home import accepted_policy_problem
from pipeline.infra.queue.sql import Queue, RunRecord
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.worker.config import Finalizer, RunOutcome, now_utc
from pipeline.infra.worker.containers import (
    LABEL_RUN,
    _docker,
    _Engines,
    _inspect_runner,
    _remove_run_leftovers,
    _sandbox,
    kill_leftovers,
)
from pipeline.infra.worker.export import COMPARISON
from pipeline.infra.worker.grading import (
    RecordedTrial,
    RunnerInfo,
    grade_run,
    grade_trials,
    infra_error_grading,
    read_plan,
    run_dataset,
)
from pipeline.infra.worker.history import scored_release
from pipeline.infra.worker.trial_evidence import check_trial_name, evidence_copy_ignore, unpack_trial_dir

log = logging.getLogger("benchseal.worker")


def _grade_planned(queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None,
                   started: str, *, grader: str | None = None) -> RunOutcome:
    """Grade a run whose trials have all ended, from the queue's trial rows (every trial exactly once),
    then evidence, finalizer and ONE terminal transaction with the outbox rows. ``grader``: this worker's id
    (the grading's ``graded_by``; each trial names the worker its queue record names)."""
    run_id, payload = record.run_id, record.payload
    run_dir = queue.run_dir(run_id)
    if record.state == RunState.CLAIMED:
        queue.start(run_id, token)
    _remove_run_leftovers(run_id)
    trials: list[TrialRecord] = []
    failure: str | None = None
    exhausted: list[str] = []
    meta: dict[str, Any] = {}
    datasets: set[str | None] = set()
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
        # Who ran it: the worker that recorded the row (validated again: it goes into the signed evidence).
        trials.append(TrialRecord.model_validate({**recorded.trial.model_dump(), "worker": recorded.worker}))
        failure = failure or recorded.failure
        meta["agent_version"] = meta.get("agent_version") or recorded.agent_version
        meta["model"] = meta.get("model") or recorded.model
        datasets.add(recorded.dataset_digest)
    versions = sorted({t.harbor_version for t in trials if t.harbor_version})
    dataset, mixed = run_dataset(datasets)
    # Graded only under the policy the run was accepted under: another one fails it (no score).
    refused = accepted_policy_problem(queue.accepted_policy(run_id), policy)
    grading = grade_trials(record, policy, tuple(trials), started_at=started, finished_at=now_utc(),
                           failure=refused or failure or mixed, harbor_version=versions[0] if versions else None,
                           agent_version_pin=meta.get("agent_version"), model=meta.get("model"), dataset_digest=dataset,
                           graded_by=grader)
    if exhausted:
        # The attempt rules, per trial: a trial whose attempts ran out on infrastructure errors ends the
        # run as INFRA_ERROR with no score; the trials that completed are graded as they are.
        reason = f"trial attempts exhausted: {'; '.join(exhausted)[:1500]}"
        grading = grading.model_copy(update={"status": "INFRA_ERROR", "score": None, "reason": reason})
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "trials.json", {
        "run_id": run_id, "agent": payload.agent, "agent_version": meta.get("agent_version"),
        "harbor_version": grading.harbor_version, "model": meta.get("model"),
        "trials": [{"task": t.task, "trial_name": t.trial_name, **({"canary": True} if t.canary else {})}
                   for t in trials]})
    atomic_write_json(run_dir / "grading.json", grading.model_dump(mode="json"))
    _copy_evidence(run_dir)
    # The run's place in its repository's history, decided before a finalizer seals the evidence (it
    # reads comparison.json, as the seal job reads the export's) and recorded with the terminal state.
    release = scored_release(queue, record, grading, policy)
    if release is not None:
        atomic_write_json(run_dir / COMPARISON, release.comparison.to_json_dict())
    publications: list[PublicationRequest] = []
    if finalize is not None:
        try:
            publications = list(finalize(record, grading, run_dir))
        except Exception as exc:
            log.exception("run %s: finalize failed", run_id)
            if record.finalize_attempts < finalize_claims(record):
                queue.fail_infra(run_id, token, f"finalize failed: {type(exc).__name__}: {exc}")
                return RunOutcome(run_id=run_id, state=RunState.QUEUED, grading=None, reason="finalize failed; queued for grading")
            log.error("run %s: finalization tried %d times; completing without publications", run_id,
                      record.finalize_attempts)
    queue.complete(run_id, token, grading, publications, release=release)
    sealed = run_dir / ARTIFACTS_DIR / SUMMARY
    if release is not None and publications and sealed.is_file():
        # A finalizer sealed the evidence here: the release joins the history now (else the seal job records it).
        queue.record_summary(run_id, f"sha256:{sha256_file(sealed)}")
    digests = sorted({t.runner_digest for t in trials if t.runner_digest})
    return RunOutcome(run_id=run_id, state=RunState(grading.status), grading=grading, reason=grading.reason,
                      runner_digest=digests[0] if digests else None)


def _infra(
    queue: Queue, record: RunRecord, token: str, reason: str, started: str, finalize: Finalizer | None, run_dir: Path,
    policy: InfraPolicy, runner: RunnerInfo | None = None, *, grader: str | None = None,
) -> RunOutcome:
    log.error("run %s attempt %d: %s", record.run_id, record.attempts, reason)
    _copy_evidence(run_dir)
    if record.attempts < record.max_attempts:
        state = queue.fail_infra(record.run_id, token, reason)
        return RunOutcome(run_id=record.run_id, state=state, grading=None, reason=reason)
    # Attempts used up: this worker keeps its lease and finalizes the run now.
    reason = f"attempts exhausted ({record.attempts}); last error: {reason}"
    queue.begin_finalize(record.run_id, token, reason)
    return _finalize(queue, record, token, policy, finalize, reason, started, runner, run_dir, grader=grader)


def exhausted_grading(run_dir: Path, record: RunRecord, policy: InfraPolicy, runner: RunnerInfo, reason: str,
                      *, started_at: str, grader: str | None = None) -> Grading:
    """INFRA_ERROR, no score; the trials of the last attempt that completed are graded as they are. ``grader``:
    the worker that ends the run (its ``graded_by``)."""
    if read_plan(run_dir):
        graded = grade_run(run_dir, record, policy, runner, started_at=started_at, finished_at=now_utc(),
                           failure=reason, graded_by=grader)
        return graded.model_copy(update={"status": "INFRA_ERROR", "score": None, "reason": reason})
    return infra_error_grading(record, reason, started_at=started_at, finished_at=now_utc(), policy_digest=policy.digest,
                               graded_by=grader)


FINALIZE_CLAIMS_MIN = 3


def finalize_claims(record: RunRecord) -> int:
    """How many finalize claims may run the finalizer: a worker that keeps dying there must not block the run forever."""
    return max(record.max_attempts, FINALIZE_CLAIMS_MIN)


def _finalize(
    queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None, reason: str,
    started: str, runner: RunnerInfo | None, run_dir: Path, *, grader: str | None = None,
) -> RunOutcome:
    """End a run whose attempts are used up, like every other terminal run: grading, evidence, finalizer, ONE complete."""
    grading = exhausted_grading(run_dir, record, policy, runner or RunnerInfo(image_id=None, digest=None), reason,
                                started_at=started, grader=grader)
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
                return RunOutcome(run_id=record.run_id, state=RunState.QUEUED, grading=None, reason=reason)
            publications = []
    elif finalize is not None:
        # Workers died finalizing this run more often than it has attempts: end it without running the hook again.
        log.error("run %s: finalization tried %d times; completing without publications", record.run_id,
                  record.finalize_attempts)
    queue.complete(record.run_id, token, grading, publications)
    return RunOutcome(run_id=record.run_id, state=RunState(grading.status), grading=grading, reason=grading.reason,
                      runner_digest=runner.digest if runner else None)


def _leftover_runner(engines: _Engines, run_id: str, runner: str) -> RunnerInfo:
    """What the dead attempt's runner container ran, if it is still there (never guessed)."""
    containers = engines.sandbox.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    if not containers:
        return RunnerInfo(image_id=None, digest=None)
    return _inspect_runner(engines, containers[0], parse_ref(runner, "payload.runner"))


def _finalize_abandoned(
    queue: Queue, record: RunRecord, token: str, policy: InfraPolicy, finalize: Finalizer | None, *,
    grader: str | None = None,
) -> RunOutcome:
    """A run whose final attempt's worker died (or whose finalizer failed): stop what is left of it, then finalize."""
    run_id = record.run_id
    run_dir = queue.run_dir(run_id)
    started = now_utc()
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
            return RunOutcome(run_id=run_id, state=RunState.QUEUED, grading=None, reason=reason)
        log.error("run %s: cannot stop the earlier attempt's containers (%s); grading what is there", run_id, exc)
    finally:
        if client is not None:
            client.close()
    reason = record.reason or f"attempts exhausted ({record.attempts})"
    return _finalize(queue, record, token, policy, finalize, reason, started, runner, run_dir, grader=grader)


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
    atomic_write_json(origin, {"trial_name": trial_name, "host": recorded.host, "worker": recorded.worker,
                               "batch_dir": recorded.batch_dir, "sha256": digest})


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
