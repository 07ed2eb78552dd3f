"""The infra policy (policies/infra.yaml): what infra accepts and how the worker runs it.

``sources`` is the allowlist of source repositories (GitHub ``owner/name``, compared
case-insensitively through ``pipeline.core.contracts.canonical_repository``), each with the
image repositories it may use per role. A payload decides neither the repository
whose release is written nor, beyond that repository's list, the images that run.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    model_validator,
)

from pipeline.core.contracts import (
    MAX_TASK_ATTEMPTS,
    DispatchPayload,
    builder_problem,
    canonical_repository,
    load_model,
)
from pipeline.core.digests import ImageRef, parse_ref, validate_digest, validate_registry
from pipeline.core.documents import GateRules
from pipeline.core.errors import ValidationError
from pipeline.core.fsutil import name_problem
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import version_for_tag
from pipeline.core.yamlfile import load_yaml_bytes

POLICY_PATH = REPO_ROOT / "policies" / "infra.yaml"
SCHEMA_PATH = REPO_ROOT / "policies" / "payload.schema.json"
_MAX_POLICY_BYTES = 65536
_ENV_NAME = r"^[A-Z_][A-Z0-9_]{0,63}$"
_SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"
TEST_AGENTS = frozenset({"oracle", "nop"})


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AllowedImage(_Strict):
    registry: str = Field(min_length=1, max_length=255)
    repository: str = Field(min_length=1, max_length=255)


class ImagePolicy(_Strict):
    runner: tuple[AllowedImage, ...] = Field(min_length=1, max_length=64)
    api: tuple[AllowedImage, ...] = Field(min_length=1, max_length=64)


def _source_repository(value: str) -> str:
    canonical_repository(value)  # ValueError names the rule
    return value


_ENDPOINT_RULE = ("must be http(s)://HOST[:PORT][/PATH] with no user, query or fragment (the port defaults to the "
                  "scheme's), e.g. https://api.openai.com/v1")
_ENDPOINT_HOST = r"^[A-Za-z0-9.\-]+$"
_ENDPOINT_PATH = r"^(/[A-Za-z0-9._~/\-]*)?$"


def _model_endpoint(value: str) -> str:
    """An OpenAI-compatible endpoint as its provider writes it (``https://api.openai.com/v1``): the port is
    implied by the scheme when absent (ModelPolicy.host_port)."""
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError outside 0-65535
    except ValueError:
        raise ValueError(_ENDPOINT_RULE) from None
    if (len(value) > 255 or parts.scheme not in ("http", "https") or parts.username is not None
            or parts.password is not None or parts.query or parts.fragment or "?" in value or "#" in value
            or not re.match(_ENDPOINT_HOST, parts.hostname or "") or port == 0
            or not re.match(_ENDPOINT_PATH, parts.path)):
        raise ValueError(_ENDPOINT_RULE)
    return value


# A ref a signer entry may name: "tag" (refs/tags/<the payload's tag>), or one exact branch or tag ref.
# No patterns: every admitted identity is written out in the policy.
_SIGNER_REF = r"^(tag|refs/(heads|tags)/[A-Za-z0-9][A-Za-z0-9._/-]{0,199})$"


def _signer_ref(value: str) -> str:
    name = value.split("/", 2)[-1]
    if value != "tag" and (".." in name or "//" in name or name.endswith(("/", ".", ".lock"))):
        raise ValueError("must be 'tag' or one exact refs/heads/NAME or refs/tags/NAME (no '..', '//', and not "
                         "ending in '/', '.' or '.lock')")
    return value


class SignerPolicy(_Strict):
    """One workflow identity whose keyless signature an image of a source may carry:
    ``https://github.com/OWNER/REPO/.github/workflows/<workflow>@<ref>`` with the GitHub Actions issuer.

    ``ref: tag`` (the default) is ``refs/tags/<the payload's tag>``: the release workflow run for
    exactly that tag (tag.yml on a tag push). An exact ref (``refs/heads/main``, or one fixed
    ``refs/tags/NAME``) admits a workflow run at that ref, e.g. runner-release.yml dispatched on
    main; such a ref does not name the payload's release, so the worker additionally requires the
    certificate's commit (its GitHub workflow SHA) to be the payload's commit. Nothing else is
    admitted: no patterns, no "any ref".
    """

    workflow: str = Field(default="tag.yml", pattern=r"^[A-Za-z0-9_.-]{1,100}\.ya?ml$")
    ref: Annotated[str, StringConstraints(pattern=_SIGNER_REF), AfterValidator(_signer_ref)] = "tag"
    issuer: Literal["https://token.actions.githubusercontent.com"] = "https://token.actions.githubusercontent.com"
    # A reusable workflow that signs for the source (benchseal's, pinned by the caller's `uses:`):
    # its exact job_workflow_ref is the certificate identity; `ref` and the payload's repository and
    # commit are still required of the certificate's workflow extensions (the caller's).
    builder: Annotated[str | None, AfterValidator(_builder)] = None

    @model_validator(mode="after")
    def _one_identity(self) -> SignerPolicy:
        if self.builder is not None and "workflow" in self.model_fields_set:
            raise ValueError("workflow and builder exclude each other: a builder's identity is its own workflow")
        return self


def _builder(value: str | None) -> str | None:
    problem = None if value is None else builder_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _signer_list(value: Any) -> Any:
    # One mapping (the common case) or a list of them.
    return [value] if isinstance(value, dict) else value


class SourcePolicy(_Strict):
    """One allowed source repository, the images its payloads may name, and who must have signed them."""

    repository: Annotated[str, AfterValidator(_source_repository)]
    images: ImagePolicy
    # Always checked. One entry or a list: an image must carry the signature and both attestations
    # of ONE of them (default: tag.yml at the payload's tag).
    signer: Annotated[tuple[SignerPolicy, ...], BeforeValidator(_signer_list)] = Field(
        default=(SignerPolicy(),), min_length=1, max_length=8)

    @property
    def canonical(self) -> str:
        return canonical_repository(self.repository)


class ModelPolicy(_Strict):
    """The model endpoint a suite's model-backed agents call (the runner's only way out)."""

    endpoint: Annotated[str, AfterValidator(_model_endpoint)]
    # LiteLLM model name, e.g. openai/<name> for an OpenAI-compatible endpoint.
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/\-]{0,127}$")]
    # The worker environment variable holding the key (must be listed in secret_env).
    key_env: Annotated[str, StringConstraints(pattern=_ENV_NAME)]

    @property
    def host_port(self) -> tuple[str, int, bool]:
        parts = urlsplit(self.endpoint)
        tls = parts.scheme == "https"
        return str(parts.hostname), int(parts.port or (443 if tls else 80)), tls

    @property
    def path(self) -> str:
        return urlsplit(self.endpoint).path.rstrip("/")


class AgentPolicy(_Strict):
    """An agent admitted by name AND version; ``model: true`` agents call the suite's model."""

    name: Annotated[str, StringConstraints(pattern=_SLUG)]
    # For Harbor's built-in agents: the harbor distribution version that ships it.
    version: Annotated[str, StringConstraints(pattern=r"^[0-9][0-9A-Za-z.+\-]{0,63}$")]
    model: bool = False


