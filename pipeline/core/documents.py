"""The documents that cross a stage or a process, one versioned model each.

| document | written by | read by | model |
|---|---|---|---|
| ``summary.json`` (``benchseal.summary/v1``) | evidence (``evidence/artifacts.py``) | publish (release body), verify, the API | ``ReleaseSummary`` |
| ``trials.json`` (``benchseal.trials/v1``) | the runner (``benchseal trial run``, inside the runner image) | the worker's grader | ``TrialsPlan`` |
| ``trial-results.json`` (``benchseal.trial-results/v1``) | evidence (``evidence/trials.py``) | verify (re-grades the trials) | ``TrialResults`` |
| ``images/base.lock.json`` (``benchseal.base-lock/v1``) | ``benchseal base build`` | the image builder, the worker, the SBOM generator | ``BaseLock`` |
| ``publisher-error.json`` (``benchseal.publisher-error/v1``) | the publisher's outbox | a release's reader (checksummed and signed) | ``PublisherError`` |
| ``provenance-*.intoto.json`` (in-toto v1, SLSA provenance v1) | evidence (``evidence/provenance.py``) | sigstore (DSSE signing), verify | ``ProvenanceStatement`` |
| ``test-result.intoto.json`` (in-toto v1, test-result v0.1) | evidence (``evidence/testresult.py``) | sigstore (DSSE signing), verify, cosign on the runner image | ``ResultStatement`` |

Each is written with ``dump_document`` and read with ``load_document`` (after ``upgrade_*`` for
documents older releases or older runner images may still hold). The JSON Schemas in
``policies/*.schema.json`` are exported from these models (``export_schemas``) and a test checks
the committed files equal them. Other cross-stage models (digests file, dispatch payload,
grading, publication request) live in ``pipeline.core.contracts``; the release directory's file
names in ``pipeline.core.layout``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from pipeline.core import paths
from pipeline.core.contracts import (
    TRIAL_NAME_PATTERN,
    AgentArtifact,
    CommitSha,
    CorrelationId,
    Digest,
    GitTag,
    GradeCounts,
    ImageName,
    PayloadSource,
    PinnedRef,
    PublicationRequest,
    RunOutcome,
    TrialOutcome,
    WorkerId,
    check_score,
    load_model,
    sri_hex,
)
from pipeline.core.errors import ValidationError
from pipeline.core.fsutil import atomic_write_text, canonical_json
from pipeline.core.project import AgentManifest, ProjectFile

SUMMARY_SCHEMA: Literal["benchseal.summary/v1"] = "benchseal.summary/v1"
TRIALS_SCHEMA: Literal["benchseal.trials/v1"] = "benchseal.trials/v1"
BASE_LOCK_SCHEMA: Literal["benchseal.base-lock/v1"] = "benchseal.base-lock/v1"
PUBLISHER_ERROR_SCHEMA: Literal["benchseal.publisher-error/v1"] = "benchseal.publisher-error/v1"
TRIAL_RESULTS_SCHEMA: Literal["benchseal.trial-results/v1"] = "benchseal.trial-results/v1"
SCHEMA_DIR = paths.REPO_ROOT / "policies"


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# --- summary.json -------------------------------------------------------------------------

# A run's task subset as documents record it (pipeline.core.contracts.DispatchPayload.tasks): sorted names.
TaskSubset = tuple[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")], ...]


class Dataset(_Document):
    name: str
    # The content digest of the dataset the run's trials ran from (pipeline.core.datasets: the staged copy the
    # worker verified); None when no trial ran from a staged dataset (a run refused before any batch).
    digest: Digest | None = None
    # Summaries sealed before datasets were pinned: sha256 over the suite directory's files (read, never written).
    revision: str | None = None
    # The run's subset of the dataset's tasks (the payload's ``tasks``, sorted); absent: every task ran.
    subset: TaskSubset | None = Field(default=None, exclude_if=lambda v: v is None)
    task_images: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")], PinnedRef] | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="each task that ran on a prebuilt image and that image as its task.toml pinned it "
                    "(name@sha256:..., the trials' task_image); absent: every task was built from its Dockerfile")

    @property
    def pinned(self) -> str | None:
        """What names the dataset's bytes: its content digest, else an old summary's directory revision."""
        return self.digest or self.revision


class ImageDescriptor(_Document):
    """One image pinned by digest: ``ref`` is exactly ``name@digest`` (summary.json images, base lock entries)."""

    name: ImageName
    digest: Digest
    ref: PinnedRef

    @model_validator(mode="after")
    def _same_image(self) -> ImageDescriptor:
        if self.ref != f"{self.name}@{self.digest}":
            raise ValueError("ref must equal '<name>@<digest>' of the same entry")
        return self


class SummaryImages(_Document):
    runner: ImageDescriptor
    api: ImageDescriptor


class AgentInfo(_Document):
    name: str
    # One version when every trial reported the same one, the sorted list when they differ, else None.
    version: str | tuple[str, ...] | None
    # Model-backed agents: the policy's version pin and the model they called (None for test agents).
    version_pin: str | None = None
    model: str | None = None
    # The release's own agent, as built and checked (package, exact version, integrity, source commit).
    release: AgentArtifact | None = None


class TrialTiming(_Document):
    task: str
    trial: str
    outcome: TrialOutcome
    reward: float | None
    total_seconds: float | None
    agent_seconds: float | None
    verifier_seconds: float | None
    model_calls: int | None = Field(ge=0)
    input_tokens: int | None = Field(ge=0)
    output_tokens: int | None = Field(ge=0)
    reason: str | None = Field(default=None, max_length=500, exclude_if=lambda v: v is None,
                               description="why the trial was not resolved, in one line (the grading rule's)")
    canary: bool = Field(default=False, exclude_if=lambda v: not v,
                         description="a tamper canary's trial: never counted in the score")
    worker: WorkerId | None = Field(default=None, exclude_if=lambda v: v is None,
                                    description="the worker that ran the trial (its worker id); absent before "
                                                "it was recorded")


class Timings(_Document):
    started_at: AwareDatetime
    finished_at: AwareDatetime
    trials: tuple[TrialTiming, ...]


class ModelUsage(_Document):
    """Totals over the trials that reported model usage."""

    trials: int = Field(ge=1)
    model_calls: int = Field(ge=0)
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class ScoreInterval(_Document):
    """The score's 95 % Wilson score interval (``pipeline.core.scoring.wilson_interval``), each end
    rounded like the score. Present only where the score is (a SUCCEEDED run; ``benchseal verify``
    checks it against the trials)."""

    low: StrictFloat = Field(ge=0, le=1, allow_inf_nan=False)
    high: StrictFloat = Field(ge=0, le=1, allow_inf_nan=False)
    # Always 0.95 (a float cannot be a Literal): the interval is z = 1.959964.
    confidence: StrictFloat = Field(default=0.95, ge=0.95, le=0.95)
    method: Literal["wilson"] = "wilson"

    @model_validator(mode="after")
    def _ordered(self) -> ScoreInterval:
        if self.low > self.high:
            raise ValueError(f"interval low {self.low!r} must not exceed high {self.high!r}")
        return self


class TaskCounts(_Document):
    """One task's trials (``attempts``), how many completed and how many of those resolved it."""

    attempts: StrictInt = Field(ge=1)
    completed: StrictInt = Field(ge=0)
    resolved: StrictInt = Field(ge=0)

    @model_validator(mode="after")
    def _parts(self) -> TaskCounts:
        if not self.resolved <= self.completed <= self.attempts:
            raise ValueError(f"need resolved <= completed <= attempts (got {self.resolved}, {self.completed}, "
                             f"{self.attempts})")
        return self


