"""What a consumer of a release expects, and the signer identity that follows from it.

Two inputs, both from the consumer, never from the release being checked:

* the **expectation**: the source repository (``OWNER/NAME``) and tag the release must
  be for, from ``--repo`` / ``--tag`` or pinned in a policy file (``expect:``), and, for a
  profile whose identity names them, the infra repository whose benchmark ran and sealed the
  evidence (``--infra-repo`` or ``expect.infra_repository``) and the builder, benchseal's
  repository at one exact ref, whose reusable ``benchmark.yml`` signed it for that infra
  repository (``--builder OWNER/REPO@REF`` or ``expect.builder``);
* the **signer**: identity and OIDC issuer per profile in ``policies/verify.yaml``
  (or ``--policy FILE``), and optionally the certificate's GitHub workflow repository and ref
  (``workflow_repository``, ``workflow_ref``: the job that called a reusable workflow). A
  template may use ``{repository}``, ``{tag}``, ``{infra_repository}``, ``{builder_repository}``
  and ``{builder_ref}``, which are filled from the expectation only; any other placeholder is
  refused, and so is an identity naming the builder without pinning both workflow extensions
  (a reusable workflow's identity names no caller: any repository could have called it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.contracts import builder_problem, validate_git_tag, validate_repository
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.core.yamlfile import load_yaml

DEFAULT_POLICY = REPO_ROOT / "policies" / "verify.yaml"
POLICY_SCHEMA = "benchseal.verify-policy/v1"
# The only values a template may use: all are stated by the consumer.
PLACEHOLDERS = ("repository", "tag", "infra_repository", "builder_repository", "builder_ref")
_BUILDER_PLACEHOLDERS = ("builder_repository", "builder_ref")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_POLICY_KEYS = frozenset({"schema", "profiles", "expect"})
_EXPECT_KEYS = frozenset({"repository", "tag", "infra_repository", "builder"})
# A profile: who signed (identity, issuer) and, for a reusable workflow, for whom (the caller's
# repository and ref, certified as the GitHub workflow repository / ref extensions).
_PROFILE_REQUIRED = ("identity", "issuer")
_PROFILE_OPTIONAL = ("workflow_repository", "workflow_ref")
# The builder's reusable workflows: the images are signed by release.yml (the source's release),
# the evidence by benchmark.yml (the infra's seal job).
RELEASE_WORKFLOW = "release.yml"
BENCHMARK_WORKFLOW = "benchmark.yml"
BUILDER_OPTION_RULE = ("must be the builder as OWNER/REPO@REF: benchseal's repository and the one exact ref the "
                       "caller workflows pin, a 40-hex commit or refs/tags/NAME or refs/heads/NAME (no patterns, "
                       "no bare branch or tag names)")


@dataclass(frozen=True)
class Builder:
    """benchseal's repository at one exact ref: the reusable workflows that sign a release
    (``release.yml`` the images, ``benchmark.yml`` the evidence) as callers pin them."""

    repository: str
    ref: str

    def workflow(self, file: str) -> str:
        """The reusable workflow's job_workflow_ref (the certificate identity without https://github.com/)."""
        return f"{self.repository}/.github/workflows/{file}@{self.ref}"

    def __str__(self) -> str:
        return f"{self.repository}@{self.ref}"


def parse_builder(value: object, field: str = "--builder") -> Builder:
    """``OWNER/REPO@REF`` as a :class:`Builder`; ValidationError naming ``field`` otherwise. Both
    derived job_workflow_refs must pass ``pipeline.core.contracts.builder_problem`` (what the infra
    policy's ``signer: builder:`` is held to)."""
    if not isinstance(value, str) or value.count("@") != 1:
        raise ValidationError(field, BUILDER_OPTION_RULE, value)
    repository, _, ref = value.partition("@")
    validate_repository(repository, field)
    for file in (RELEASE_WORKFLOW, BENCHMARK_WORKFLOW):
        if builder_problem(Builder(repository, ref).workflow(file)) is not None:
            raise ValidationError(field, BUILDER_OPTION_RULE, value)
    return Builder(repository, ref)


@dataclass(frozen=True)
class Expected:
    """The release the consumer means: source repository and tag (and who benchmarked it)."""

    repository: str
    tag: str
    infra_repository: str | None = None
    builder: Builder | None = None


