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

from collections.abc import Sequence
from pathlib import Path

from pipeline.core.contracts import DigestsFile
from pipeline.core.digests import parse_ref
from pipeline.core.fsutil import atomic_write_json
from pipeline.imaging.base import ensure_base, ensure_local
from pipeline.imaging.images import BuildResult, build_image, digests_file, load_image_spec, source_info
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
) -> DigestsFile:
    """Build and push ``images`` (roles: runner, api) under their configured names; write ``out`` atomically.

    Bases are built first when the lock or the registry lacks them. The
    digests recorded are the ones the registry confirmed for the exact
    manifest bytes pushed.
    """
    return build_images_with_results(images, target, out, tags, use_cache)[0]


def build_images_with_results(
    images: Sequence[str],
    target: ImageNames | str,
    out: Path | None = None,
    tags: Sequence[str] = (),
    use_cache: bool = True,
) -> tuple[DigestsFile, list[BuildResult]]:
    """``build_images`` plus each image's BuildResult (build/push seconds, bytes uploaded)."""

    roles = list(dict.fromkeys(images)) or ["runner", "api"]
    for role in roles:
        load_image_spec(role)  # validate the role names before any work
    names = as_names(target)
    source = source_info()
    bases = ensure_base(names)
    with build_lock():
        results = [build_image(role, names, bases, source, tags, use_cache=use_cache) for role in roles]
    result = digests_file(source, results)
    for role, entry in result.images.items():
        parse_ref(entry.ref, f"images.{role}.ref")
    if out is not None:
        atomic_write_json(out, result.to_json_dict())
    return result, results