# --- the comparison with the previous release (its rules: pipeline.core.history) ----------

COMPARISON_SCHEMA: Literal["benchseal.comparison/v1"] = "benchseal.comparison/v1"
TaskName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
RunId = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Change = Literal["regressed", "improved", "added", "removed", "unjudged"]


class GateRules(_Document):
    """When a suite holds a release back (``pipeline.core.history``); both off: compare, never gate."""

    interval_below_previous: StrictBool = True
    resolved_task_fails: StrictBool = True


class PreviousRelease(_Document):
    """The release compared with: which one (tag, infra run, commit, its signed summary's digest) and
    what the comparison needs of it (score, per-task counts)."""

    tag: GitTag
    run_id: RunId
    commit: CommitSha
    summary_digest: Sha256Hex
    score: StrictFloat = Field(ge=0, le=1, allow_inf_nan=False)
    tasks: dict[TaskName, TaskCounts]
    # Its dataset's content digest: a comparison is only ever with a release of the same dataset
    # (pipeline.core.history.check_comparison). None: recorded before datasets were pinned.
    dataset_digest: Sha256Hex | None = None
    # Its task subset (None: the whole suite): a subset run compares only with runs of the same subset.
    subset: TaskSubset | None = Field(default=None, exclude_if=lambda v: v is None)


