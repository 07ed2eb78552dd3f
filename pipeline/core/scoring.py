"""The grading rule, in one home: a trial's outcome from its Harbor ``result.json``, a run's counts and
score from its trials, and the check that a document's claim is what the trial evidence says.

The worker's grader (``pipeline.infra.worker.grading``), the seal job (``pipeline.evidence.trials``) and
``benchseal verify`` all call these functions, so a score is recomputed from the same bytes by the
same rule wherever it is read. Per trial (its ``result.json``, read as strict JSON):

* no result.json, not strict JSON (duplicate keys, NaN, Infinity), not an object -> ``infra_error``;
* the agent never started (no ``agent_setup`` start in the result): whatever failed is the
  infrastructure's (environment build or start) -> ``infra_error``;
* an exception the machinery itself records (``INFRA_EXCEPTIONS``: benchseal's grader or engine
  failing, Harbor's environment start timeout, a cancelled trial) -> ``infra_error``;
* otherwise the trial is the agent's: its exception (any other type: its own crash, its timeout, a
  non-zero exit, a verifier that hangs on what it left) does not take the trial out of the
  denominator. The reward counts only when it comes from benchseal's grader
  (``pipeline.runner.grader``: ``rewards`` holds ``reward`` 0 or 1, the test command's exit status
  ``GRADER_EXIT_KEY`` and ``GRADER_TIMEOUT_KEY``, and they agree): reward 1 -> ``resolved``; no
  reward, an invalid one, or one Harbor read from a reward file -> ``unresolved`` (``NoReward``,
  ``InvalidReward``, ``RewardNotFromGrader``).

Which failure decided it: ``ResultGrade.reason``, one line.

score = round(resolved / completed, SCORE_DIGITS), only on SUCCEEDED (``contracts.check_score``): the
mean pass rate over trials (a task with several attempts counts each). Its noise: ``wilson_interval``
(95 %, same rounding, only where there is a score) and ``task_counts`` (each task's attempts,
completed and resolved), both in summary.json and checked by ``benchseal verify``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core import strictjson
from pipeline.core.contracts import SCORE_DIGITS, GradeCounts, Grading, TrialOutcome, trial_attempt, trial_short_id
from pipeline.core.documents import ScoreInterval, TaskCounts, TrialsPlan, parse_document
from pipeline.core.errors import CheckFailed, ValidationError

# Exceptions that are the agent's doing (Harbor's names): kept for readers of older results; the rule
# below no longer needs them (any exception once the agent has started is the agent's, unless it is
# one of INFRA_EXCEPTIONS).
AGENT_EXCEPTIONS = frozenset(
    {
        "AgentTimeoutError",
        "AgentSetupTimeoutError",
        "NonZeroAgentExitCodeError",
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "UnsupportedModelParametersError",
        "OutputTokenExceededError",
        "ContextWindowExceededError",
        "AgentSafetyRefusalError",
    }
)
# Failures of the machinery, raised by benchseal's own runner code (never by the agent, which runs in
# a container of its own and whose exceptions reach the runner as one type of its own): the grader
# (pipeline.runner.grader.GraderFault), the engine environment (pipeline.runner.engine_env.EngineFault),
# the agent channel's runner side (pipeline.runner.agent_box: ChannelFault), Harbor's start timeout of
# an environment, and a trial cancelled by the runner's shutdown.
INFRA_EXCEPTIONS = frozenset(
    {"GraderFault", "EngineFault", "ChannelFault", "EnvironmentStartTimeoutError", "CancelledError"}
)
# The keys benchseal's grader writes into Harbor's verifier_result.rewards.
REWARD_KEY = "reward"
GRADER_EXIT_KEY = "grader_exit_status"  # the test command's exit status (-1: it timed out)
GRADER_TIMEOUT_KEY = "grader_timed_out"  # 1 when the test command was stopped at the grader's limit
# Where a run's trial evidence sits, relative to its artifacts directory (the names in evidence-SHA256SUMS).
PLAN_NAME = "evidence/trials.json"
HARBOR_PREFIX = "evidence/harbor/"
RESULT_FILE = "result.json"
EVIDENCE = "the trial evidence"


def result_name(trial: str) -> str:
    """The name of a trial's result.json in the evidence (and in evidence-SHA256SUMS)."""
    return f"{HARBOR_PREFIX}{trial}/{RESULT_FILE}"


