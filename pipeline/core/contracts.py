"""Typed models for everything that crosses a stage or process boundary.

build ──DigestsFile──▶ dispatch ──DispatchPayload──▶ infra accept ──(queue)──▶
worker ──Grading + RunStatus──▶ evidence ──(artifacts dir)──▶ publish ──▶ verify

Every image reference is re-validated here with ``pipeline.core.digests`` on load,
so a consumer can never hold an unvalidated reference.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, model_validator
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.digests import parse_ref, validate_digest, validate_name
from pipeline.core.errors import TagIsARef, ValidationError

COMMIT_RE = re.compile(r"\A[0-9a-f]{40}\Z")
CORRELATION_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{7,127}\Z")
REPOSITORY_RE = re.compile(r"\A[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}\Z")
REPOSITORY_RULE = ("must be OWNER/NAME, a GitHub owner/name in ASCII: letters, digits and '-' in the owner "
                   "(at most 39); letters, digits, '.', '_' and '-' in the name (at most 100), "
                   "which is not '.' or '..'")
IMAGE_ROLES = ("runner", "api")
# The OIDC issuer of GitHub Actions' job tokens: the issuer of every keyless signature benchseal
# expects (public-good, or GitHub-shaped from the private test instance).
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"


def _commit(value: str) -> str:
    if not COMMIT_RE.match(value):
        raise ValueError("must be a full 40-character lowercase hex commit SHA")
    return value


CORRELATION_RULE = "must be 8-128 characters of [A-Za-z0-9._-], starting with a letter or digit (no spaces)"


def _correlation(value: str) -> str:
    if not CORRELATION_RE.match(value):
        raise ValueError(CORRELATION_RULE)
    return value


def validate_correlation(value: str, field: str = "correlation") -> str:
    """The correlation-id rule outside a model (CLI options); raises our ValidationError naming ``field``."""
    if not isinstance(value, str) or not CORRELATION_RE.match(value):
        raise ValidationError(field, CORRELATION_RULE, value)
    return value


def _repository(value: str) -> str:
    canonical_repository(value)
    return value


def _is_repository(value: str) -> bool:
    return value.isascii() and REPOSITORY_RE.match(value) is not None and value.partition("/")[2] not in {".", ".."}


def canonical_repository(value: str) -> str:
    """The form two GitHub repository names are compared in: ``owner/name`` lowercased.

    GitHub owner and repository names are case-insensitive (``ACME/App`` is ``acme/app``),
    so every comparison (payload against policy, policy against the API's answer) uses
    this form. The shape is checked first, on ASCII only: ``str.lower`` maps some
    non-ASCII characters onto ASCII letters (KELVIN SIGN to ``k``), which would let a
    lookalike name compare equal. ``.`` and ``..`` are not repository names (GitHub
    refuses them; in a path they would traverse). Raises ValueError with ``REPOSITORY_RULE``.
    """
    if not isinstance(value, str) or not _is_repository(value):
        raise ValueError(REPOSITORY_RULE)
    return value.lower()


def validate_repository(value: object, field: str = "repo") -> str:
    """The repository-name rule (the one home: options, policies, tag resolution, dispatch) outside a
    model; ``value`` unchanged, or our ValidationError naming ``field`` and ``REPOSITORY_RULE``."""
    if not isinstance(value, str) or not _is_repository(value):
        raise ValidationError(field, REPOSITORY_RULE, value)
    return value


def _as_value_error(check: Callable[[str], str], value: str) -> str:
    # pydantic reports ValueError with the field's location; keep the validator's rule text.
    try:
        return check(value)
    except ValidationError as exc:
        raise ValueError(exc.rule) from None


# Plain functions, not closures built at import: mutation testing (docs/architecture.md) mutates call-time code only.
def _digest(value: str) -> str:
    return _as_value_error(validate_digest, value)


def _name(value: str) -> str:
    return _as_value_error(validate_name, value)


def _ref(value: str) -> str:
    return _as_value_error(lambda v: parse_ref(v).ref, value)


CommitSha = Annotated[str, AfterValidator(_commit)]
CorrelationId = Annotated[str, AfterValidator(_correlation)]
RepositorySlug = Annotated[str, AfterValidator(_repository)]
Digest = Annotated[str, AfterValidator(_digest)]
ImageName = Annotated[str, AfterValidator(_name)]
PinnedRef = Annotated[str, AfterValidator(_ref)]
# A worker's id (pipeline.infra.worker.config.WorkerConfig.worker_id: <host>-<pid> unless set), as trial records,
# gradings, summary.json and the test-result statement name the worker that ran a trial or graded a run.
WorkerId = Annotated[str, Field(min_length=1, max_length=255)]


def load_model[M: BaseModel](model: type[M], data: object, source: str) -> M:
    """Validate ``data`` as ``model``; raise our ValidationError naming the first bad field."""
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(root)"
        message = first["msg"].removeprefix("Value error, ")
        raise ValidationError(f"{source}: {field}", message, first.get("input")) from None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# A reusable workflow's exact job_workflow_ref: OWNER/REPO/.github/workflows/FILE@REF, REF one exact
# refs/tags/NAME or refs/heads/NAME, or a 40-hex commit (what a caller's `uses: ...@<sha>` pins).
BUILDER_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}/\.github/workflows/[A-Za-z0-9_.-]{1,100}"
                        r"\.ya?ml@(?:[0-9a-f]{40}|refs/(?:heads|tags)/[A-Za-z0-9][A-Za-z0-9._/-]{0,199})\Z")
BUILDER_RULE = ("must be a reusable workflow's exact job_workflow_ref: OWNER/REPO/.github/workflows/FILE@REF, REF "
                "a 40-hex commit or one exact refs/tags/NAME or refs/heads/NAME (no patterns)")


def builder_problem(value: object) -> str | None:
    if not isinstance(value, str) or not BUILDER_RE.match(value):
        return BUILDER_RULE
    ref = value.rpartition("@")[2]
    if ".." in ref or "//" in ref or ref.endswith(("/", ".", ".lock")):
        return BUILDER_RULE
    return None


def pep503_name(name: str) -> str:
    """A Python distribution name as PEP 503 compares it: runs of -_. become one '-', lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- the release's agent (pipeline/core/project.py: the project file that declares it) ---------

AGENT_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
VERSION_RE = re.compile(r"\A[0-9][A-Za-z0-9.+-]{0,63}\Z")
VERSION_RULE = "must be the tag without one leading 'v': a digit, then at most 63 of [A-Za-z0-9.+-]"
# SRI (https://www.w3.org/TR/SRI/): algorithm, '-', the base64 digest of that algorithm's length.
_SRI_LENGTHS = {"sha256": 32, "sha384": 48, "sha512": 64}
SRI_RULE = "must be one SRI hash: sha256-, sha384- or sha512- followed by the base64 digest of that length"


def sri_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return SRI_RULE
    algorithm, sep, digest = value.partition("-")
    if not sep or algorithm not in _SRI_LENGTHS or not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", digest):
        return SRI_RULE
    try:
        raw = base64.b64decode(digest, validate=True)
    except (binascii.Error, ValueError):
        return SRI_RULE
    return None if len(raw) == _SRI_LENGTHS[algorithm] else SRI_RULE


def _sri(value: str) -> str:
    problem = sri_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def sri_of(algorithm: str, digest: bytes) -> str:
    """The SRI string of a raw digest (``sri_of("sha256", hashlib.sha256(b).digest())``)."""
    value = f"{algorithm}-{base64.b64encode(digest).decode('ascii')}"
    _sri(value)
    return value


def sri_hex(value: str) -> tuple[str, str]:
    """``("sha512", "<hex>")`` of an SRI string (for CycloneDX hashes and in-toto digests)."""
    _sri(value)
    algorithm, _, digest = value.partition("-")
    return algorithm, base64.b64decode(digest).hex()


Integrity = Annotated[str, AfterValidator(_sri)]
AgentName = Annotated[str, Field(pattern=AGENT_NAME_PATTERN)]


class AgentArtifact(_Frozen):
    """The agent a release produced, as the build resolved and checked it."""

    name: AgentName
    kind: Literal["npm", "python"]
    package: str = Field(max_length=214, pattern=r"^[@A-Za-z0-9][@A-Za-z0-9._/-]*$")
    version: str = Field(pattern=VERSION_RE.pattern.replace(r"\A", "^").replace(r"\Z", "$"))
    integrity: Integrity
    source_commit: CommitSha



# --- build -> dispatch ---------------------------------------------------------

class SourceInfo(_Frozen):
    commit: CommitSha
    ref: str = Field(max_length=255)
    repository: str = Field(max_length=255)


class ImageEntry(_Frozen):
    name: ImageName
    digest: Digest
    ref: PinnedRef
    tags: tuple[str, ...] = ()

    def model_post_init(self, __context: object) -> None:
        if self.ref != f"{self.name}@{self.digest}":
            raise ValueError("ref must equal '<name>@<digest>' of the same entry")


class DigestsFile(_Frozen):
    """``benchseal.digests/v1``: what ``benchseal build`` emits."""

    schema_: Literal["benchseal.digests/v1"] = Field(alias="schema")
    source: SourceInfo
    images: dict[Literal["runner", "api"], ImageEntry]
    agent: AgentArtifact | None = None  # the release's agent, baked into the runner
    # The adopter's own images (benchseal.toml [images.<name>], built with BuildKit), by the project
    # file's name rule (pipeline.core.project.IMAGE_NAME_PATTERN); never one of benchseal's own names.
    project_images: dict[
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")], ImageEntry
    ] = Field(default_factory=dict, max_length=16)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _own_names_reserved(self) -> DigestsFile:
        clash = sorted(set(self.project_images) & {"runner", "api", "base", "runner-base"})
        if clash:
            raise ValueError(f"project_images must not use benchseal's own image names: {', '.join(clash)}")
        return self

    def to_json_dict(self) -> dict[str, object]:
        # Without an agent or project images the file is what it was before those fields existed.
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not self.project_images:
            data.pop("project_images", None)
        return data


# --- dispatch -> infra ---------------------------------------------------------

GIT_TAG_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._/-]{0,127}\Z")
GIT_TAG_RULE = ("must be a git tag name: at most 128 characters of [A-Za-z0-9._/-], starting with a letter or digit; "
                "no '..', no empty or '.'-led component, no trailing '/' or '.', no '.lock' component")


