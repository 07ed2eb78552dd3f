"""What a consumer of a release expects, and the signer identity that follows from it.

Two inputs, both from the consumer, never from the release being checked:

* the **expectation**: the source repository (``OWNER/NAME``) and tag the release must
  be for, from ``--repo`` / ``--tag`` or pinned in a policy file (``expect:``), and, for a
  profile whose identity names it, the infra repository whose ``benchmark.yml`` sealed the
  evidence (``--infra-repo`` or ``expect.infra_repository``);
* the **signer**: identity and OIDC issuer per profile in ``policies/verify.yaml``
  (or ``--policy FILE``). An identity template may use ``{repository}``, ``{tag}`` and
  ``{infra_repository}``, which are filled from the expectation only; any other placeholder
  is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.contracts import validate_git_tag, validate_repository
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.core.yamlfile import load_yaml

DEFAULT_POLICY = REPO_ROOT / "policies" / "verify.yaml"
POLICY_SCHEMA = "benchseal.verify-policy/v1"
# The only values a template may use: all are stated by the consumer.
PLACEHOLDERS = ("repository", "tag", "infra_repository")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_POLICY_KEYS = frozenset({"schema", "profiles", "expect"})


@dataclass(frozen=True)
class Expected:
    """The release the consumer means: source repository and tag (and who benchmarked it)."""

    repository: str
    tag: str
    infra_repository: str | None = None


@dataclass(frozen=True)
class Expectation:
    """Everything a release must match: signer (identity, issuer) and source (repository, tag)."""

    profile: str
    identity: str
    issuer: str
    repository: str
    tag: str
    infra_repository: str | None = None


@dataclass(frozen=True)
class VerifyPolicy:
    path: Path
    profiles: dict[str, dict[str, str]]
    expect_repository: str | None = None
    expect_tag: str | None = None
    expect_infra_repository: str | None = None


def validate_tag(value: object, field: str = "--tag") -> str:
    if not isinstance(value, str) or value.startswith("refs/"):
        raise ValidationError(field, "must be a tag name such as v1.2.3, not a ref (drop refs/tags/)", value)
    return validate_git_tag(value, field)


def _check_template(value: str, field: str) -> None:
    for match in _PLACEHOLDER.finditer(value):
        if match.group(1) not in PLACEHOLDERS:
            raise ValidationError(field, f"may use only the placeholders {{repository}}, {{tag}} and "
                                         f"{{infra_repository}} (values the consumer states), not "
                                         f"{{{match.group(1)}}}", value)
    stripped = _PLACEHOLDER.sub("", value)
    if "{" in stripped or "}" in stripped:
        raise ValidationError(field, "has an unbalanced '{' or '}'", value)


def load_policy(path: Path | None = None) -> VerifyPolicy:

    path = path or DEFAULT_POLICY
    data: Any = load_yaml(path, what="--policy")
    if not isinstance(data, dict) or data.get("schema") != POLICY_SCHEMA:
        raise ValidationError(f"{path}: schema", f"must be {POLICY_SCHEMA!r}", data.get("schema") if isinstance(data, dict) else data)
    unknown = sorted(str(k) for k in data if k not in _POLICY_KEYS)
    if unknown:
        raise ValidationError(f"{path}", f"unknown keys {unknown} (allowed: {sorted(_POLICY_KEYS)})")
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise ValidationError(f"{path}: profiles", "must map profile names to {identity, issuer}")
    out: dict[str, dict[str, str]] = {}
    for name, entry in profiles.items():
        if not isinstance(entry, dict):
            raise ValidationError(f"{path}: profiles.{name}", "must be a mapping")
        for key in ("identity", "issuer"):
            value = entry.get(key)
            if not isinstance(value, str) or not value or value != value.strip():
                raise ValidationError(f"{path}: profiles.{name}.{key}", "must be a non-empty string without surrounding spaces", value)
            _check_template(value, f"{path}: profiles.{name}.{key}")
        out[str(name)] = {"identity": entry["identity"], "issuer": entry["issuer"]}
    expect = data.get("expect")
    if expect is None:
        return VerifyPolicy(path, out)
    if not isinstance(expect, dict) or not expect or set(expect) - {"repository", "tag", "infra_repository"}:
        raise ValidationError(f"{path}: expect", "must be a mapping with repository, tag and/or infra_repository",
                              expect)
    repository = expect.get("repository")
    tag = expect.get("tag")
    infra = expect.get("infra_repository")
    return VerifyPolicy(
        path, out,
        expect_repository=None if repository is None else validate_repository(repository, f"{path}: expect.repository"),
        expect_tag=None if tag is None else validate_tag(tag, f"{path}: expect.tag"),
        expect_infra_repository=None if infra is None else validate_repository(
            infra, f"{path}: expect.infra_repository"),
    )


def _merge(option: str, key: str, given: str | None, pinned: str | None, policy: Path) -> str:
    if given is not None and pinned is not None and given != pinned:
        raise ValidationError(option, f"differs from expect.{key} {pinned!r} pinned in {policy}", given)
    value = given if given is not None else pinned
    if value is None:
        raise ValidationError(option, "is required: state the release you expect (or pin it under expect: in "
                                      "--policy FILE); benchseal verify never takes it from the release it checks")
    return value


def expected(policy: VerifyPolicy, repository: str | None, tag: str | None,
             infra_repository: str | None = None) -> Expected:
    """The consumer's expectation: options and the policy's ``expect:``, which must agree."""
    if repository is not None:
        validate_repository(repository, "--repo")
    if tag is not None:
        validate_tag(tag, "--tag")
    if infra_repository is not None:
        validate_repository(infra_repository, "--infra-repo")
    pinned_infra = policy.expect_infra_repository
    if infra_repository is not None and pinned_infra is not None and infra_repository != pinned_infra:
        raise ValidationError("--infra-repo", f"differs from expect.infra_repository {pinned_infra!r} pinned in "
                                              f"{policy.path}", infra_repository)
    return Expected(repository=_merge("--repo", "repository", repository, policy.expect_repository, policy.path),
                    tag=_merge("--tag", "tag", tag, policy.expect_tag, policy.path),
                    infra_repository=infra_repository if infra_repository is not None else pinned_infra)


def expectation(policy: Path | None, profile: str, *, repository: str | None, tag: str | None,
                infra_repository: str | None = None) -> Expectation:
    """Signer identity/issuer of ``profile`` with placeholders filled from the consumer's expectation."""
    loaded = load_policy(policy)
    if profile not in loaded.profiles:
        raise ValidationError("--profile", f"must be one of {sorted(loaded.profiles)}", profile)
    want = expected(loaded, repository, tag, infra_repository)
    entry = loaded.profiles[profile]
    if want.infra_repository is None and any("{infra_repository}" in value for value in entry.values()):
        raise ValidationError("--infra-repo", f"is required by the {profile} profile: state the infra repository "
                                              f"whose benchmark.yml sealed the release (or pin expect.infra_repository "
                                              f"in --policy FILE); it is never taken from the release")
    facts = {"repository": want.repository, "tag": want.tag, "infra_repository": want.infra_repository or ""}

    def fill(template: str) -> str:
        return _PLACEHOLDER.sub(lambda m: facts[m.group(1)], template)

    return Expectation(profile=profile, identity=fill(entry["identity"]), issuer=fill(entry["issuer"]),
                       repository=want.repository, tag=want.tag, infra_repository=want.infra_repository)