def is_result_name(name: str) -> bool:
    """``name`` is a trial's result.json (``evidence/harbor/<trial>/result.json``), not a file deeper down."""
    parts = name.split("/")
    return len(parts) == 4 and name.startswith(HARBOR_PREFIX) and parts[2] != "" and parts[3] == RESULT_FILE


def strict_json(raw: bytes) -> Any:
    """JSON as every reader reads it alike: UTF-8, no duplicate keys, no NaN/Infinity. ValueError otherwise."""
    try:
        return strictjson.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


@dataclass(frozen=True)
class ResultGrade:
    """What one result.json says: the outcome, the reward (a finite number in [0, 1] or None) and the
    exception type (or the rule's own name) that decided it; ``reason`` in one line for a trial that was not
    resolved; ``data`` is the parsed object ({} when there is none)."""

    outcome: TrialOutcome
    reward: float | None
    exception_type: str | None
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    reason: str | None = field(default=None, compare=False)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _reward(value: Any) -> tuple[float | None, bool]:
    """(reward, valid): None and valid when absent; a bool, a string, NaN or a number outside [0, 1] is invalid."""
    if value is None:
        return None, True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, False
    try:
        reward = float(value)
    except OverflowError:  # an integer too large for a float
        return None, False
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        return None, False
    return reward, True


def _grader_reward(rewards: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """(reward, None) when ``rewards`` is benchseal's grader's verdict, else (None, why not)."""
    if not rewards:
        return None, "NoReward"
    reward, valid = _reward(rewards.get(REWARD_KEY))
    exit_status, timed_out = rewards.get(GRADER_EXIT_KEY), rewards.get(GRADER_TIMEOUT_KEY)
    if not valid or reward is None:
        return None, "InvalidReward" if not valid else "NoReward"
    if set(rewards) != {REWARD_KEY, GRADER_EXIT_KEY, GRADER_TIMEOUT_KEY} \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in (exit_status, timed_out)) \
            or timed_out not in (0, 1):
        return None, "RewardNotFromGrader"
    passed = exit_status == 0 and timed_out == 0
    if reward != (1.0 if passed else 0.0):
        return None, "RewardNotFromGrader"
    return reward, None


def _started(phase: Any) -> bool:
    return bool(_mapping(phase).get("started_at"))


def _one_line(text: Any, limit: int = 200) -> str:
    """``text`` on one line of at most ``limit`` characters: over it, its head and its tail around " … " (an
    error names its cause last: a cut end lost the engine's "permission denied" after a long path)."""
    line = " ".join(str(text or "").split())
    if len(line) <= limit:
        return line
    tail = (limit - 3) // 3
    return line[: limit - 3 - tail] + " … " + line[len(line) - tail:]


def _failure_reason(rewards: Mapping[str, Any], exception_type: str | None, message: Any, why: str | None) -> str:
    """One line: why a trial that ran its agent was not resolved."""
    parts: list[str] = []
    if exception_type is not None:
        parts.append(f"agent phase: {exception_type}" + (f": {_one_line(message)}" if message else ""))
    if why is None:
        if rewards.get(GRADER_TIMEOUT_KEY) == 1:
            parts.append("the tests did not finish within the verifier's time limit")
        else:
            parts.append(f"the tests failed (exit status {rewards.get(GRADER_EXIT_KEY)})")
    elif why == "NoReward":
        parts.append("not graded (no verdict from the grader)")
    elif why == "InvalidReward":
        parts.append("not graded (the verdict is not a reward in [0, 1])")
    else:
        parts.append("not graded by benchseal's grader (a reward file's value is never trusted)")
    return "; ".join(parts)