class TaskChange(_Document):
    task: TaskName
    change: Change
    previous: TaskCounts | None
    current: TaskCounts | None


class Comparison(_Document):
    """``comparison.json`` in a graded run (written by the worker) and ``comparison`` in summary.json."""

    schema_: Literal["benchseal.comparison/v1"] = Field(alias="schema", default=COMPARISON_SCHEMA)
    previous: PreviousRelease | None  # None: the repository's first scored release of this suite
    score_delta: StrictFloat | None = Field(allow_inf_nan=False)
    changed: tuple[TaskChange, ...]
    gate: GateRules | None  # the suite's rules when the run was graded; None: the suite sets no gate
    gated: StrictBool
    reasons: tuple[str, ...]

    @property
    def regressed_tasks(self) -> tuple[str, ...]:
        return tuple(change.task for change in self.changed if change.change == "regressed")


class HistoryEntry(_Document):
    """One scored release in a repository's history (a row of the queue's ``releases`` table)."""

    repository: str = Field(min_length=1, max_length=140)
    suite: str = Field(min_length=1, max_length=64)
    tag: GitTag
    run_id: RunId
    commit: CommitSha
    score: StrictFloat = Field(ge=0, le=1, allow_inf_nan=False)
    interval: ScoreInterval | None
    tasks: dict[TaskName, TaskCounts]
    gated: StrictBool
    finished_at: AwareDatetime
    summary_digest: Sha256Hex | None = None  # recorded once the evidence is sealed
    # The dataset's content digest (summary.json's dataset.digest): part of the history key, so two datasets
    # never compare as one (pipeline.core.history.baseline). None: recorded before datasets were pinned.
    dataset_digest: Sha256Hex | None = None
    # The run's task subset (summary.json's dataset.subset; None: every task): part of the history key too.
    subset: TaskSubset | None = Field(default=None, exclude_if=lambda v: v is None)

    def as_previous(self) -> PreviousRelease:
        if self.summary_digest is None:
            raise ValueError(f"release {self.tag} (run {self.run_id}) was never sealed: no summary digest")
        return PreviousRelease(tag=self.tag, run_id=self.run_id, commit=self.commit, summary_digest=self.summary_digest,
                               score=self.score, tasks=self.tasks, dataset_digest=self.dataset_digest,
                               subset=self.subset)