class ReleaseAgentPolicy(_Strict):
    """A source repository's own agent, admitted by repository, name and kind (and its package).

    Its version is not listed: it is the release's (``version_for_tag`` of the payload's tag), and
    the payload's ``agent_artifact`` must say exactly that; the worker then checks that the runner
    image carries the same artifact before any trial.
    """

    name: Annotated[str, StringConstraints(pattern=_SLUG)]
    kind: Literal["npm", "python"]
    package: Annotated[str, StringConstraints(pattern=r"^[@A-Za-z0-9][@A-Za-z0-9._/-]{0,213}$")]
    repositories: tuple[Annotated[str, AfterValidator(_source_repository)], ...] = Field(min_length=1, max_length=64)
    model: bool = False

    def admits(self, repository: str) -> bool:
        return canonical_repository(repository) in {canonical_repository(r) for r in self.repositories}


def _agent_kind(value: Any) -> str:
    if isinstance(value, str):
        return "name"
    return "release" if isinstance(value, dict) and "kind" in value else "entry"


# Tagged so that an error names the rule of the form used (a bare name, a Harbor agent, a release's agent).
AgentEntry = Annotated[
    Annotated[Annotated[str, StringConstraints(pattern=_SLUG)], Tag("name")] | Annotated[AgentPolicy, Tag("entry")]
    | Annotated[ReleaseAgentPolicy, Tag("release")],
    Discriminator(_agent_kind),
]


def _dataset_path(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"must be a plain name relative to the worker's suites root: the name {problem}")
    return value