def grade_result(raw: bytes | None) -> ResultGrade:
    """Grade one trial from the bytes of its result.json (None: there is none). The one rule."""
    if raw is None:
        return ResultGrade("infra_error", None, "MissingTrialResult", reason="the trial left no result")
    try:
        data = strict_json(raw)
    except ValueError:
        return ResultGrade("infra_error", None, "UnreadableTrialResult", reason="the trial's result is unreadable")
    if not isinstance(data, dict):
        return ResultGrade("infra_error", None, "UnreadableTrialResult", reason="the trial's result is unreadable")
    rewards = _mapping(_mapping(data.get("verifier_result")).get("rewards"))
    exception = data.get("exception_info")
    exception_type: str | None = None
    message: Any = None
    if exception is not None:
        named = _mapping(exception).get("exception_type")
        exception_type = named if isinstance(named, str) and named else "MalformedExceptionInfo"
        message = _mapping(exception).get("exception_message")
    if exception_type == "MalformedExceptionInfo":  # Harbor always writes an object naming a type: not its result
        return ResultGrade("infra_error", None, exception_type, data, "the trial's result is malformed")
    if exception_type in INFRA_EXCEPTIONS or not _started(data.get("agent_setup")):
        what = exception_type or "AgentNeverStarted"
        reason = f"infrastructure: {what}" + (f": {_one_line(message)}" if message else "")
        return ResultGrade("infra_error", None, what, data, reason)
    reward, why = _grader_reward(rewards)
    if reward is not None and reward >= 1.0:
        return ResultGrade("resolved", reward, exception_type, data)
    return ResultGrade("unresolved", reward, exception_type or why, data,
                       _failure_reason(rewards, exception_type, message, why))


def count(outcomes: Iterable[TrialOutcome]) -> GradeCounts:
    """The counts of a run's trials (each exactly once)."""
    listed = list(outcomes)
    resolved, unresolved = listed.count("resolved"), listed.count("unresolved")
    return GradeCounts(total=len(listed), completed=resolved + unresolved, resolved=resolved, unresolved=unresolved,
                       infra_errors=listed.count("infra_error"))


def score_of(counts: GradeCounts) -> float | None:
    """resolved / completed, rounded as the grader stores it (None when nothing completed)."""
    return round(counts.resolved / counts.completed, SCORE_DIGITS) if counts.completed else None


# --- noise: the score's interval and each task's pass counts -------------------------------------

WILSON_Z = 1.959964  # the two-sided 95 % normal quantile (ScoreInterval: confidence 0.95, method "wilson")


def wilson_interval(resolved: int, completed: int, z: float = WILSON_Z) -> tuple[float, float] | None:
    """The Wilson score interval for the pass rate p = resolved / completed (None when completed = 0).

    With n = completed::

        centre = (p + z²/(2n)) / (1 + z²/n)
        half   = z / (1 + z²/n) * sqrt(p(1 - p)/n + z²/(4n²))
        (low, high) = (centre - half, centre + half), clamped to [0, 1]

    each end rounded to ``SCORE_DIGITS`` places like the score (rounding is monotone, so
    low <= score <= high holds for the rounded values too). z = 1.959964 gives 95 %. Unlike the
    normal (Wald) interval it is never [p, p] for p = 0 or 1: 0/3 gives [0, 0.561497].
    """
    if isinstance(resolved, bool) or isinstance(completed, bool) or not 0 <= resolved <= completed:
        raise ValueError(f"need 0 <= resolved <= completed (got {resolved!r} of {completed!r})")
    if completed == 0:
        return None
    n = completed
    p = resolved / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return round(max(0.0, centre - half), SCORE_DIGITS), round(min(1.0, centre + half), SCORE_DIGITS)


def score_interval(status: str, counts: GradeCounts) -> ScoreInterval | None:
    """summary.json's ``interval``: the 95 % Wilson interval of the score, only where there is a score
    (a SUCCEEDED run, completed > 0; ``contracts.check_score``), else None."""
    bounds = wilson_interval(counts.resolved, counts.completed) if status == "SUCCEEDED" else None
    if bounds is None:
        return None
    return ScoreInterval(low=bounds[0], high=bounds[1])


def task_counts(trials: Iterable[tuple[str, TrialOutcome]]) -> dict[str, TaskCounts]:
    """Per task (sorted by name), from (task, outcome) of each trial: ``attempts`` (its trials, any
    outcome), ``completed`` (resolved or unresolved) and ``resolved``. Summed over the tasks they are
    the run's total, completed and resolved counts."""
    tally: dict[str, list[int]] = {}
    for task, outcome in trials:
        row = tally.setdefault(task, [0, 0, 0])
        row[0] += 1
        row[1] += outcome != "infra_error"
        row[2] += outcome == "resolved"
    return {task: TaskCounts(attempts=a, completed=c, resolved=r) for task, (a, c, r) in sorted(tally.items())}