class ReleaseSummary(_Document):
    """``summary.json``: what a run concluded, bound to the release it scored.

    The score rule (``pipeline.core.contracts.check_score``) and the count rules
    (``GradeCounts``) hold for every instance: a reader never re-derives them.
    """

    schema_: Literal["benchseal.summary/v1"] = Field(alias="schema", default=SUMMARY_SCHEMA)
    suite: str
    dataset: Dataset
    evaluation_method: str
    status: RunOutcome
    reason: str | None
    counts: GradeCounts
    # Strict: JSON true or "0.5" is not a score; NaN/Infinity are not JSON.
    score: StrictFloat | None = Field(allow_inf_nan=False)
    source: PayloadSource
    images: SummaryImages
    harbor_version: str | None
    agent: AgentInfo
    run_id: str = Field(min_length=1, max_length=128)
    correlation_id: CorrelationId
    timings: Timings
    model_usage: ModelUsage | None = None
    graded_by: WorkerId | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the worker that decided the run's outcome (its worker id): graded it from its trial rows (each "
                    "trial's worker is in timings.trials), or refused it at planning or ended it as INFRA_ERROR; "
                    "absent before it was recorded")
    # The score's 95 % Wilson interval (null when there is no score) and each task's pass counts.
    # Optional: summaries written before they existed omit both (``benchseal verify`` checks them when present).
    interval: ScoreInterval | None = None
    tasks: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], TaskCounts] | None = None
    # The previous scored release of the repository, what changed and the regression gate's verdict
    # (``pipeline.core.history``; ``benchseal verify`` recomputes it). Absent before it existed.
    comparison: Comparison | None = None
    # The sha256 of the infra policy file the worker loaded to run and grade the run (the infra repository's
    # policies/infra.yaml: ``sha256sum`` of it, prefixed); absent before it was recorded, or for a policy not read
    # from a file. ``benchseal verify --infra-policy-digest`` holds it to the consumer's pin.
    policy_digest: Digest | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _scored(self) -> ReleaseSummary:
        check_score(self.status, self.counts, self.score)
        # The interval and task counts are not judged against the score and counts here: they are what
        # the trials give (``pipeline.core.scoring.check_noise``, run by ``benchseal verify`` after the
        # trials, counts and score), so a forged score is reported as the field the trials contradict.
        return self


def upgrade_summary(data: object) -> object:
    """The one reader of older summary.json documents: releases before this model wrote the run id
    twice (``run_id`` and ``infra_run_id``, equal). Returns the v1 shape; anything else is returned
    as is, for the model to judge."""
    if not isinstance(data, dict) or "infra_run_id" not in data:
        return data
    upgraded = dict(data)
    legacy = upgraded.pop("infra_run_id")
    if upgraded.setdefault("run_id", legacy) != legacy:
        raise ValidationError("summary.json: infra_run_id", "must equal run_id (an older summary names one run twice)",
                              legacy)
    return upgraded


# --- trials.json (runner -> worker, across the container boundary) -------------------------

class PlannedTrial(_Document):
    task: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    trial_name: str = Field(pattern=TRIAL_NAME_PATTERN)
    canary: bool = Field(default=False, exclude_if=lambda v: not v, description="a tamper canary's trial: never scored; resolved means the "
                         "run was tampered with (task.toml metadata.benchseal.canary)")


class TrialsPlan(_Document):
    """``trials.json``: which task runs in which Harbor trial dir, written before any trial starts."""

    schema_: Literal["benchseal.trials/v1"] = Field(alias="schema", default=TRIALS_SCHEMA)
    run_id: str = Field(min_length=1, max_length=128)
    agent: str
    # The policy's version pin for the agent, checked against the runner's Harbor (None for test agents).
    agent_version: str | None
    harbor_version: str | None
    model: str | None
    trials: tuple[PlannedTrial, ...]


def upgrade_trials(data: object) -> object:
    """Runner images built before ``trials.json`` had a schema wrote the same fields without it."""
    if isinstance(data, dict) and "schema" not in data:
        return {"schema": TRIALS_SCHEMA, **data}
    return data


# --- trial-results.json (evidence -> verify: the trial evidence a score is recomputed from) ---------

class EmbeddedFile(_Document):
    """One evidence file byte for byte: its name as evidence-SHA256SUMS lists it, its sha256, its bytes."""

    name: str = Field(min_length=1, max_length=4096)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    content: str = Field(description="base64 (RFC 4648, padded) of the file's exact bytes")


class TrialResults(_Document):
    """``trial-results.json``: the run's plan (``evidence/trials.json``) and every trial's ``result.json``,
    exactly as evidence-SHA256SUMS lists them. A release is flat (the trial dirs stay in the run dir):
    this asset ships the files the score is graded from, so ``benchseal verify`` grades them again."""

    schema_: Literal["benchseal.trial-results/v1"] = Field(alias="schema", default=TRIAL_RESULTS_SCHEMA)
    run_id: str = Field(min_length=1, max_length=128)
    files: tuple[EmbeddedFile, ...]


# --- images/base.lock.json -----------------------------------------------------------------

class LayerDescriptor(_Document):
    digest: Digest
    diff_id: Digest
    size: StrictInt = Field(ge=0)