GIT_TAG_REF_RULE = "must be a tag name such as v1.2.3, not a ref (drop refs/tags/)"


def _git_tag(value: str) -> str:
    # A ref passes the character class, but 'refs/tags/v1' as a tag would name refs/tags/refs/tags/v1:
    # never the release the caller means.
    if value.startswith("refs/"):
        raise ValueError(GIT_TAG_REF_RULE)
    # git check-ref-format's rules that the character class alone does not give: the tag
    # names a ref path in API URLs and a directory name, so '..', empty or dot-led
    # components and '.lock' never pass.
    parts = value.split("/")
    if not GIT_TAG_RE.match(value) or ".." in value or value.endswith(".") or any(
        not part or part.startswith(".") or part.endswith(".lock") for part in parts
    ):
        raise ValueError(GIT_TAG_RULE)
    return value


def validate_git_tag(value: object, field: str = "tag") -> str:
    """The git tag rule (the one home: payloads, tag resolution, verify's expectation); ValidationError names ``field``.

    A ref (``refs/tags/v1``) is not a tag name (``TagIsARef``): callers that accept one strip the prefix first.
    """
    if not isinstance(value, str):
        raise ValidationError(field, GIT_TAG_RULE, value)
    try:
        return _git_tag(value)
    except ValueError as exc:
        if str(exc) == GIT_TAG_REF_RULE:
            raise TagIsARef(field, GIT_TAG_REF_RULE, value) from None
        raise ValidationError(field, GIT_TAG_RULE, value) from None