def grading_noise(grading: Grading) -> tuple[ScoreInterval | None, dict[str, TaskCounts]]:
    """A graded run's interval and per-task counts (tamper canaries left out: they are never scored), as
    summary.json states them: what the summary, the worker's history entry and the comparison checks all take
    from the same grading."""
    return score_interval(grading.status, grading.counts), task_counts((t.task, t.outcome) for t in grading.trials
                                                                       if not t.canary)


# --- a claim against the trial evidence --------------------------------------------------------

@dataclass(frozen=True)
class ClaimedTrial:
    task: str
    trial: str
    outcome: str
    reward: float | None


@dataclass(frozen=True)
class Claim:
    """What a document (grading.json, run.json, summary.json) says about the run's trials."""

    document: str  # the file, e.g. "grading.json"
    label: str  # the prefix of a field in messages, e.g. "grading"
    run_id: str
    status: str
    counts: GradeCounts | None
    score: float | None
    trials: tuple[ClaimedTrial, ...] | None = None  # None: the document lists no trials (run.json)
    # summary.json's score interval and per-task counts, checked only when the document states them
    # (``states_noise``: summaries written before these fields existed omit both).
    interval: ScoreInterval | None = None
    tasks: Mapping[str, TaskCounts] | None = None
    states_noise: bool = False


@dataclass(frozen=True)
class EvidenceTrial:
    task: str
    trial: str
    grade: ResultGrade
    canary: bool = False  # a tamper canary (the plan says so): never counted; resolved = tampered


@dataclass(frozen=True)
class TrialEvidence:
    """A run's trial evidence: the plan's bytes (``evidence/trials.json``, None when absent), every
    evidence file name under ``evidence/`` (as evidence-SHA256SUMS lists them), and the bytes of each
    trial's result.json present (by trial name)."""

    plan: bytes | None
    names: frozenset[str]
    results: Mapping[str, bytes]


def _plan(evidence: TrialEvidence, claim: Claim) -> list[tuple[str, str, bool]]:
    if evidence.plan is None:
        if claim.status == "SUCCEEDED":
            raise CheckFailed(f"{PLAN_NAME}: missing from {EVIDENCE}; a score needs the plan of its trials")
        return [(t.task, t.trial, False) for t in claim.trials or ()]
    try:
        plan = parse_document(TrialsPlan, strict_json(evidence.plan), PLAN_NAME)
    except (ValueError, ValidationError) as exc:
        if claim.status != "SUCCEEDED":
            # The grader could not read it either (read_plan: no trials graded): nothing is scored.
            return [(t.task, t.trial, False) for t in claim.trials or ()]
        if isinstance(exc, ValidationError):
            raise CheckFailed(f"{exc.field}: {exc.rule}") from None
        raise CheckFailed(f"{PLAN_NAME}: not valid JSON ({exc})") from None
    if plan.run_id != claim.run_id:
        raise CheckFailed(f"{PLAN_NAME}: run_id is {plan.run_id!r}, not {claim.document}'s {claim.run_id!r}")
    return [(t.task, t.trial_name, t.canary) for t in plan.trials]