class DebHash(_Document):
    version: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BaseImage(ImageDescriptor):
    """One base image. An entry without ``spec_hash`` names a base the user supplies (used as is)."""

    spec_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    suite: str | None = None
    variant: str | None = None
    epoch: StrictInt | None = None
    include: tuple[str, ...] = ()
    rootfs_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    layer: LayerDescriptor | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    # ``<package>:<arch>`` -> the .deb that mmdebstrap installed into exactly this rootfs.
    debs: dict[str, DebHash] | None = None


class BaseLock(_Document):
    """``images/base.lock.json``: what this machine built and pushed (generated, gitignored)."""

    schema_: Literal["benchseal.base-lock/v1"] = Field(alias="schema", default=BASE_LOCK_SCHEMA)
    images: dict[str, BaseImage] = Field(default_factory=dict)


BASE_LOCK_PATH = paths.REPO_ROOT / "images" / "base.lock.json"


def base_lock_path() -> Path:
    """The base lock: ``$BENCHSEAL_BASE_LOCK`` or images/base.lock.json (a benchmark's scratch registry uses its own)."""
    configured = os.environ.get("BENCHSEAL_BASE_LOCK")
    return Path(configured) if configured else BASE_LOCK_PATH


def read_base_lock(path: Path | None = None) -> BaseLock:
    """The base lock through its model; an empty lock when none was written yet."""
    path = path or base_lock_path()
    if not path.is_file():
        return BaseLock()
    return load_document(BaseLock, path)


# --- publisher-error.json ------------------------------------------------------------------

class PublisherError(_Document):
    """Why a run's publication has not happened yet (written after the retry budget is spent)."""

    schema_: Literal["benchseal.publisher-error/v1"] = Field(alias="schema", default=PUBLISHER_ERROR_SCHEMA)
    run_id: str
    tag: str
    target: Literal["github", "local"]
    attempts: int = Field(ge=1)
    error: str
    at: AwareDatetime
    note: str = "publication is retried later; this file records why it has not happened yet"


# --- provenance-*.intoto.json (in-toto v1 statements, SLSA provenance v1 predicates) ----------

STATEMENT_TYPE: Literal["https://in-toto.io/Statement/v1"] = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE: Literal["https://slsa.dev/provenance/v1"] = "https://slsa.dev/provenance/v1"
_HEX64 = r"^[0-9a-f]{64}$"
# Field names are in-toto's and SLSA's own (camelCase), so the models dump the documents as specified.


class DigestSet(_Document):
    sha256: str | None = Field(default=None, pattern=_HEX64)
    gitCommit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")


class Subject(_Document):
    name: str
    digest: DigestSet

    @model_validator(mode="after")
    def _sha256(self) -> Subject:
        if self.digest.sha256 is None:
            raise ValueError("a subject must have a sha256 digest")
        return self


class ResourceDescriptor(_Document):
    uri: str
    name: str | None = None
    digest: DigestSet


class SourceRef(_Document):
    repository: str
    ref: str


class ExternalParameters(_Document):
    """Both build types: image release (``workflow``) and benchmark run (``suite``, ``agent``, ``correlation_id``)."""

    source: SourceRef
    workflow: str | None = None
    suite: str | None = None
    agent: str | None = None
    correlation_id: str | None = None


class InternalParameters(_Document):
    images: tuple[str, ...] | None = None
    reproducible: bool | None = None
    run_id: str | None = None


class BuildDefinition(_Document):
    buildType: str
    externalParameters: ExternalParameters
    internalParameters: InternalParameters
    resolvedDependencies: tuple[ResourceDescriptor, ...]


class Builder(_Document):
    id: str


class RunMetadata(_Document):
    invocationId: str
    startedOn: AwareDatetime | None = None
    finishedOn: AwareDatetime | None = None


class RunDetails(_Document):
    builder: Builder
    metadata: RunMetadata


class SlsaProvenance(_Document):
    buildDefinition: BuildDefinition
    runDetails: RunDetails


