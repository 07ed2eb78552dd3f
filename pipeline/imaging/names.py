"""Image names are configuration: one prefix names the registry and repository of every image.

    name(image) = prefix + image      for image in runner, api, base, runner-base

``ghcr.io/acme/benchseal-`` gives ``ghcr.io/acme/benchseal-runner``, ``ghcr.io/acme/benchseal-api``,
``ghcr.io/acme/benchseal-base`` and ``ghcr.io/acme/benchseal-runner-base``; the local default
``127.0.0.1:5055/benchseal/`` gives ``127.0.0.1:5055/benchseal/runner`` and so on.

Where the prefix comes from, the first that is set:

1. ``--image-prefix PREFIX`` (build, base build, release --local);
2. ``--registry HOST:PORT``, shorthand for ``HOST:PORT/benchseal/`` (not together with 1);
3. ``$BENCHSEAL_IMAGE_PREFIX``;
4. ``$BENCHSEAL_REGISTRY``, the same shorthand (when 3 is set too, both must name one registry,
   or this one is empty);
5. the local registry, ``127.0.0.1:5055/benchseal/``.

Nothing falls back past a configured value: a prefix that is set but invalid is a usage
error (exit 2), never replaced by the default. Every name is checked by the one validator,
``pipeline.core.digests.validate_name_prefix`` / ``validate_name``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.core.contracts import IMAGE_ROLES
from pipeline.core.digests import validate_name, validate_name_prefix
from pipeline.core.errors import UsageError, ValidationError

BASES = ("base", "runner-base")
ALL_NAMES = IMAGE_ROLES + BASES
PREFIX_ENV = "BENCHSEAL_IMAGE_PREFIX"
REGISTRY_ENV = "BENCHSEAL_REGISTRY"
LOCAL_REGISTRY = "127.0.0.1:5055"
# The repository path a bare registry (--registry, $BENCHSEAL_REGISTRY) implies.
REGISTRY_NAMESPACE = "benchseal/"


@dataclass(frozen=True)
class ImageNames:
    """The names of every image benchseal builds, from one validated prefix."""

    prefix: str
    origin: str = "--image-prefix"  # the setting it came from, named in errors

    def __post_init__(self) -> None:
        validate_name_prefix(self.prefix, ALL_NAMES, self.origin)

    @classmethod
    def for_registry(cls, registry: str, origin: str = "--registry") -> ImageNames:
        """``HOST:PORT/benchseal/``: the shorthand of a bare registry."""
        if not isinstance(registry, str) or "/" in registry:
            raise ValidationError(origin, "must be a registry host[:port] only (use --image-prefix / "
                                  f"${PREFIX_ENV} to name repositories)", registry)
        validate_name(f"{registry}/{REGISTRY_NAMESPACE}x", origin)
        return cls(f"{registry}/{REGISTRY_NAMESPACE}", origin)

    @property
    def registry(self) -> str:
        return self.prefix.partition("/")[0]

    def name(self, image: str) -> str:
        """``<registry>/<repository>`` of ``image`` (runner, api, base, runner-base)."""
        if image not in ALL_NAMES:
            raise ValidationError("image", f"must be one of {', '.join(ALL_NAMES)}", image)
        return self.prefix + image

    def repository(self, image: str) -> str:
        return self.name(image).partition("/")[2]


def as_names(target: ImageNames | str) -> ImageNames:
    """``target`` as ImageNames: a bare ``host:port`` is the ``--registry`` shorthand."""
    return target if isinstance(target, ImageNames) else ImageNames.for_registry(target)


def resolve_image_names(prefix: str | None = None, registry: str | None = None,
                        environ: Mapping[str, str] | None = None) -> ImageNames:
    """The configured names (see the module docstring for the order); usage errors name the setting."""
    env = os.environ if environ is None else environ
    if prefix is not None and registry is not None:
        raise UsageError("--image-prefix and --registry both name the images' registry: give one "
                         "(--registry HOST:PORT is shorthand for --image-prefix HOST:PORT/benchseal/)")
    if prefix is not None:
        return ImageNames(prefix, "--image-prefix")
    if registry is not None:
        return ImageNames.for_registry(registry, "--registry")
    env_prefix = env.get(PREFIX_ENV)
    env_registry = env.get(REGISTRY_ENV)
    if env_prefix is not None:
        names = ImageNames(env_prefix, PREFIX_ENV)
        # An empty $BENCHSEAL_REGISTRY beside a prefix (an unset Actions variable) names nothing.
        if env_registry and env_registry != names.registry:
            raise ValidationError(PREFIX_ENV, f"names registry {names.registry!r} but ${REGISTRY_ENV} is "
                                  f"{env_registry!r}: unset one of them", env_prefix)
        return names
    if env_registry is not None:
        return ImageNames.for_registry(env_registry, REGISTRY_ENV)
    return ImageNames.for_registry(LOCAL_REGISTRY, "the local default")


def configured_names(environ: Mapping[str, str] | None = None) -> ImageNames | None:
    """The names set in the environment, or None when neither variable is set (no default)."""
    env = os.environ if environ is None else environ
    if env.get(PREFIX_ENV) is None and env.get(REGISTRY_ENV) is None:
        return None
    return resolve_image_names(environ=env)