def _dataset_digest(value: str) -> str:
    try:
        return validate_digest(value, "digest")
    except ValidationError as exc:
        raise ValueError(exc.rule) from None


class DatasetPolicy(_Strict):
    """The dataset a suite runs: a directory under the worker's suites root (``--suites-dir``) pinned by its
    content digest (``pipeline.core.datasets``). The worker stages a copy by that digest for every run and
    runs nothing the digest does not cover; a directory whose bytes differ is refused before anything runs."""

    path: Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(_dataset_path)]
    digest: Annotated[str, AfterValidator(_dataset_digest)]


def _task_image_registry(value: str) -> str:
    try:
        return validate_registry(value, "registry")
    except ValidationError as exc:
        raise ValueError(exc.rule) from None


class SuitePolicy(_Strict):
    # The suite's tasks, pinned (required: a suite is never an unpinned directory).
    dataset: DatasetPolicy
    # The registries a task's prebuilt image (task.toml ``[environment] docker_image``, by digest) may come
    # from; empty: every task of the suite is built from its Dockerfile (``check_task_image``).
    task_image_registries: tuple[Annotated[str, AfterValidator(_task_image_registry)], ...] = Field(
        default=(), max_length=16)
    timeout_seconds: float = Field(gt=0, le=86400)
    # Trials of one run that run at once inside the run's one runner container.
    trial_concurrency: int = Field(default=3, ge=1, le=16, strict=True)
    # Trials one runner container takes under one lease (default: trial_concurrency). Harbor runs them
    # trial_concurrency at a time and starts the next whenever a slot frees, so a batch larger than that keeps every
    # slot busy and pays one container start for many trials; timeout_seconds bounds the whole batch.
    trial_batch: int | None = Field(default=None, ge=1, le=1000, strict=True)
    # Trials per task (Harbor's n_attempts): the score is the mean pass rate over all of them, with its
    # Wilson interval and each task's passes in summary.json. Not ``max_attempts`` (infrastructure retries).
    attempts: int = Field(default=1, ge=1, le=MAX_TASK_ATTEMPTS, strict=True)
    model: ModelPolicy | None = None
    # The regression gate against the repository's previous scored release (pipeline.core.history);
    # absent: releases are compared, never gated.
    gate: GateRules | None = None