class ProvenanceStatement(_Document):
    """``provenance-images.intoto.json`` and ``provenance-summary.intoto.json``: the exact bytes the DSSE
    bundles sign (sigstore parses them again as in-toto statements before signing)."""

    type_: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type", default=STATEMENT_TYPE)
    subject: tuple[Subject, ...] = Field(min_length=1)
    predicateType: Literal["https://slsa.dev/provenance/v1"] = SLSA_PROVENANCE
    predicate: SlsaProvenance


# --- test-result.intoto.json (in-toto v1 statement, in-toto test-result v0.1 predicate) ------------

TEST_RESULT: Literal["https://in-toto.io/attestation/test-result/v0.1"] = "https://in-toto.io/attestation/test-result/v0.1"
BENCHSEAL_URI = "https://benchseal.invalid"  # the prefix of benchseal's own URIs (as provenance's build types)
TestOutcome = Literal["PASSED", "WARNED", "FAILED"]
_ResultTask = Annotated[str, StringConstraints(min_length=1, max_length=64)]


def agent_purl(agent: AgentArtifact) -> str:
    """The release's agent as a package URL (the runner's SLSA provenance and the test result name it so)."""
    if agent.kind == "npm":
        scope, _, name = agent.package.rpartition("/")
        return f"pkg:npm/{quote(scope, safe='')}/{name}@{agent.version}" if scope else f"pkg:npm/{name}@{agent.version}"
    return f"pkg:pypi/{agent.package.lower().replace('_', '-')}@{agent.version}"


class ResultDescriptor(_Document):
    """An in-toto v1 ResourceDescriptor, as benchseal writes one into ``configuration``: a role
    (``suite``, ``dataset``, ``agent``), a URI and, where there is one, a digest."""

    name: str = Field(min_length=1, max_length=64)
    uri: str = Field(min_length=1, max_length=1024, pattern=r"^[a-z][a-z0-9+.-]*:[^\s]+$")
    digest: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{1,32}$")],
                 Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,256}$")]] | None = None
    annotations: dict[str, str] | None = None


class ResultScore(_Document):
    """The extension (``SCORE_EXTENSION``): what summary.json concluded, field for field."""

    status: RunOutcome
    gated: StrictBool  # the regression gate's verdict (summary.json comparison.gated; false without one)
    # Absent (as written: no nulls) when the run has no score.
    score: StrictFloat | None = Field(default=None, allow_inf_nan=False)
    interval: ScoreInterval | None = None
    counts: GradeCounts
    tasks: dict[_ResultTask, TaskCounts]
    run_id: str = Field(min_length=1, max_length=128)
    source: PayloadSource
    workers: tuple[WorkerId, ...] | None = Field(
        default=None, description="the workers that ran the run's trials, sorted (summary.json "
                                  "timings.trials[].worker: which trial each ran; summary.json is a subject)")
    graded_by: WorkerId | None = Field(default=None, description="the worker that decided the run's outcome "
                                                                 "(summary.json graded_by)")

    @model_validator(mode="after")
    def _scored(self) -> ResultScore:
        check_score(self.status, self.counts, self.score)
        return self


# The score extension's field name (the alias below says it again: an alias must be a literal).
SCORE_EXTENSION = "https://benchseal.invalid/attestation/test-result/score/v1"


class ResultPredicate(_Document):
    """in-toto's test-result v0.1 predicate (its own field names), with benchseal's extension."""

    result: TestOutcome
    configuration: tuple[ResultDescriptor, ...] = Field(min_length=1)
    # The infra's Actions run: https, or plain http on loopback only (a server on this machine, e.g. an emulator).
    url: str | None = Field(default=None, max_length=1024,
                            pattern=r"^(?:https://|http://(?:127\.0\.0\.1|localhost)[:/])[^\s]+$")
    passedTests: tuple[_ResultTask, ...] = ()
    warnedTests: tuple[_ResultTask, ...] = ()
    failedTests: tuple[_ResultTask, ...] = ()
    # benchseal's extension, a field named by a URI (in-toto's parsing rules: a consumer ignores the
    # fields it does not know): the score, its interval and the counts, as summary.json has them.
    score: ResultScore = Field(alias="https://benchseal.invalid/attestation/test-result/score/v1")