@dataclass(frozen=True)
class Expectation:
    """Everything a release must match: signer (identity, issuer and, for a reusable workflow, the
    caller it signed for: workflow repository and ref) and source (repository, tag)."""

    profile: str
    identity: str
    issuer: str
    repository: str
    tag: str
    infra_repository: str | None = None
    builder: Builder | None = None
    workflow_repository: str | None = None  # GitHub workflow repository (1.5) / source repository URI (1.12)
    workflow_ref: str | None = None  # GitHub workflow ref (1.6) / source repository ref (1.14)

    def describe(self) -> str:
        """The signer in one line: the identity, and the caller it must have signed for."""
        caller = ""
        if self.workflow_repository is not None or self.workflow_ref is not None:
            caller = f" for {self.workflow_repository or 'any repository'} at {self.workflow_ref or 'any ref'}"
        return f"{self.identity}{caller} (issuer {self.issuer})"


@dataclass(frozen=True)
class VerifyPolicy:
    path: Path
    profiles: dict[str, dict[str, str]]
    expect_repository: str | None = None
    expect_tag: str | None = None
    expect_infra_repository: str | None = None
    expect_builder: Builder | None = None


def _check_template(value: str, field: str) -> None:
    for match in _PLACEHOLDER.finditer(value):
        if match.group(1) not in PLACEHOLDERS:
            raise ValidationError(field, f"may use only the placeholders {{repository}}, {{tag}}, "
                                         f"{{infra_repository}}, {{builder_repository}} and {{builder_ref}} "
                                         f"(values the consumer states), not {{{match.group(1)}}}", value)
    stripped = _PLACEHOLDER.sub("", value)
    if "{" in stripped or "}" in stripped:
        raise ValidationError(field, "has an unbalanced '{' or '}'", value)


def load_policy(path: Path | None = None) -> VerifyPolicy:

    path = path or DEFAULT_POLICY
    data: object = load_yaml(path, what="--policy")
    if not isinstance(data, dict) or data.get("schema") != POLICY_SCHEMA:
        raise ValidationError(f"{path}: schema", f"must be {POLICY_SCHEMA!r}", data.get("schema") if isinstance(data, dict) else data)
    unknown = sorted(str(k) for k in data if k not in _POLICY_KEYS)
    if unknown:
        raise ValidationError(f"{path}", f"unknown keys {unknown} (allowed: {sorted(_POLICY_KEYS)})")
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise ValidationError(f"{path}: profiles", "must map profile names to {identity, issuer}")
    out = {str(name): _load_profile(entry, f"{path}: profiles.{name}") for name, entry in profiles.items()}
    expect = data.get("expect")
    if expect is None:
        return VerifyPolicy(path, out)
    if not isinstance(expect, dict) or not expect or set(expect) - _EXPECT_KEYS:
        raise ValidationError(f"{path}: expect", "must be a mapping with repository, tag, infra_repository and/or "
                                                 "builder", expect)
    repository = expect.get("repository")
    tag = expect.get("tag")
    infra = expect.get("infra_repository")
    builder = expect.get("builder")
    return VerifyPolicy(
        path, out,
        expect_repository=None if repository is None else validate_repository(repository, f"{path}: expect.repository"),
        expect_tag=None if tag is None else validate_git_tag(tag, f"{path}: expect.tag"),
        expect_infra_repository=None if infra is None else validate_repository(
            infra, f"{path}: expect.infra_repository"),
        expect_builder=None if builder is None else parse_builder(builder, f"{path}: expect.builder"),
    )


def _load_profile(entry: object, field: str) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise ValidationError(field, "must be a mapping")
    unknown = sorted(str(k) for k in entry if k not in (*_PROFILE_REQUIRED, *_PROFILE_OPTIONAL))
    if unknown:
        raise ValidationError(field, f"unknown keys {unknown} (allowed: identity, issuer, workflow_repository, "
                                     f"workflow_ref)")
    out: dict[str, str] = {}
    for key in (*_PROFILE_REQUIRED, *_PROFILE_OPTIONAL):
        value = entry.get(key)
        if value is None and key in _PROFILE_OPTIONAL:
            continue
        if not isinstance(value, str) or not value or value != value.strip():
            raise ValidationError(f"{field}.{key}", "must be a non-empty string without surrounding spaces", value)
        _check_template(value, f"{field}.{key}")
        out[key] = value
    if any(f"{{{name}}}" in out["identity"] for name in _BUILDER_PLACEHOLDERS) and \
            not all(key in out for key in _PROFILE_OPTIONAL):
        # A reusable workflow signs for whichever repository calls it: its identity alone would admit
        # evidence sealed for anyone.
        raise ValidationError(f"{field}", "names the builder in its identity, so it must also pin the caller: "
                                          "workflow_repository and workflow_ref")
    return out