class InfraPolicy(_Strict):
    schema_: Literal["benchseal.infra-policy/v2"] = Field(alias="schema")
    max_payload_bytes: int = Field(ge=256, le=1_048_576)
    sources: tuple[SourcePolicy, ...] = Field(min_length=1, max_length=1000)
    # A bare name: one of Harbor's test agents (oracle, nop), no model, no version pin.
    agents: tuple[AgentEntry, ...] = Field(min_length=1)
    suites: dict[Annotated[str, StringConstraints(pattern=_SLUG)], SuitePolicy] = Field(min_length=1)
    max_attempts: int = Field(ge=1, le=20)
    lease_seconds: float = Field(gt=0, le=3600)
    infra_error_threshold_percent: float = Field(ge=0, le=100)
    secret_env: tuple[Annotated[str, StringConstraints(pattern=_ENV_NAME)], ...] = ()

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    # The sha256 of the exact bytes ``load_policy`` parsed (``policy_bytes_digest``); None for a policy not read
    # from a file. What the run's evidence records and what the worker compares with the accepted run's.
    _digest: str | None = PrivateAttr(default=None)

    @property
    def digest(self) -> str | None:
        return self._digest

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._digest = None  # changed: no longer the policy the file's bytes say
        return copied

    def __eq__(self, other: object) -> bool:
        # Equal by content, as before the digest: which bytes a policy was read from is not what it says.
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    @model_validator(mode="after")
    def _unique_sources(self) -> InfraPolicy:
        seen: dict[str, str] = {}
        for entry in self.sources:
            if entry.canonical in seen:
                raise ValueError(f"sources: {entry.repository!r} is listed twice (as {seen[entry.canonical]!r}; "
                                 "repository names are compared case-insensitively)")
            seen[entry.canonical] = entry.repository
        return self

    @model_validator(mode="after")
    def _agents_consistent(self) -> InfraPolicy:
        names = self.agent_names
        if len(set(names)) != len(names):
            raise ValueError("agents: an agent may be listed once")
        for agent in self.agents:
            if isinstance(agent, str) and agent not in TEST_AGENTS:
                raise ValueError(f"agents: {agent!r} must be given as {{name, version, model}} "
                                 f"(bare names are for Harbor's test agents {sorted(TEST_AGENTS)})")
        for name, suite in self.suites.items():
            if suite.model is not None and suite.model.key_env not in self.secret_env:
                raise ValueError(f"suites.{name}.model.key_env: {suite.model.key_env} must be listed in secret_env")
        return self

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a if isinstance(a, str) else a.name for a in self.agents)

    def agent(self, name: str, suite: str,
              field: str = "payload.agent") -> tuple[AgentPolicy | ReleaseAgentPolicy | None, ModelPolicy | None]:
        """The policy entry for ``name`` (None for a test agent) and the suite's model when it needs one."""
        for entry in self.agents:
            if isinstance(entry, str) and entry == name:
                return None, None
            if isinstance(entry, (AgentPolicy, ReleaseAgentPolicy)) and entry.name == name:
                if not entry.model:
                    return entry, None
                model = self.suites[suite].model if suite in self.suites else None
                if model is None:
                    raise ValidationError(field, f"agent {name} needs a model, and suite {suite!r} configures none "
                                          "(suites.<suite>.model in policies/infra.yaml)", name)
                return entry, model
        raise ValidationError(field, f"agent not allowed by policy (allowed: {', '.join(self.agent_names)})", name)

    def source(self, repository: str, field: str = "payload.source.repository") -> SourcePolicy:
        """The policy's entry for ``repository`` (case-insensitive); ValidationError naming ``field`` otherwise."""
        try:
            canonical = canonical_repository(repository)
        except ValueError as exc:
            raise ValidationError(field, str(exc), repository) from None
        for entry in self.sources:
            if entry.canonical == canonical:
                return entry
        raise ValidationError(
            field, "repository is not allowed by the infra policy (not listed in policies/infra.yaml sources; "
            "owner/name compared case-insensitively)", repository)

    def check_image(self, role: Literal["runner", "api"], ref: ImageRef, field: str | None = None,
                    *, repository: str | None = None) -> None:
        """Raise ValidationError naming the field unless ``ref`` is an allowed ``role`` image.

        With ``repository``: allowed for that source repository (the rule accept applies);
        without: allowed for some listed source.
        """
        self.check_name(role, ref.name, field, repository=repository, shown=ref.ref)

    def check_name(self, role: Literal["runner", "api"], name: str, field: str | None = None,
                   *, repository: str | None = None, shown: str | None = None) -> None:
        """``check_image`` for an image name (``<registry>/<repository>``) before it has a digest."""
        registry, _, path = name.partition("/")
        entries = (self.source(repository),) if repository is not None else self.sources
        allowed: list[AllowedImage] = [image for entry in entries for image in getattr(entry.images, role)]
        for image in allowed:
            if image.registry == registry and image.repository == path:
                return
        names = ", ".join(dict.fromkeys(f"{e.registry}/{e.repository}" for e in allowed))
        whose = f" for source {entries[0].repository}" if repository is not None else ""
        raise ValidationError(field or role,
                              f"image {name!r} is not an allowed {role} image{whose} (allowed: {names})", shown or name)

    def check_payload(self, payload: DispatchPayload) -> SourcePolicy:
        """The payload's source repository is listed, and its runner and api are allowed for it."""
        entry = self.source(payload.source.repository, "payload.source.repository")
        roles: tuple[Literal["runner", "api"], ...] = ("runner", "api")
        for role in roles:
            ref = parse_ref(getattr(payload, role), f"payload.{role}")
            self.check_image(role, ref, field=f"payload.{role}", repository=entry.repository)
        self.check_agent(payload)
        return entry

    def check_agent(self, payload: DispatchPayload) -> None:
        """A release's agent: admitted for the payload's repository, of the listed kind and package, at the
        version the payload's tag stands for; any other agent carries no artifact."""
        agent, _ = self.agent(payload.agent, payload.suite)
        artifact = payload.agent_artifact
        if not isinstance(agent, ReleaseAgentPolicy):
            if artifact is not None:
                raise ValidationError("payload.agent_artifact", f"agent {payload.agent} is not a release's agent in "
                                      "the policy: it carries no artifact")
            return
        if artifact is None:
            raise ValidationError("payload.agent_artifact", f"is required: {agent.name} is a release's agent")
        if not agent.admits(payload.source.repository):
            raise ValidationError("payload.agent", f"agent {agent.name} is admitted for {', '.join(agent.repositories)}, "
                                  f"not {payload.source.repository}", payload.agent)
        if artifact.kind != agent.kind:
            raise ValidationError("payload.agent_artifact.kind", f"must be {agent.kind} (the policy's)", artifact.kind)
        if artifact.package != agent.package:
            raise ValidationError("payload.agent_artifact.package", f"must be {agent.package} (the policy's)",
                                  artifact.package)
        expected = version_for_tag(payload.source.tag)
        if artifact.version != expected:
            raise ValidationError("payload.agent_artifact.version",
                                  f"must be {expected}, the version of the release's tag {payload.source.tag}",
                                  artifact.version)

    def dataset(self, suite: str, field: str = "payload.suite") -> DatasetPolicy:
        """The pinned dataset of ``suite``; ValidationError naming ``field`` when the policy has no such suite."""
        if suite not in self.suites:
            raise ValidationError(field, f"suite not in the infra policy (suites: {', '.join(sorted(self.suites))})", suite)
        return self.suites[suite].dataset

    def check_task_image(self, suite: str, task: str, ref: ImageRef, field: str) -> None:
        """A task's prebuilt image comes from a registry ``suites.<suite>.task_image_registries`` admits;
        ValidationError naming the task, the registry and that field otherwise."""
        admitted = self.suites[suite].task_image_registries
        if ref.registry not in admitted:
            raise ValidationError(field, f"task {task}: registry {ref.registry} is not admitted by "
                                  f"suites.{suite}.task_image_registries (admitted: {', '.join(admitted) or 'none'})",
                                  ref.ref)

    def suite_timeout(self, suite: str) -> float:
        return self.suites[suite].timeout_seconds

    def trial_concurrency(self, suite: str) -> int:
        return self.suites[suite].trial_concurrency

    def trial_batch(self, suite: str) -> int:
        """Trials one runner container of ``suite`` takes: its ``trial_batch``, else its ``trial_concurrency``."""
        chosen = self.suites[suite]
        return chosen.trial_batch or chosen.trial_concurrency

    def task_attempts(self, suite: str) -> int:
        """Trials per task of ``suite`` (its ``attempts``)."""
        return self.suites[suite].attempts

    def infra_errors_exceed_threshold(self, infra_errors: int, total: int) -> bool:
        if total <= 0:
            return True
        return infra_errors * 100.0 / total > self.infra_error_threshold_percent