def result_verdict(summary: ReleaseSummary) -> Literal["PASSED", "FAILED"]:
    """The statement's ``result``: PASSED for a run that SUCCEEDED and that the regression gate did
    not hold back, FAILED otherwise (the one rule: the writer and ``benchseal verify``)."""
    gated = summary.comparison is not None and summary.comparison.gated
    return "PASSED" if summary.status == "SUCCEEDED" and not gated else "FAILED"


def trial_workers(summary: ReleaseSummary) -> tuple[str, ...] | None:
    """The workers that ran the run's trials, sorted (None when no trial names one: an older summary)."""
    return tuple(sorted({t.worker for t in summary.timings.trials if t.worker})) or None


def task_outcomes(tasks: dict[str, TaskCounts] | None) -> dict[TestOutcome, tuple[str, ...]]:
    """Task ids by outcome, each sorted: PASSED when every attempt resolved the task, WARNED when some
    did (a flaky task), FAILED when none did (an infrastructure error resolves nothing)."""
    found: dict[TestOutcome, list[str]] = {"PASSED": [], "WARNED": [], "FAILED": []}
    for task, counts in sorted((tasks or {}).items()):
        outcome: TestOutcome = ("PASSED" if counts.resolved == counts.attempts
                                else "WARNED" if counts.resolved else "FAILED")
        found[outcome].append(task)
    return {outcome: tuple(names) for outcome, names in found.items()}


def result_configuration(summary: ReleaseSummary) -> tuple[ResultDescriptor, ...]:
    """What the run was configured with: the suite (its evaluation method and Harbor), the dataset
    (the suite directory's sha256), the agent (the release's own by package URL and integrity) and, when
    summary.json records it, the infra policy the worker ran and graded it under (its file's sha256)."""
    suite_notes = {"evaluationMethod": summary.evaluation_method}
    if summary.harbor_version:
        suite_notes["harborVersion"] = summary.harbor_version
    revision = summary.dataset.pinned
    dataset_digest = ({"sha256": revision.removeprefix("sha256:")}
                      if revision is not None and revision.startswith("sha256:") else None)
    agent = summary.agent
    version = ",".join(agent.version) if isinstance(agent.version, tuple) else agent.version
    agent_notes = {"name": agent.name, **({"version": version} if version else {}),
                   **({"model": agent.model} if agent.model else {})}
    if agent.release is not None:
        algorithm, digest = sri_hex(agent.release.integrity)
        agent_descriptor = ResultDescriptor(
            name="agent", uri=agent_purl(agent.release), digest={algorithm: digest},
            annotations={**agent_notes, "integrity": agent.release.integrity, "sourceCommit": agent.release.source_commit})
    else:
        agent_descriptor = ResultDescriptor(name="agent", uri=f"{BENCHSEAL_URI}/agents/{quote(agent.name, safe='')}",
                                            annotations=agent_notes)
    return (
        ResultDescriptor(name="suite", uri=f"{BENCHSEAL_URI}/suites/{quote(summary.suite, safe='')}",
                         annotations=suite_notes),
        ResultDescriptor(name="dataset", uri=f"{BENCHSEAL_URI}/datasets/{quote(summary.dataset.name, safe='')}",
                         digest=dataset_digest,
                         annotations=None if dataset_digest is not None or revision is None else {"revision": revision}),
        agent_descriptor,
        *((ResultDescriptor(name="policy", uri=f"{BENCHSEAL_URI}/policies/infra.yaml",
                            digest={"sha256": summary.policy_digest.removeprefix("sha256:")}),)
          if summary.policy_digest is not None else ()),
    )


