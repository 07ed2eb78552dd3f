"""Grade a run from Harbor's result.json files (never from an exit code).

Per planned trial (``trials.json``, written by ``benchseal trial run``) the rule is
``pipeline.core.scoring.grade_result``, the one the seal job and ``benchseal verify`` recompute the score
with: no or unreadable result.json, or a failure of the machinery -> ``infra_error``; a reward of 1 from
benchseal's grader -> ``resolved``; anything else the agent or what it left caused -> ``unresolved``.
Tamper canaries (``TrialRecord.canary``) are graded but never counted: one that is resolved FAILS the run.

A run whose infrastructure errors exceed the policy threshold is FAILED with
no score; otherwise score = resolved / completed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.contracts import MODEL_CALLS_KEY, Digest, GradeCounts, Grading, TrialRecord, WorkerId
from pipeline.core.documents import TrialsPlan, load_document
from pipeline.core.errors import ValidationError
from pipeline.core.scoring import AGENT_EXCEPTIONS, count, grade_result, score_of
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.queue.sql import RunRecord
from pipeline.runner.plan import TRIALS_FILE

__all__ = ["AGENT_EXCEPTIONS", "RecordedTrial", "RunnerInfo", "grade_run", "grade_trial", "grade_trials",
           "infra_error_grading", "read_plan"]


@dataclass(frozen=True)
class RunnerInfo:
    """What ``docker inspect`` of the runner container said it ran."""

    image_id: str | None
    digest: str | None  # the RepoDigest of the payload's repository, when present


def _seconds(phase: Any) -> float | None:
    if not isinstance(phase, dict) or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    try:
        start = datetime.fromisoformat(str(phase["started_at"]))
        end = datetime.fromisoformat(str(phase["finished_at"]))
        return round((end - start).total_seconds(), 3)
    except (ValueError, TypeError, OverflowError):  # not Harbor's timestamps: no timing, never a crash
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _model_usage(agent_result: Any) -> dict[str, Any]:
    """Model calls and tokens from Harbor's agent_result (terminus-2 fills them; test agents do not)."""
    if not isinstance(agent_result, dict):
        return {}
    raw_metadata = agent_result.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    times = metadata.get("api_request_times_msec")
    # terminus-2 lists each call's time; a release's CLI agent reports the count its CLI printed (model_calls).
    calls = len(times) if isinstance(times, list) else _count(metadata.get(MODEL_CALLS_KEY)) \
        if MODEL_CALLS_KEY in metadata else _count(metadata.get("n_episodes"))
    usage = {"model_calls": calls, "input_tokens": _count(agent_result.get("n_input_tokens")),
             "output_tokens": _count(agent_result.get("n_output_tokens"))}
    return {k: v for k, v in usage.items() if v is not None}


class RecordedTrial(BaseModel):
    """One graded trial as the worker that ran it records it in the queue (``trials.result``), for
    the grader, possibly on another host: ``benchseal.recorded-trial/v1``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_: Literal["benchseal.recorded-trial/v1"] = Field(default="benchseal.recorded-trial/v1", alias="schema")
    trial: TrialRecord
    failure: str | None = None  # the batch's failure (timeout, a wrong runner): fails the run
    agent_version: str | None = None
    model: str | None = None
    host: str = Field(min_length=1, max_length=255)
    batch_dir: str = Field(min_length=1, max_length=4096)
    # The worker that ran the trial (WorkerConfig.worker_id): with a queue shared by several workers, who ran what.
    worker: WorkerId | None = None
    # The content digest of the staged dataset copy the trial's task came from (pipeline.infra.worker.dataset).
    dataset_digest: Digest | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def parse(cls, text: str, task: str, trial_name: str, agent: str) -> RecordedTrial | TrialRecord:
        """The recorded trial, or (a row that does not validate, or names another trial) an
        infrastructure-error TrialRecord: fail closed, never a stuck run."""
        try:
            recorded = cls.model_validate_json(text)
        except PydanticValidationError:
            recorded = None
        if recorded is None or recorded.trial.task != task or recorded.trial.trial_name != trial_name:
            return TrialRecord(task=task, trial_name=trial_name, agent_name=agent, outcome="infra_error", reward=None,
                               exception_type="UnreadableTrialRecord")
        return recorded


def read_plan(run_dir: Path) -> TrialsPlan | None:
    """The runner's trials.json through its model; None when missing or not a valid plan (no trials graded)."""
    try:
        return load_document(TrialsPlan, run_dir / TRIALS_FILE)
    except (OSError, ValidationError):
        return None


def grade_trial(result_path: Path, task: str, trial_name: str, agent: str, runner: RunnerInfo, harbor_version: str | None,
                *, canary: bool = False, task_image: str | None = None) -> TrialRecord:
    base: dict[str, Any] = {"task": task, "trial_name": trial_name, "agent_name": agent,
                            "runner_digest": runner.digest, "harbor_version": harbor_version, "canary": canary,
                            "task_image": task_image}
    try:
        raw: bytes | None = result_path.read_bytes()
    except FileNotFoundError:
        raw = None
    except OSError:
        return TrialRecord(**base, outcome="infra_error", reward=None, exception_type="UnreadableTrialResult",
                           reason="the trial's result is unreadable")
    graded = grade_result(raw)  # the one rule (sealing and verify recompute it from the same bytes)
    data = graded.data
    base["reason"] = graded.reason[:500] if graded.reason else None
    if not data:
        return TrialRecord(**base, outcome=graded.outcome, reward=graded.reward, exception_type=graded.exception_type)
    raw_info = data.get("agent_info")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    usage = _model_usage(data.get("agent_result"))
    return TrialRecord(
        **{**base, "agent_name": str(info.get("name") or agent), **usage},
        outcome=graded.outcome,
        reward=graded.reward,
        exception_type=graded.exception_type,
        agent_version=None if info.get("version") is None else str(info["version"]),
        started_at=_text(data.get("started_at")),
        finished_at=_text(data.get("finished_at")),
        agent_seconds=_seconds(data.get("agent_execution")),
        verifier_seconds=_seconds(data.get("verifier")),
        total_seconds=_seconds({"started_at": data.get("started_at"), "finished_at": data.get("finished_at")}),
    )