def policy_bytes_digest(raw: bytes) -> str:
    """``sha256:HEX`` of a policy file's bytes (what ``sha256sum policies/infra.yaml`` prints, prefixed): the one
    digest of a policy (accept's ``--policy-digest`` check, the loaded policy's, the run's evidence)."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def load_policy(path: Path | None = None) -> InfraPolicy:
    """Load and validate the infra policy (default: $BENCHSEAL_INFRA_POLICY, else policies/infra.yaml).

    The installed host sets BENCHSEAL_INFRA_POLICY=/etc/benchseal/infra.yaml in its units and
    wrappers, so accept, worker and publisher all read the operator's one policy; a set but
    unreadable path fails (no fallback to the shipped demo policy)."""
    if path is None:
        configured = os.environ.get("BENCHSEAL_INFRA_POLICY")
        if configured is not None and not os.path.isabs(configured):
            raise ValidationError("BENCHSEAL_INFRA_POLICY", "must be an absolute path", configured)
        path = Path(configured) if configured is not None else POLICY_PATH
    data, raw = load_yaml_bytes(path, what="policy", max_bytes=_MAX_POLICY_BYTES)
    if isinstance(data, dict) and data.get("schema") == "benchseal.infra-policy/v1":
        raise ValidationError(f"policy {path.name}: schema", "benchseal.infra-policy/v1 is no longer accepted: "
                              "v2 lists the allowed images per source repository (sources[].images)")
    policy = load_model(InfraPolicy, data, f"policy {path.name}")
    for source in policy.sources:
        for role in ("runner", "api"):
            for entry in getattr(source.images, role):
                # Reuse the shared validator: an allowed name must itself be a valid name.
                ImageRef(name=f"{entry.registry}/{entry.repository}", digest="sha256:" + "0" * 64)
    policy._digest = policy_bytes_digest(raw)  # of the bytes parsed, never of a second read
    return policy