class ResultStatement(_Document):
    """``test-result.intoto.json``: the run's result as in-toto's standard test-result attestation.
    Subjects: the runner image (name + manifest sha256; cosign finds it attached to that image) and
    summary.json. Everything in it is derived from summary.json (``for_summary``) but the run's URL."""

    type_: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type", default=STATEMENT_TYPE)
    subject: tuple[Subject, ...] = Field(min_length=1)
    predicateType: Literal["https://in-toto.io/attestation/test-result/v0.1"] = TEST_RESULT
    predicate: ResultPredicate

    @classmethod
    def for_summary(cls, summary: ReleaseSummary, summary_sha256: str, *, url: str | None = None) -> ResultStatement:
        """The statement for ``summary`` (whose file hashes to ``summary_sha256``), the one rule the
        evidence stage writes by and ``benchseal verify`` checks by."""
        runner = summary.images.runner
        outcomes = task_outcomes(summary.tasks)
        try:
            return cls._build(summary, summary_sha256, runner, outcomes, url)
        except PydanticValidationError as exc:
            # What the statement would say breaks its model (e.g. a run URL of another shape): one line, no traceback.
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValidationError(f"test-result statement {where}", first["msg"]) from None

    @classmethod
    def _build(cls, summary: ReleaseSummary, summary_sha256: str, runner: ImageDescriptor,
               outcomes: Mapping[TestOutcome, tuple[str, ...]], url: str | None) -> ResultStatement:
        return cls(
            subject=(Subject(name=runner.name, digest=DigestSet(sha256=runner.digest.removeprefix("sha256:"))),
                     Subject(name="summary.json", digest=DigestSet(sha256=summary_sha256))),
            predicate=ResultPredicate.model_validate({
                "result": result_verdict(summary), "configuration": result_configuration(summary), "url": url,
                "passedTests": outcomes["PASSED"], "warnedTests": outcomes["WARNED"], "failedTests": outcomes["FAILED"],
                SCORE_EXTENSION: ResultScore(
                    status=summary.status, gated=summary.comparison is not None and summary.comparison.gated,
                    score=summary.score, interval=summary.interval, counts=summary.counts, tasks=summary.tasks or {},
                    run_id=summary.run_id, source=summary.source, workers=trial_workers(summary),
                    graded_by=summary.graded_by),
            }),
        )


# --- reading and writing -------------------------------------------------------------------

_UPGRADES: dict[type[BaseModel], Callable[[object], object]] = {ReleaseSummary: upgrade_summary, TrialsPlan: upgrade_trials}


def parse_document[D: BaseModel](model: type[D], data: object, source: str) -> D:
    """Validate parsed JSON as ``model`` (after its upgrade function); ValidationError names the field."""
    upgrade = _UPGRADES.get(model)
    if upgrade is not None:
        data = upgrade(data)
    # The version is a default only for writers: a document read without one is refused.
    if "schema_" in model.model_fields and isinstance(data, dict) and "schema" not in data:
        raise ValidationError(f"{source}: schema", f"is required ({model.model_fields['schema_'].default!r})")
    return load_model(model, data, source)


def load_document[D: BaseModel](model: type[D], path: Path) -> D:
    """Read ``path`` as ``model``. A missing file raises FileNotFoundError; bad JSON or content ValidationError."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValidationError(str(path), f"is not valid JSON ({exc})") from None
    return parse_document(model, data, str(path))


def dump_document(document: _Document, path: Path) -> Path:
    """Write ``document`` atomically as stable JSON (sorted keys, two-space indent)."""
    atomic_write_text(path, canonical_json(document.to_json_dict()))
    return path


# --- JSON Schemas --------------------------------------------------------------------------

SCHEMAS: dict[str, type[BaseModel]] = {
    "summary.schema.json": ReleaseSummary,
    "trials.schema.json": TrialsPlan,
    "base-lock.schema.json": BaseLock,
    "publisher-error.schema.json": PublisherError,
    "publication-request.schema.json": PublicationRequest,
    "provenance.schema.json": ProvenanceStatement,
    "test-result.schema.json": ResultStatement,  # in-toto test-result v0.1, benchseal's extension
    "trial-results.schema.json": TrialResults,
    "project.schema.json": ProjectFile,  # the source repository's benchseal.toml
    "agent-manifest.schema.json": AgentManifest,  # the runner image's record of the release's agent
}


def json_schema(model: type[BaseModel]) -> str:
    """The model's JSON Schema (validation mode, by alias) as committed under policies/."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def export_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write every document's JSON Schema into ``directory`` (``python -m pipeline.core.documents``)."""
    written = []
    for name, model in SCHEMAS.items():
        path = directory / name
        atomic_write_text(path, json_schema(model))
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in export_schemas():
        print(written_path)
