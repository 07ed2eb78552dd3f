"""The infra policy (policies/infra.yaml): what infra accepts and how the worker runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from pipeline.contracts import load_model
from pipeline.digests import ImageRef
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
    runner: tuple[AllowedImage, ...] = Field(min_length=1)
    api: tuple[AllowedImage, ...] = Field(min_length=1)


class SuitePolicy(_Strict):
    timeout_seconds: float = Field(gt=0, le=86400)
    # Trials of one run that run at once inside the run's one runner container.
    trial_concurrency: int = Field(default=3, ge=1, le=16, strict=True)


class InfraPolicy(_Strict):
    schema_: Literal["benchseal.infra-policy/v1"] = Field(alias="schema")
    max_payload_bytes: int = Field(ge=256, le=1_048_576)
    images: ImagePolicy
    agents: tuple[Annotated[str, StringConstraints(pattern=_SLUG)], ...] = Field(min_length=1)
    suites: dict[Annotated[str, StringConstraints(pattern=_SLUG)], SuitePolicy] = Field(min_length=1)
    max_attempts: int = Field(ge=1, le=20)
    lease_seconds: float = Field(gt=0, le=3600)
    infra_error_threshold_percent: float = Field(ge=0, le=100)
    secret_env: tuple[Annotated[str, StringConstraints(pattern=_ENV_NAME)], ...] = ()

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def check_image(self, role: Literal["runner", "api"], ref: ImageRef, field: str | None = None) -> None:
        """Raise ValidationError naming the field unless ``ref`` is an allowed image for ``role``."""
        allowed = getattr(self.images, role)
        for entry in allowed:
            if entry.registry == ref.registry and entry.repository == ref.repository:
                return
        names = ", ".join(f"{e.registry}/{e.repository}" for e in allowed)
        raise ValidationError(field or role, f"image {ref.name!r} is not an allowed {role} image (allowed: {names})", ref.ref)

    def suite_timeout(self, suite: str) -> float:
        return self.suites[suite].timeout_seconds

    def trial_concurrency(self, suite: str) -> int:
        return self.suites[suite].trial_concurrency

    def infra_errors_exceed_threshold(self, infra_errors: int, total: int) -> bool:
        if total <= 0:
            return True
        return infra_errors * 100.0 / total > self.infra_error_threshold_percent


def load_policy(path: Path | None = None) -> InfraPolicy:
    """Load and validate the infra policy (default: policies/infra.yaml)."""
    path = path or POLICY_PATH
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValidationError("policy", f"cannot read {path}: {exc.strerror}") from None
    if len(raw) > _MAX_POLICY_BYTES:
        raise ValidationError("policy", f"must be at most {_MAX_POLICY_BYTES} bytes", str(path))
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValidationError("policy", f"not valid YAML: {exc}") from None
    policy = load_model(InfraPolicy, data, f"policy {path.name}")
    for role in ("runner", "api"):
        for entry in getattr(policy.images, role):
            # Reuse the shared validator: an allowed name must itself be a valid name.
            ImageRef(name=f"{entry.registry}/{entry.repository}", digest="sha256:" + "0" * 64)
    return policy
