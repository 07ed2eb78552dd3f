"""Build stage: base images, deterministic image assembly, push, digests file.

Public API (used by the release orchestrator and by test fixtures):

* ``ensure_base(names) -> {"base": ImageRef, "runner-base": ImageRef}``
* ``ensure_local(ref)``: pull by digest into the engine, check RepoDigests
* ``build_images(images, names, out=None, tags=()) -> DigestsFile``

``names``: ``pipeline.imaging.names.ImageNames`` (the configured image prefix), or a bare
``host:port`` meaning ``host:port/benchseal/<image>``.
* ``build_images_with_results(...) -> (DigestsFile, [BuildResult])``: the same, with per-image timings
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.agent.resolve import NPM_REGISTRY_ENV, resolve_agent
from pipeline.core import paths
from pipeline.core.contracts import DigestsFile
from pipeline.core.digests import parse_ref
from pipeline.core.errors import UsageError
from pipeline.core.fsutil import atomic_write_json
from pipeline.core.project import load_project
from pipeline.core.waiting import WaitReporter
from pipeline.imaging.base import ensure_base, ensure_local
from pipeline.imaging.images import (
    BuildResult,
    build_image,
    digests_file,
    load_image_spec,
    prefetch_wheels,
    source_checkout,
    source_date_epoch,
    source_info,
)
from pipeline.imaging.layers import build_lock
from pipeline.imaging.names import ImageNames, as_names, resolve_image_names

__all__ = ["ImageNames", "as_names", "build_images", "build_images_with_results", "ensure_base", "ensure_local",
           "resolve_image_names"]


def build_images(
    images: Sequence[str],
    target: ImageNames | str,
    out: Path | None = None,
    tags: Sequence[str] = (),
    use_cache: bool = True,
    project: Path | None = None,
    release_tag: str | None = None,
    progress: WaitReporter | None = None,
) -> DigestsFile:
    """Build and push ``images`` (roles: runner, api) under their configured names; write ``out`` atomically.

    Bases are built first when the lock or the registry lacks them. The
    digests recorded are the ones the registry confirmed for the exact
    manifest bytes pushed.
    """
    return build_images_with_results(images, target, out, tags, use_cache, project, release_tag,
                                     progress=progress)[0]


def build_images_with_results(
    images: Sequence[str],
    target: ImageNames | str,
    out: Path | None = None,
    tags: Sequence[str] = (),
    use_cache: bool = True,
    project: Path | None = None,
    release_tag: str | None = None,
    npm_registry: str | None = None,
    progress: WaitReporter | None = None,
) -> tuple[DigestsFile, list[BuildResult]]:
    """``build_images`` plus each image's BuildResult (build/push seconds, bytes uploaded).

    ``project``: the source repository's project file (``benchseal.toml``): its agent, at the version
    ``release_tag`` (default: the checkout's tag) stands for, is resolved and checked first
    (``pipeline.agent.resolve``), then baked into the runner and named in the digests file. ``progress``
    hears what a wait for the agent's npm release waits for (``pipeline.core.waiting``).
    """

    roles = list(dict.fromkeys(images)) or ["runner", "api"]
    for role in roles:
        load_image_spec(role)  # validate the role names before any work
    names = as_names(target)
    # The source repository is the checkout holding the project file (an adopter's own repository,
    # checked out beside benchseal's); without one, benchseal's own checkout.
    if project is not None:
        load_project(project)  # a bad project file is the first thing said, before anything else is looked at
    checkout = None if project is None else source_checkout(project)
    source = source_info(checkout)
    epoch = source_date_epoch(source.commit, root=checkout)
    agent = None
    if project is not None and "runner" in roles:  # only the runner carries the agent
        tag = release_tag or (source.ref.removeprefix("refs/tags/") if source.ref.startswith("refs/tags/") else None)
        if tag is None:
            raise UsageError("--project: the agent's version comes from the release tag: pass --release-tag "
                             "(the checkout is not at a tag)")
        agent = resolve_agent(project, tag=tag, commit=source.commit, repo_root=checkout or paths.REPO_ROOT,
                              cache_dir=paths.state_dir("cache", "agents"),
                              npm_registry=npm_registry or os.environ.get(NPM_REGISTRY_ENV) or None,
                              progress=progress)
    # The wheel downloads (network) run while the bases are made (mmdebstrap); then the images are
    # assembled side by side (the runner's bytecode and gzip beside the api's layers).
    with ThreadPoolExecutor(max_workers=max(2, len(roles)), thread_name_prefix="build") as pool:
        prefetched = pool.submit(prefetch_wheels, roles)
        bases = ensure_base(names)
        prefetched.result()
        with build_lock():
            futures = [pool.submit(build_image, role, names, bases, source, tags, use_cache=use_cache, epoch=epoch,
                                   agent=agent) for role in roles]
            results = [future.result() for future in futures]
    result = digests_file(source, results, agent if "runner" in roles else None)
    for role, entry in result.images.items():
        parse_ref(entry.ref, f"images.{role}.ref")
    if out is not None:
        atomic_write_json(out, result.to_json_dict())
    return result, results