GitTag = Annotated[str, AfterValidator(_git_tag)]


class PayloadSource(_Frozen):
    repository: RepositorySlug
    commit: CommitSha
    tag: GitTag


# A task of a run's subset: a task directory's name (pipeline.runner.plan.TASK_NAME_RE), at most this many.
SubsetTask = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
MAX_SUBSET_TASKS = 1000


def _subset(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """A run's task subset in its one spelling: sorted, each name once; empty is None (the whole suite), so
    neither order nor an empty list ever makes a history key of its own."""
    if not value:
        return None
    twice = sorted({name for name in value if value.count(name) > 1})
    if twice:
        raise ValueError(f"names task {twice[0]!r} twice")
    return tuple(sorted(value))


def parse_subset(text: str | None, field: str = "--tasks") -> tuple[str, ...] | None:
    """A comma-separated task list as the CLI and the workflows take it (``a,b``; empty: the whole suite)."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    for name in names:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", name):
            raise ValidationError(field, "each task must be a task directory name ([a-z0-9][a-z0-9_-]{0,63})", name)
    if len(names) > MAX_SUBSET_TASKS:
        raise ValidationError(field, f"names at most {MAX_SUBSET_TASKS} tasks", len(names))
    try:
        return _subset(names)
    except ValueError as exc:
        raise ValidationError(field, str(exc)) from None


class DispatchPayload(_Frozen):
    """``benchseal.dispatch/v1``: the ``client_payload`` / workflow inputs sent to infra.

    At most 10 top-level keys (GitHub's repository_dispatch limit).
    """

    schema_: Literal["benchseal.dispatch/v1"] = Field(alias="schema")
    correlation_id: CorrelationId
    source: PayloadSource
    runner: PinnedRef
    api: PinnedRef
    suite: str = Field(default="smoke", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    agent: str = Field(default="oracle", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    # A subset of the suite's tasks (their directory names): the run plans only these; absent (or empty) means
    # every task. The worker refuses a name its staged dataset lacks (pipeline.runner.plan.select_tasks).
    tasks: Annotated[tuple[SubsetTask, ...] | None, AfterValidator(_subset)] = Field(default=None,
                                                                                    max_length=MAX_SUBSET_TASKS)
    # The release's agent as the build resolved it (absent for calibration agents such as oracle):
    # infra admits it by repository, name and kind, and the worker compares it with what the runner carries.
    agent_artifact: AgentArtifact | None = None

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _artifact_is_the_agent(self) -> DispatchPayload:
        artifact = self.agent_artifact
        if artifact is not None:
            if artifact.name != self.agent:
                raise ValueError(f"agent_artifact.name {artifact.name!r} must be the payload's agent {self.agent!r}")
            if artifact.source_commit != self.source.commit:
                raise ValueError("agent_artifact.source_commit must be the payload's source.commit")
        return self

    def to_json_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- worker -> evidence / api ----------------------------------------------------

# The key a release's CLI agent puts into Harbor's agent metadata for the model calls its CLI reported
# (pipeline.runner.cli_agent writes it, pipeline.infra.worker.grading reads it).
MODEL_CALLS_KEY = "model_calls"


class RunState(StrEnum):
    """A queued run's state: the one definition that the queue's schema (its CHECK), its SQL and its code
    read (pipeline.infra.queue.schema; tests/infra/test_queue_states.py ties them). The values are stored
    in queue databases and run.json: never rename one; a new one needs a schema migration."""

    QUEUED = "QUEUED"
    CLAIMED = "CLAIMED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    INFRA_ERROR = "INFRA_ERROR"


TrialOutcome = Literal["resolved", "unresolved", "infra_error"]


class TrialRecord(_Frozen):
    task: str
    trial_name: str
    outcome: TrialOutcome
    reward: float | None
    exception_type: str | None = None
    runner_digest: Digest | None = None
    task_image: PinnedRef | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the prebuilt image the trial's task ran on, as its task.toml pinned it (name@sha256:...); "
                    "absent for a task built from its Dockerfile (pipeline.infra.worker.task_images)")
    worker: WorkerId | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the worker that ran the trial (its worker id), as the queue's record of the trial names it "
                    "(pipeline.infra.worker.grading.RecordedTrial.worker); absent when no record names one")
    agent_name: str
    agent_version: str | None = None
    harbor_version: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    agent_seconds: float | None = None
    verifier_seconds: float | None = None
    total_seconds: float | None = None
    # Model-backed agents: what the agent reported (Harbor's agent_result), None for test agents.
    model_calls: int | None = Field(default=None, ge=0)
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    # A tamper canary's trial (its task.toml's metadata.benchseal.canary): never counted in the score; if it is
    # resolved the run is FAILED as tampered (pipeline.infra.worker.grading.grade_trials).
    canary: bool = Field(default=False, exclude_if=lambda v: not v)
    # Why the trial was not resolved, in one line (pipeline.core.scoring.ResultGrade.reason).
    reason: str | None = Field(default=None, max_length=500, exclude_if=lambda v: v is None)


# The grader stores score = round(resolved / completed, SCORE_DIGITS).
SCORE_DIGITS = 6
RunOutcome = Literal["SUCCEEDED", "FAILED", "INFRA_ERROR"]


# Run ids: the queue issues run-<20 lowercase hex> (the first 20 hex of the correlation id's SHA-256).
RUN_ID_RE = re.compile(r"\Arun-[0-9a-f]{20}\Z")
RUN_ID_RULE = "must be run-<20 lowercase hex>"


def run_id_for(correlation_id: str) -> str:
    """The run id of a correlation id: stable, so a redelivery names the same run everywhere
    (the shape ``RUN_ID_RE`` checks)."""
    return "run-" + hashlib.sha256(correlation_id.encode("ascii")).hexdigest()[:20]


def run_id_problem(value: object) -> str | None:
    """Why ``value`` is not a run id the queue issues, or None (the one home of the run id's shape:
    export, import, seal, the infra CLI, the API's routes)."""
    return None if isinstance(value, str) and RUN_ID_RE.match(value) else RUN_ID_RULE


def validate_run_id(run_id: str, field: str = "RUN_ID") -> str:
    """``run_id`` unchanged, or our ValidationError naming ``field`` and the rule (see ``run_id_problem``)."""
    problem = run_id_problem(run_id)
    if problem:
        raise ValidationError(field, problem, run_id)
    return run_id


# Trial names: <task>__<the run's short id> (``trial_name``); one plain directory name, never hidden.
# A suite with several attempts per task (``attempts`` in the infra policy, Harbor's n_attempts) names
# each attempt k of n: <task>__a<k>of<n>__<short id>, so every name says which attempt of how many it is
# (``trial_attempt``) and a plan missing one attempt is told from a plan with fewer. With one attempt
# the names are exactly those of before attempts existed.
# A pattern for pydantic (``Field(pattern=...)``) and, through ``fullmatch``, for ``trial_name_problem``.
TRIAL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}(__a[1-9][0-9]?of[1-9][0-9]?)?__[a-z0-9]{0,12}$"
TRIAL_NAME_RULE = ("must be <task>__<run short id> or <task>__a<k>of<n>__<run short id>: a task of 1-64 characters "
                   "of [a-z0-9_-] starting with a letter or digit, then '__' and at most 12 of [a-z0-9]")
_TRIAL_NAME_RE = re.compile(TRIAL_NAME_PATTERN)
# Trials per task a suite may ask for (``SuitePolicy.attempts``, ``benchseal trial run --attempts``).
MAX_TASK_ATTEMPTS = 10


def trial_name_problem(value: object) -> str | None:
    """Why ``value`` is not a trial name, or None (the one home of the trial-name rule)."""
    return None if isinstance(value, str) and _TRIAL_NAME_RE.fullmatch(value) else TRIAL_NAME_RULE


def trial_short_id(run_id: str) -> str:
    """The run's part of every trial (and trial container) name: its last 12 lowercase alphanumerics."""
    return re.sub(r"[^a-z0-9]", "", run_id.lower())[-12:]


def trial_name(task: str, run_id: str, attempt: int = 1, attempts: int = 1) -> str:
    """Deterministic trial names let the worker tell a missing trial from a present one: attempt
    ``attempt`` of ``attempts`` of ``task`` (``<task>__<short>`` when the task runs once)."""
    if not 1 <= attempt <= attempts <= MAX_TASK_ATTEMPTS:
        raise ValueError(f"attempt {attempt} of {attempts}: need 1 <= attempt <= attempts <= {MAX_TASK_ATTEMPTS}")
    short = trial_short_id(run_id)
    return f"{task}__{short}" if attempts == 1 else f"{task}__a{attempt}of{attempts}__{short}"


def task_trial_names(task: str, run_id: str, attempts: int = 1) -> tuple[str, ...]:
    """Every trial of ``task`` in run ``run_id``, attempts 1..``attempts`` in order."""
    return tuple(trial_name(task, run_id, k, attempts) for k in range(1, attempts + 1))


def trial_attempt(trial: str, task: str, run_id: str) -> tuple[int, int] | None:
    """(k, n) when ``trial`` is attempt k of n of ``task`` in run ``run_id`` ((1, 1): the task runs
    once), None when it is not a trial of that task and run."""
    short = trial_short_id(run_id)
    if trial == f"{task}__{short}":
        return 1, 1
    head, tail = f"{task}__a", f"__{short}"
    if not (trial.startswith(head) and trial.endswith(tail)) or len(trial) <= len(head) + len(tail):
        return None
    match = re.fullmatch(r"([1-9][0-9]?)of([1-9][0-9]?)", trial[len(head):len(trial) - len(tail)])
    if match is None:
        return None
    k, n = int(match.group(1)), int(match.group(2))
    return (k, n) if 1 <= k <= n <= MAX_TASK_ATTEMPTS and n > 1 else None


class GradeCounts(_Frozen):
    """Trial counts; every trial has exactly one outcome, so the parts never exceed the whole.

    Strict integers: JSON ``true``, ``2.0`` or ``"1"`` is not a count.
    """

    total: StrictInt = Field(ge=0)
    completed: StrictInt = Field(ge=0)
    resolved: StrictInt = Field(ge=0)
    unresolved: StrictInt = Field(ge=0)
    infra_errors: StrictInt = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> GradeCounts:
        if self.resolved + self.unresolved > self.completed:
            raise ValueError(f"counts.resolved + counts.unresolved ({self.resolved} + {self.unresolved}) "
                             f"must not exceed counts.completed ({self.completed})")
        if self.completed > self.total:
            raise ValueError(f"counts.completed ({self.completed}) must not exceed counts.total ({self.total})")
        if self.completed + self.infra_errors > self.total:
            raise ValueError(f"counts.completed + counts.infra_errors ({self.completed} + {self.infra_errors}) "
                             f"must not exceed counts.total ({self.total})")
        return self


def check_score(status: str, counts: GradeCounts, score: float | None) -> None:
    """The score rule (one home, for the grader and every reader of its result).

    Null unless SUCCEEDED; a SUCCEEDED run has completed > 0 and score equal to
    round(resolved / completed, SCORE_DIGITS). Raises ValueError naming the rule.
    """
    if status != "SUCCEEDED":
        if score is not None:
            raise ValueError(f"score must be null for a {status} run (got {score!r})")
        return
    if counts.completed == 0:
        raise ValueError("a SUCCEEDED run must have counts.completed > 0")
    if score is None:
        raise ValueError("score of a SUCCEEDED run must be a finite number (got None)")
    expected = round(counts.resolved / counts.completed, SCORE_DIGITS)
    if score != expected:
        raise ValueError(f"score {score!r} is not resolved / completed = {counts.resolved}/{counts.completed} "
                         f"rounded to {SCORE_DIGITS} decimals ({expected!r})")


class Grading(_Frozen):
    """What the worker concludes from Harbor's result.json files.

    ``score`` is resolved / completed for a SUCCEEDED run and None otherwise:
    a failed run carries status and counts, never a score.
    """

    run_id: str
    status: RunOutcome
    reason: str | None = None
    suite: str
    agent: str
    counts: GradeCounts
    score: StrictFloat | None = Field(allow_inf_nan=False)
    trials: tuple[TrialRecord, ...] = ()
    harbor_version: str | None = None
    # The policy's version pin for the agent (None for Harbor's test agents) and the model it called.
    agent_version_pin: str | None = None
    model: str | None = None
    # The content digest of the dataset every trial ran from (pipeline.core.datasets); None when no trial
    # ran from a staged dataset (a run refused or failed before any batch).
    dataset_digest: Digest | None = None
    # The payload's subset of the dataset's tasks (None: every task), recorded in summary.json and the history key.
    subset: tuple[str, ...] | None = None
    # The sha256 of the infra policy file the worker loaded to run and grade the run (``InfraPolicy.digest``);
    # None for a policy not read from a file. Recorded in summary.json, the test result and the release body.
    policy_digest: Digest | None = None
    runner_ref: PinnedRef
    api_ref: PinnedRef
    started_at: str
    finished_at: str
    graded_by: WorkerId | None = Field(
        default=None,
        description="the worker that decided the run's outcome (its worker id): graded it from its trial rows, or "
                    "refused it at planning or ended it as INFRA_ERROR; None in gradings from before it was recorded")

    @model_validator(mode="after")
    def _scored(self) -> Grading:
        check_score(self.status, self.counts, self.score)
        return self


class RunStatus(_Frozen):
    """``run.json`` in each run directory: what the API image serves."""

    run_id: str
    correlation_id: CorrelationId
    state: RunState
    attempts: int = Field(ge=0)
    suite: str
    agent: str
    source: PayloadSource
    runner: PinnedRef
    api: PinnedRef
    created_at: str
    updated_at: str
    score: float | None = Field(default=None, allow_inf_nan=False)
    counts: GradeCounts | None = None
    agent_artifact: AgentArtifact | None = None  # the payload's: the release's own agent

    @model_validator(mode="after")
    def _scored(self) -> RunStatus:
        # The grader's score rule wherever the counts are known (NaN and Infinity are refused above).
        if self.state == "SUCCEEDED" and self.counts is not None:
            check_score(self.state, self.counts, self.score)
        return self


# --- worker -> publish (durable outbox) --------------------------------------------

class PublicationRequest(_Frozen):
    """One outbox row: deliver the artifacts of a terminal run to a target.

    Written in the same transaction that marks the run terminal. Rows written before the
    request was versioned carry no ``schema`` and are read as v1 (the field is the only change).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    schema_: Literal["benchseal.publication/v1"] = Field(alias="schema", default="benchseal.publication/v1")
    run_id: str
    target: Literal["github", "local"]
    tag: str = Field(min_length=1, max_length=128)
    artifacts_dir: str
    options: dict[str, str] = Field(default_factory=dict)
