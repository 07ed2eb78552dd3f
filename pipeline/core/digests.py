"""The one validator for image digests and digest-pinned references.

Producers (build) and every consumer (dispatch, infra accept, worker, evidence,
verify) call these functions, so a reference that one stage accepts is exactly
a reference every other stage accepts.

A reference is ``<registry>/<repository>@sha256:<64 lowercase hex>``:

* the registry host is explicit (no implied Docker Hub), ``host[:port]``;
* repository components follow the OCI distribution grammar;
* no tag may appear, and ``sha256`` is the only algorithm;
* no whitespace, no uppercase hex, no other length.

Patterns end in ``\\Z``, never ``$``: ``$`` also matches before a trailing newline.

The engine names its own objects (a container, an exec) by such a hex alone: ``ENGINE_ID_PATTERN``, the full id
the engine proxy remembers ownership by and the runner takes from the engine's answer to a create.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.errors import CheckFailed, ValidationError

DIGEST_PATTERN = r"sha256:[0-9a-f]{64}"
ENGINE_ID_PATTERN = r"[0-9a-f]{64}"
_DIGEST_RE = re.compile(rf"\A{DIGEST_PATTERN}\Z")
# A DNS name or IPv4 address, optionally with a port. Lowercase only: registries
# are case-insensitive, and one spelling per host keeps references comparable.
_HOST_RE = re.compile(
    r"\A(?:localhost|[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+)"
    r"(?::[0-9]{1,5})?\Z"
)
_COMPONENT_RE = re.compile(r"\A[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
_MAX_NAME_LENGTH = 255
# Matches exactly the characters for which str.isspace() is true (checked over every code point by
# a test); one regex search instead of a Python loop per character, on the queue's hot path.
_WHITESPACE_RE = re.compile(r"\s")


def validate_digest(value: object, field: str = "digest") -> str:
    """Return ``value`` when it is ``sha256:<64 lowercase hex>``; raise otherwise."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string 'sha256:<64 lowercase hex>'", value)
    if not _DIGEST_RE.match(value):
        raise ValidationError(field, _digest_rule_broken(value), value)
    return value


def _digest_rule_broken(value: str) -> str:
    if _WHITESPACE_RE.search(value):
        return "must not contain whitespace"
    algorithm, sep, hex_part = value.partition(":")
    if not sep:
        return "must start with 'sha256:'"
    if algorithm != "sha256":
        return f"algorithm must be sha256, not {algorithm!r}"
    if len(hex_part) != 64:
        return f"must have exactly 64 hex digits after 'sha256:', found {len(hex_part)}"
    if hex_part != hex_part.lower():
        return "hex digits must be lowercase"
    return "must be 'sha256:' followed by 64 lowercase hex digits [0-9a-f]"