def _check_attempts(planned: Sequence[tuple[str, str, bool]], run_id: str) -> set[str]:
    """The planned trial names, after checking that each is named for this run and its task
    (``contracts.trial_attempt``) and planned once, and that every task is planned either once as
    ``<task>__<short>`` or as each of the attempts 1..n of ``<task>__a<k>of<n>__<short>``, one n for
    the whole run (a suite's ``attempts``): a plan without one of a task's attempts is refused."""
    short = trial_short_id(run_id)
    seen: set[str] = set()
    attempts: dict[str, list[tuple[int, int]]] = {}
    for task, trial, _ in planned:
        if trial in seen:
            raise CheckFailed(f"{PLAN_NAME}: {trial} is planned twice")
        parsed = trial_attempt(trial, task, run_id)
        if task in attempts and (attempts[task][0][1] == 1 or (parsed is not None and parsed[1] == 1)):
            raise CheckFailed(f"{PLAN_NAME}: task {task} is planned twice")
        if parsed is None:
            raise CheckFailed(f"{PLAN_NAME}: trial {trial!r} is not task {task!r} of run {run_id} "
                              f"({task}__{short}, or {task}__a<k>of<n>__{short} for attempt k of n)")
        seen.add(trial)
        attempts.setdefault(task, []).append(parsed)
    counts = sorted({n for pairs in attempts.values() for _, n in pairs})
    if len(counts) > 1:
        raise CheckFailed(f"{PLAN_NAME}: the tasks are planned with different numbers of attempts "
                          f"({', '.join(map(str, counts))}); a run has one")
    for task, pairs in attempts.items():
        n = pairs[0][1]
        have = sorted(k for k, _ in pairs)
        if have != list(range(1, n + 1)):
            missing = sorted(set(range(1, n + 1)) - set(have))
            raise CheckFailed(f"{PLAN_NAME}: task {task} is planned with attempts {have} of {n}; "
                              f"attempt {', '.join(map(str, missing))} is missing")
    return seen


def evidence_trials(evidence: TrialEvidence, claim: Claim) -> tuple[EvidenceTrial, ...]:
    """Each planned trial graded from its result.json, after the plan and the evidence dirs are
    checked against each other: no trial planned twice, each trial named for this run and its task, each
    task planned once or as attempts 1..n of the run's one n (``_check_attempts``), no evidence dir for a
    trial that is not planned; a SUCCEEDED run has trials, and each has its result.json (a trial without
    evidence cannot be checked, and would leave the score unsupported)."""
    planned = _plan(evidence, claim)
    seen_trials = _check_attempts(planned, claim.run_id)
    dirs = {name[len(HARBOR_PREFIX):].partition("/")[0] for name in evidence.names if name.startswith(HARBOR_PREFIX)}
    for stray in sorted(dirs - seen_trials):
        raise CheckFailed(f"{HARBOR_PREFIX}{stray}: trial evidence for no planned trial ({PLAN_NAME} does not "
                          "list it)")
    if claim.status == "SUCCEEDED":
        if not planned:
            raise CheckFailed(f"{claim.label}.status: SUCCEEDED in {claim.document}, but {PLAN_NAME} plans no trials")
        if all(canary for _, _, canary in planned):
            raise CheckFailed(f"{PLAN_NAME}: every planned trial is a tamper canary; a score needs scored trials")
        for _, trial, _ in planned:
            if result_name(trial) not in evidence.names or trial not in evidence.results:
                what = "dir" if trial not in dirs else RESULT_FILE
                raise CheckFailed(f"{result_name(trial)}: missing ({'no trial ' + what}); every trial of a scored "
                                  "run needs its result in the trial evidence")
    return tuple(EvidenceTrial(task, trial, grade_result(evidence.results.get(trial)), canary)
                 for task, trial, canary in planned)


def _disagree(claim: Claim, field_name: str, claimed: object, actual: object) -> CheckFailed:
    return CheckFailed(f"{claim.label}.{field_name}: {claimed!r} in {claim.document}, {actual!r} from {EVIDENCE}")