def grade_run(
    run_dir: Path,
    record: RunRecord,
    policy: InfraPolicy,
    runner: RunnerInfo,
    *,
    started_at: str,
    finished_at: str,
    failure: str | None = None,
    graded_by: str | None = None,
) -> Grading:
    """Grade ``run_dir``; ``failure`` (timeout, runner usage error) forces FAILED with no score; ``graded_by``:
    the worker that decided the outcome."""
    payload = record.payload
    plan = read_plan(run_dir)
    harbor_version = plan.harbor_version if plan else None
    planned = [(t.task, t.trial_name, t.canary) for t in plan.trials] if plan else []
    trials = tuple(
        grade_trial(run_dir / "harbor" / name / "result.json", task, name, payload.agent, runner, harbor_version,
                    canary=canary)
        for task, name, canary in planned
    )
    return grade_trials(record, policy, trials, started_at=started_at, finished_at=finished_at, failure=failure,
                        harbor_version=harbor_version, agent_version_pin=plan.agent_version if plan else None,
                        model=plan.model if plan else None, graded_by=graded_by)


def run_dataset(recorded: Iterable[str | None]) -> tuple[str | None, str | None]:
    """(the run's one dataset digest, None) from its recorded trials' digests; (None, the failure) when they
    differ: trials rendered from different dataset bytes (the policy's digest edited mid-run, a trial
    recorded without one) are no one score."""
    found = set(recorded)
    if len(found) > 1:
        return None, f"the run's trials ran on different datasets ({', '.join(sorted(map(str, found)))})"
    return next(iter(found), None), None


def grade_trials(
    record: RunRecord,
    policy: InfraPolicy,
    trials: tuple[TrialRecord, ...],
    *,
    started_at: str,
    finished_at: str,
    failure: str | None = None,
    harbor_version: str | None = None,
    agent_version_pin: str | None = None,
    model: str | None = None,
    dataset_digest: str | None = None,
    graded_by: str | None = None,
) -> Grading:
    """Grade a run from its graded trials (each exactly once); ``failure`` forces FAILED with no score.
    ``dataset_digest``: the one content digest of the dataset every trial ran from; ``graded_by``: the id of the
    worker that decided the outcome (graded the trials, or failed the run before any ran)."""
    payload = record.payload
    scored = [t for t in trials if not t.canary]  # a tamper canary never counts (scoring.scored_outcomes)
    counts = count(t.outcome for t in scored)
    infra = counts.infra_errors
    reason: str | None = failure
    tampered = sorted({t.task for t in trials if t.canary and t.outcome == "resolved"})
    if reason is None and tampered:
        reason = (f"tampered: canary task {', '.join(tampered)} was resolved, and its tests cannot be passed "
                  "honestly (they contradict each other); the score is withheld")
    if reason is None and not scored:
        reason = "no trials were planned (trials.json missing or empty)"
    if reason is None and policy.infra_errors_exceed_threshold(infra, len(scored)):
        reason = (f"{infra} of {len(scored)} trials are infrastructure errors, more than "
                  f"{policy.infra_error_threshold_percent:g}% allowed")
    if reason is None and counts.completed == 0:
        reason = "no trial completed"
    ok = reason is None
    return Grading(
        run_id=record.run_id,
        status="SUCCEEDED" if ok else "FAILED",
        reason=reason,
        suite=payload.suite,
        agent=payload.agent,
        counts=counts,
        score=score_of(counts) if ok else None,
        trials=trials,
        harbor_version=harbor_version,
        agent_version_pin=agent_version_pin,
        model=model,
        dataset_digest=dataset_digest,
        subset=payload.tasks,
        policy_digest=policy.digest,
        runner_ref=payload.runner,
        api_ref=payload.api,
        started_at=started_at,
        finished_at=finished_at,
        graded_by=graded_by,
    )


def infra_error_grading(record: RunRecord, reason: str, *, started_at: str, finished_at: str,
                        policy_digest: str | None = None, graded_by: str | None = None) -> Grading:
    """The grading of a run that ended in INFRA_ERROR: counts only, no score; ``graded_by``: the worker that
    ended it."""
    return Grading(
        run_id=record.run_id,
        status="INFRA_ERROR",
        reason=reason,
        suite=record.payload.suite,
        agent=record.payload.agent,
        counts=GradeCounts(total=0, completed=0, resolved=0, unresolved=0, infra_errors=0),
        score=None,
        subset=record.payload.tasks,
        policy_digest=policy_digest,
        runner_ref=record.payload.runner,
        api_ref=record.payload.api,
        started_at=started_at,
        finished_at=finished_at,
        graded_by=graded_by,
    )
