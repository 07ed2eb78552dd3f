"""The infra policy (policies/infra.yaml): what infra accepts and how the worker runs it.

``sources`` is the allowlist of source repositories (GitHub ``owner/name``, compared
case-insensitively through ``pipeline.contracts.canonical_repository``), each with the
image repositories it may use per role. A payload decides neither the repository
whose release is written nor, beyond that repository's list, the images that run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from pipeline.contracts import DispatchPayload, canonical_repository, load_model
from pipeline.digests import ImageRef, parse_ref
from pipeline.errors import ValidationError
from pipeline.paths import REPO_ROOT

POLICY_PATH = REPO_ROOT / "policies" / "infra.yaml"
SCHEMA_PATH = REPO_ROOT / "policies" / "payload.schema.json"
_MAX_POLICY_BYTES = 65536
_ENV_NAME = r"^[A-Z_][A-Z0-9_]{0,63}$"
_SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"


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


GITHUB_ISSUER = "https://token.actions.githubusercontent.com"


class SignerPolicy(_Strict):
    """Whose keyless signature every image of a source must carry before the worker runs it:
    the source repository's release workflow at the payload's tag, i.e. the certificate identity
    ``https://github.com/OWNER/REPO/.github/workflows/<workflow>@refs/tags/<tag>``."""

    workflow: str = Field(default="tag.yml", pattern=r"^[A-Za-z0-9_.-]{1,100}\.ya?ml$")
    issuer: Literal["https://token.actions.githubusercontent.com"] = "https://token.actions.githubusercontent.com"


class SourcePolicy(_Strict):
    """One allowed source repository, the images its payloads may name, and who must have signed them."""

    repository: Annotated[str, AfterValidator(_source_repository)]
    images: ImagePolicy
    # Always checked; the release workflow's file name defaults to tag.yml.
    signer: SignerPolicy = Field(default_factory=SignerPolicy)

    @property
    def canonical(self) -> str:
        return canonical_repository(self.repository)


class SuitePolicy(_Strict):
    timeout_seconds: float = Field(gt=0, le=86400)
    # Trials of one run that run at once inside the run's one runner container.
    trial_concurrency: int = Field(default=3, ge=1, le=16, strict=True)


class InfraPolicy(_Strict):
    schema_: Literal["benchseal.infra-policy/v2"] = Field(alias="schema")
    max_payload_bytes: int = Field(ge=256, le=1_048_576)
    sources: tuple[SourcePolicy, ...] = Field(min_length=1, max_length=1000)
    agents: tuple[Annotated[str, StringConstraints(pattern=_SLUG)], ...] = Field(min_length=1)
    suites: dict[Annotated[str, StringConstraints(pattern=_SLUG)], SuitePolicy] = Field(min_length=1)
    max_attempts: int = Field(ge=1, le=20)
    lease_seconds: float = Field(gt=0, le=3600)
    infra_error_threshold_percent: float = Field(ge=0, le=100)
    secret_env: tuple[Annotated[str, StringConstraints(pattern=_ENV_NAME)], ...] = ()

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _unique_sources(self) -> InfraPolicy:
        seen: dict[str, str] = {}
        for entry in self.sources:
            if entry.canonical in seen:
                raise ValueError(f"sources: {entry.repository!r} is listed twice (as {seen[entry.canonical]!r}; "
                                 "repository names are compared case-insensitively)")
            seen[entry.canonical] = entry.repository
        return self

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
        entries = (self.source(repository),) if repository is not None else self.sources
        allowed: list[AllowedImage] = [image for entry in entries for image in getattr(entry.images, role)]
        for image in allowed:
            if image.registry == ref.registry and image.repository == ref.repository:
                return
        names = ", ".join(dict.fromkeys(f"{e.registry}/{e.repository}" for e in allowed))
        whose = f" for source {entries[0].repository}" if repository is not None else ""
        raise ValidationError(field or role,
                              f"image {ref.name!r} is not an allowed {role} image{whose} (allowed: {names})", ref.ref)

    def check_payload(self, payload: DispatchPayload) -> SourcePolicy:
        """The payload's source repository is listed, and its runner and api are allowed for it."""
        entry = self.source(payload.source.repository, "payload.source.repository")
        roles: tuple[Literal["runner", "api"], ...] = ("runner", "api")
        for role in roles:
            ref = parse_ref(getattr(payload, role), f"payload.{role}")
            self.check_image(role, ref, field=f"payload.{role}", repository=entry.repository)
        return entry

    def suite_timeout(self, suite: str) -> float:
        return self.suites[suite].timeout_seconds

    def trial_concurrency(self, suite: str) -> int:
        return self.suites[suite].trial_concurrency

    def infra_errors_exceed_threshold(self, infra_errors: int, total: int) -> bool:
        if total <= 0:
            return True
        return infra_errors * 100.0 / total > self.infra_error_threshold_percent


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
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValidationError("policy", f"cannot read {path}: {exc.strerror}") from None
    if len(raw) > _MAX_POLICY_BYTES:
        raise ValidationError("policy", f"must be at most {_MAX_POLICY_BYTES} bytes", str(path))
    try:
        data = yaml.load(raw, Loader=_StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValidationError("policy", f"not valid YAML: {exc}") from None
    if isinstance(data, dict) and data.get("schema") == "benchseal.infra-policy/v1":
        raise ValidationError(f"policy {path.name}: schema", "benchseal.infra-policy/v1 is no longer accepted: "
                              "v2 lists the allowed images per source repository (sources[].images)")
    policy = load_model(InfraPolicy, data, f"policy {path.name}")
    for source in policy.sources:
        for role in ("runner", "api"):
            for entry in getattr(source.images, role):
                # Reuse the shared validator: an allowed name must itself be a valid name.
                ImageRef(name=f"{entry.registry}/{entry.repository}", digest="sha256:" + "0" * 64)
    return policy


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        keys: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise yaml.constructor.ConstructorError(None, None, "mapping keys must be scalars", key_node.start_mark)
            if key in keys:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            keys.add(key)
        return super().construct_mapping(node, deep=deep)
