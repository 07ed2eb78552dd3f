"""The local world's npm registry for a release's npm agent (``make demo AGENT=qwen-code``).

Production resolves the agent on the registry npm is configured with (or ``$BENCHSEAL_NPM_REGISTRY``).
Locally the same resolver (``pipeline.agent.npm``) reads a real npm registry server on 127.0.0.1
(verdaccio, ``pipeline.local.npmregistry``), into which the release's tarball is published from
the cache ``make setup`` fills (``npm pack`` of the version the demo releases): the registry then
serves it with its ``dist.integrity``, which the build checks like any other.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.agent.npm import check_registry, tarball_name, version_published
from pipeline.agent.resolve import NPM_REGISTRY_ENV, NPM_TOKEN_ENV
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError
from pipeline.core.paths import home, state_dir
from pipeline.core.project import NpmAgent, ProjectFile, load_project, version_for_tag
from pipeline.local.npmregistry import has_version, publish_to, running, start_background


def npm_cache() -> Path:
    """Where ``make setup`` puts the npm tarballs the demo releases."""
    return state_dir("cache", "npm")


def local_npm_registry(project_file: Path, tag: str) -> str | None:
    """The registry the release resolves the project's npm agent on: ``$BENCHSEAL_NPM_REGISTRY`` when set
    (taken as it is), else the local one, holding the agent at the tag's version. None for other kinds."""
    agent = load_project(project_file).agent
    if not isinstance(agent, NpmAgent):
        return None
    configured = os.environ.get(NPM_REGISTRY_ENV)
    if configured:
        return configured
    version = version_for_tag(tag)
    url = str(start_background(state_dir("npm-registry"))["url"])
    if not has_version(url, agent.package, version):
        tarball = npm_cache() / tarball_name(agent.package, version)
        if not tarball.is_file():
            raise UsageError(f"{agent.package}@{version} is not in the local npm registry and {tarball} is missing "
                             "(make setup fetches the demo's release with npm pack)")
        publish_to(url, tarball)
    return url


def check_npm_resolvable(project_file: ProjectFile, tag: str) -> None:
    """Before the build: the project's npm agent is on the registry the release will resolve it on, at the tag's
    version (one line, exit 2). A rehearsal does not wait for a publish (production's build does, saying so):
    on a configured registry the version must be there; on the local one, there or in the cache it is published
    from."""
    agent = project_file.agent
    if not isinstance(agent, NpmAgent):
        return
    version = version_for_tag(tag)
    configured = os.environ.get(NPM_REGISTRY_ENV)
    if configured:
        # Read as the build reads it: the same URL rules, the same token, the same packument check.
        try:
            found = version_published(check_registry(configured), agent.package, version,
                                      os.environ.get(NPM_TOKEN_ENV) or None)
        except (CheckFailed, InfrastructureError) as exc:
            raise UsageError(f"{exc} (${NPM_REGISTRY_ENV}; a private registry's read token: ${NPM_TOKEN_ENV})") from None
        if not found:
            raise UsageError(f"npm: {agent.package}@{version} is not published on {configured} (${NPM_REGISTRY_ENV}): "
                             "publish it (npm publish), then release again; release --local does not wait for it")
        return
    local = running(home() / "npm-registry")
    if local is not None and has_version(str(local["url"]), agent.package, version):
        return
    tarball = npm_cache() / tarball_name(agent.package, version)
    if not tarball.is_file():
        raise UsageError(f"npm: {agent.package}@{version} is not in the local npm registry and {tarball} is missing: "
                         f"set ${NPM_REGISTRY_ENV} to the registry you published it on (make setup fetches the "
                         "demo's release only)")