def validate_name(value: object, field: str = "name") -> str:
    """Return ``value`` when it is ``<registry host[:port]>/<repository>`` with no tag."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string '<registry>/<repository>'", value)
    if not value or _WHITESPACE_RE.search(value):
        raise ValidationError(field, "must be non-empty and contain no whitespace", value)
    if not value.isascii():
        raise ValidationError(field, "must be ASCII", value)
    if len(value) > _MAX_NAME_LENGTH:
        raise ValidationError(field, f"must be at most {_MAX_NAME_LENGTH} characters", value)
    if "@" in value:
        raise ValidationError(field, "must not contain '@'", value)
    host, sep, path = value.partition("/")
    if not sep or not path:
        raise ValidationError(field, "must name a registry host and a repository: 'host[:port]/repo'", value)
    if not _HOST_RE.match(host):
        raise ValidationError(field, f"registry host {host!r} must be a lowercase DNS name, IPv4 address or localhost, with an optional port", value)
    for component in path.split("/"):
        if ":" in component:
            raise ValidationError(field, "must not carry a tag; pin images by digest only", value)
        if not _COMPONENT_RE.match(component):
            raise ValidationError(field, f"repository component {component!r} must match [a-z0-9]+([._-][a-z0-9]+)*", value)
    return value


def validate_registry(value: object, field: str = "registry") -> str:
    """Return ``value`` when it is a registry host as image names spell it (``host[:port]``, lowercase, no
    scheme or path): the host part of ``validate_name``, for lists of admitted registries."""
    if not isinstance(value, str) or not _HOST_RE.match(value):
        raise ValidationError(field, "must be a registry host as image names spell it: a lowercase DNS name, IPv4 "
                              "address or localhost, with an optional :port (no scheme, path or tag)", value)
    return value


# What may end an image-name prefix, so the image's own name stays a distinct part of it.
NAME_PREFIX_ENDINGS = ("/", "-", "_", ".")


def validate_name_prefix(value: object, names: Sequence[str], field: str = "image prefix") -> str:
    """Return ``value`` when ``value + name`` is a valid ``validate_name`` name for every one of ``names``.

    A prefix is ``<registry host[:port]>/<repository path>`` ending in ``/``, ``-``, ``_`` or ``.``
    (``ghcr.io/acme/benchseal-`` gives ``ghcr.io/acme/benchseal-runner``; ``127.0.0.1:5055/benchseal/``
    gives ``127.0.0.1:5055/benchseal/runner``).
    """
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string '<registry>/<repository prefix>'", value)
    if not value.endswith(NAME_PREFIX_ENDINGS):
        raise ValidationError(
            field, "must end in '/', '-', '_' or '.' (e.g. ghcr.io/OWNER/benchseal- or HOST:PORT/benchseal/)", value
        )
    for name in names:
        try:
            validate_name(value + name, field)
        except ValidationError as exc:
            raise ValidationError(field, f"{exc.rule} (in {value + name!r})", value) from None
    return value


@dataclass(frozen=True)
class ImageRef:
    """An image pinned by manifest digest: ``name@sha256:...``."""

    name: str
    digest: str

    def __post_init__(self) -> None:
        validate_name(self.name, "name")
        validate_digest(self.digest, "digest")

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}"

    @property
    def registry(self) -> str:
        return self.name.partition("/")[0]

    @property
    def repository(self) -> str:
        return self.name.partition("/")[2]

    def __str__(self) -> str:
        return self.ref


def parse_ref(value: object, field: str = "ref") -> ImageRef:
    """Parse ``name@sha256:<64 hex>``; every error names ``field`` and the rule."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string 'name@sha256:<64 lowercase hex>'", value)
    if _WHITESPACE_RE.search(value):
        raise ValidationError(field, "must not contain whitespace", value)
    if not value.isascii():
        raise ValidationError(field, "must be ASCII", value)
    name, sep, digest = value.partition("@")
    if not sep:
        raise ValidationError(field, "must be pinned by digest: 'name@sha256:<64 lowercase hex>' (tags are not accepted)", value)
    if "@" in digest:
        raise ValidationError(field, "must contain exactly one '@'", value)
    try:
        validate_name(name, field)
        validate_digest(digest, field)
    except ValidationError as exc:
        raise ValidationError(field, exc.rule, value) from None
    return ImageRef(name=name, digest=digest)


def validate_ref(value: object, field: str = "ref") -> str:
    """Return ``value`` unchanged when it is a valid digest-pinned reference."""
    return parse_ref(value, field).ref


def require_repo_digest(ref: ImageRef, repo_digests: Sequence[str]) -> None:
    """Raise CheckFailed unless a local image's RepoDigests list exactly ``ref``.

    One image can carry several digests (one per repository it came from): match ours by
    repository, never take ``[0]``.
    """
    ours = [d for d in repo_digests if d.partition("@")[0] == ref.name]
    if ref.ref not in ours:
        raise CheckFailed(f"local image for {ref.name} has RepoDigests {ours}, not {ref.digest}: refusing to use it")