def check_claim(claim: Claim, trials: Sequence[EvidenceTrial]) -> GradeCounts:
    """Raise CheckFailed naming the first field where ``claim`` is not what the trials say; return the
    counts the evidence gives.

    A SUCCEEDED claim must agree on every trial, the counts and the score. A run that did not succeed
    carries no score (``check_score``); a trial of it may be counted as an infrastructure error that the
    evidence grades otherwise (the grader knew of a failure the evidence cannot show: a timeout, attempts
    used up), never the other way round."""
    tampered = sorted({t.task for t in trials if t.canary and t.grade.outcome == "resolved"})
    if tampered and claim.status == "SUCCEEDED":
        raise CheckFailed(f"{claim.label}.status: SUCCEEDED in {claim.document}, but {EVIDENCE} shows the tamper "
                          f"canary {', '.join(tampered)} resolved: the run was tampered with and has no score")
    canaries = {t.trial for t in trials if t.canary}
    graded_pairs: list[tuple[str, TrialOutcome]] = [(t.task, t.grade.outcome) for t in trials if not t.canary]
    actual = count(outcome for _, outcome in graded_pairs)
    if claim.trials is not None:
        by_name = {t.trial: t for t in trials}
        claimed_names = [t.trial for t in claim.trials]
        for name in claimed_names:
            if claimed_names.count(name) > 1:
                raise CheckFailed(f"{claim.label}.trials: {name} is listed twice in {claim.document}")
            if name not in by_name:
                raise CheckFailed(f"{claim.label}.trials: {name} is in {claim.document}, but no such trial is "
                                  f"planned in {EVIDENCE}")
        for trial in trials:
            if trial.trial not in claimed_names:
                raise CheckFailed(f"{claim.label}.trials: {trial.trial} is planned in {EVIDENCE}, but "
                                  f"{claim.document} does not list it")
        downgraded: list[TrialOutcome] = []
        for claimed in claim.trials:
            graded = by_name[claimed.trial]
            where = f"trials[{claimed.trial}]"
            if claimed.task != graded.task:
                raise _disagree(claim, f"{where}.task", claimed.task, graded.task)
            excused = (claim.status != "SUCCEEDED" and claimed.outcome == "infra_error")
            if claimed.outcome != graded.grade.outcome and not excused:
                raise _disagree(claim, f"{where}.outcome", claimed.outcome, graded.grade.outcome)
            if not excused and not _same_reward(claimed.reward, graded.grade.reward):
                raise _disagree(claim, f"{where}.reward", claimed.reward, graded.grade.reward)
            downgraded.append("infra_error" if excused else graded.grade.outcome)
        graded_pairs = [(t.task, outcome) for t, outcome in zip(claim.trials, downgraded, strict=True)
                        if t.trial not in canaries]
        actual = count(outcome for _, outcome in graded_pairs)
    check_counts(claim, actual)
    if claim.states_noise and claim.status == "SUCCEEDED":
        # What a score rests on; a run without a score claims no interval (its task counts are informational).
        check_noise(claim, actual, graded_pairs)
    return actual


def check_noise(claim: Claim, actual: GradeCounts, trials: Iterable[tuple[str, TrialOutcome]]) -> None:
    """``claim``'s interval is the Wilson interval of ``actual`` (null unless scored) and its per-task
    counts are those of ``trials`` ((task, outcome) as the evidence grades them). ``check_claim`` runs
    it on a SUCCEEDED claim that states them."""
    expected_interval = score_interval(claim.status, actual)
    if claim.interval != expected_interval:
        def shown(value: ScoreInterval | None) -> object:
            return None if value is None else [value.low, value.high]
        raise _disagree(claim, "interval", shown(claim.interval), shown(expected_interval))
    expected_tasks = task_counts(trials)
    claimed_tasks = dict(claim.tasks or {})
    for task in sorted(set(claimed_tasks) | set(expected_tasks)):
        got, want = claimed_tasks.get(task), expected_tasks.get(task)
        if got != want:
            def counts_of(value: TaskCounts | None) -> object:
                return None if value is None else value.to_json_dict()
            raise _disagree(claim, f"tasks[{task}]", counts_of(got), counts_of(want))


def check_counts(claim: Claim, actual: GradeCounts) -> None:
    """``claim``'s counts (and, on SUCCEEDED, its score) are ``actual``, the counts the evidence gives."""
    if claim.counts is None:
        if claim.status == "SUCCEEDED":
            raise CheckFailed(f"{claim.label}.counts: missing in {claim.document}; a scored run states its counts")
    else:
        for name in ("total", "completed", "resolved", "unresolved", "infra_errors"):
            if getattr(claim.counts, name) != getattr(actual, name):
                raise _disagree(claim, name, getattr(claim.counts, name), getattr(actual, name))
    if claim.status == "SUCCEEDED" and claim.score != score_of(actual):
        raise _disagree(claim, "score", claim.score, score_of(actual))


def _same_reward(claimed: float | None, actual: float | None) -> bool:
    if claimed is None or actual is None:
        return claimed is None and actual is None
    return isinstance(claimed, int | float) and not isinstance(claimed, bool) and claimed == actual
