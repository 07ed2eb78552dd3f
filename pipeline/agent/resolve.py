"""The release's agent, resolved and checked: the one entry point the build uses.

``resolve_agent`` reads the project file, derives the version from the tag (one rule:
``pipeline.core.project.version_for_tag``), and produces the checked package file:

* npm: waits (bounded by ``publish_wait_seconds``) for ``package@version`` on the npm registry,
  downloads the tarball, checks it against ``dist.integrity`` and its own package.json
  (``pipeline.agent.npm``);
* python: builds the wheel from the release commit (never the work tree) and checks its
  version (``pipeline.agent.wheel``).

Anything that does not match refuses the build before an image is assembled.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from pipeline.agent import npm, wheel
from pipeline.core.errors import ValidationError
from pipeline.core.project import AgentArtifact, NpmAgent, PythonAgent, load_project, version_for_tag
from pipeline.core.waiting import WaitReporter

NPM_REGISTRY_ENV = "BENCHSEAL_NPM_REGISTRY"
NPM_TOKEN_ENV = "BENCHSEAL_NPM_TOKEN"  # noqa: S105 -- a variable name; its value goes into a header, never argv


@dataclass(frozen=True)
class ResolvedAgent:
    """The checked package file of the release's agent and what it is."""

    spec: NpmAgent | PythonAgent
    artifact: AgentArtifact
    file: Path  # the npm tarball or the wheel


def _project_subdir(repo_root: Path, project_file: Path) -> str:
    """The project file's directory relative to the repository (git paths use '/')."""
    try:
        relative = project_file.resolve().parent.relative_to(repo_root.resolve())
    except ValueError:
        raise ValidationError("--project", "must be a file inside the source checkout", str(project_file)) from None
    return relative.as_posix() if relative.parts else "."


def resolve_agent(project_file: Path, *, tag: str, commit: str, repo_root: Path, cache_dir: Path,
                  npm_registry: str | None = None, progress: WaitReporter | None = None) -> ResolvedAgent:
    """Resolve and check the agent ``project_file`` declares, at the version ``tag`` stands for;
    ``progress`` hears what a wait for the npm release waits for."""
    project = load_project(project_file)
    version = version_for_tag(tag)
    spec = project.agent
    cache_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(spec, NpmAgent):
        registry = npm_registry or npm.default_registry()
        tarball = npm.fetch_release(registry, spec.package, version, cache_dir, wait_seconds=spec.publish_wait_seconds,
                                    token=os.environ.get(NPM_TOKEN_ENV) or None, progress=progress)
        artifact = AgentArtifact(name=spec.name, kind="npm", package=spec.package, version=tarball.version,
                                 integrity=tarball.integrity, source_commit=commit)
        return ResolvedAgent(spec=spec, artifact=artifact, file=tarball.path)
    subdir = posixpath.normpath(posixpath.join(_project_subdir(repo_root, project_file), spec.path))
    built = wheel.build_wheel(repo_root, commit, subdir, version, cache_dir)
    artifact = AgentArtifact(name=spec.name, kind="python", package=built.distribution, version=version,
                             integrity=built.integrity, source_commit=commit)
    return ResolvedAgent(spec=spec, artifact=artifact, file=built.path)