def _merge(option: str, key: str, given: str | None, pinned: str | None, policy: Path) -> str:
    if given is not None and pinned is not None and given != pinned:
        raise ValidationError(option, f"differs from expect.{key} {pinned!r} pinned in {policy}", given)
    value = given if given is not None else pinned
    if value is None:
        raise ValidationError(option, "is required: state the release you expect (or pin it under expect: in "
                                      "--policy FILE); benchseal verify never takes it from the release it checks")
    return value


def expected(policy: VerifyPolicy, repository: str | None, tag: str | None,
             infra_repository: str | None = None, builder: str | Builder | None = None) -> Expected:
    """The consumer's expectation: options and the policy's ``expect:``, which must agree."""
    if repository is not None:
        validate_repository(repository, "--repo")
    if tag is not None:
        validate_git_tag(tag, "--tag")
    if infra_repository is not None:
        validate_repository(infra_repository, "--infra-repo")
    stated = parse_builder(builder) if isinstance(builder, str) else builder
    pinned_infra = policy.expect_infra_repository
    if infra_repository is not None and pinned_infra is not None and infra_repository != pinned_infra:
        raise ValidationError("--infra-repo", f"differs from expect.infra_repository {pinned_infra!r} pinned in "
                                              f"{policy.path}", infra_repository)
    pinned_builder = policy.expect_builder
    if stated is not None and pinned_builder is not None and stated != pinned_builder:
        raise ValidationError("--builder", f"differs from expect.builder {str(pinned_builder)!r} pinned in "
                                           f"{policy.path}", str(stated))
    return Expected(repository=_merge("--repo", "repository", repository, policy.expect_repository, policy.path),
                    tag=_merge("--tag", "tag", tag, policy.expect_tag, policy.path),
                    infra_repository=infra_repository if infra_repository is not None else pinned_infra,
                    builder=stated if stated is not None else pinned_builder)


def expectation(policy: Path | None, profile: str, *, repository: str | None, tag: str | None,
                infra_repository: str | None = None, builder: str | Builder | None = None) -> Expectation:
    """Signer identity/issuer (and the caller's workflow repository and ref, when the profile pins
    them) of ``profile`` with placeholders filled from the consumer's expectation."""
    loaded = load_policy(policy)
    if profile not in loaded.profiles:
        raise ValidationError("--profile", f"must be one of {sorted(loaded.profiles)}", profile)
    want = expected(loaded, repository, tag, infra_repository, builder)
    entry = loaded.profiles[profile]
    if want.infra_repository is None and any("{infra_repository}" in value for value in entry.values()):
        raise ValidationError("--infra-repo", f"is required by the {profile} profile: state the infra repository "
                                              f"whose benchmark sealed the release (or pin expect.infra_repository "
                                              f"in --policy FILE); it is never taken from the release")
    if want.builder is None and any(f"{{{name}}}" in value for value in entry.values()
                                    for name in _BUILDER_PLACEHOLDERS):
        raise ValidationError("--builder", f"is required by the {profile} profile: state the builder, benchseal's "
                                           f"repository and the exact ref the workflows pin (OWNER/REPO@REF, e.g. "
                                           f"benchseal/benchseal@<40-hex commit>), whose benchmark.yml sealed the "
                                           f"release (or pin expect.builder in --policy FILE); it is never taken "
                                           f"from the release")
    facts = {"repository": want.repository, "tag": want.tag, "infra_repository": want.infra_repository or "",
             "builder_repository": want.builder.repository if want.builder else "",
             "builder_ref": want.builder.ref if want.builder else ""}

    def fill(template: str) -> str:
        return _PLACEHOLDER.sub(lambda m: facts[m.group(1)], template)

    optional = {key: fill(entry[key]) if key in entry else None for key in _PROFILE_OPTIONAL}
    return Expectation(profile=profile, identity=fill(entry["identity"]), issuer=fill(entry["issuer"]),
                       repository=want.repository, tag=want.tag, infra_repository=want.infra_repository,
                       builder=want.builder, workflow_repository=optional["workflow_repository"],
                       workflow_ref=optional["workflow_ref"])
