"""Build stage: base images, deterministic image assembly, push, digests file.

Public API (used by the release orchestrator and by test fixtures):

* ``ensure_base(registry) -> {"base": ImageRef, "runner-base": ImageRef}``
* ``ensure_local(ref)``: pull by digest into the engine, check RepoDigests
* ``build_images(images, registry, out=None, tags=()) -> DigestsFile``
* ``build_images_with_results(...) -> (DigestsFile, [BuildResult])``: the same, with per-image timings
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.build.base import ensure_base, ensure_local
from pipeline.contracts import DigestsFile
from pipeline.digests import parse_ref

if TYPE_CHECKING:
    from pipeline.build.images import BuildResult

__all__ = ["build_images", "build_images_with_results", "ensure_base", "ensure_local"]


def build_images(
    images: Sequence[str],
    registry: str,
    out: Path | None = None,
    tags: Sequence[str] = (),
    use_cache: bool = True,
) -> DigestsFile:
    """Build and push ``images`` (roles: runner, api) to ``registry``; write ``out`` atomically.

    Bases are built first when the lock or the registry lacks them. The
    digests recorded are the ones the registry confirmed for the exact
    manifest bytes pushed.
    """
    return build_images_with_results(images, registry, out, tags, use_cache)[0]


def build_images_with_results(
    images: Sequence[str],
    registry: str,
    out: Path | None = None,
    tags: Sequence[str] = (),
    use_cache: bool = True,
) -> tuple[DigestsFile, list[BuildResult]]:
    """``build_images`` plus each image's BuildResult (build/push seconds, bytes uploaded)."""
    from pipeline.build.images import build_image, digests_file, load_image_spec, source_info
    from pipeline.build.layers import build_lock
    from pipeline.fsutil import atomic_write_json

    roles = list(dict.fromkeys(images)) or ["runner", "api"]
    for role in roles:
        load_image_spec(role)  # validate the role names before any work
    source = source_info()
    bases = ensure_base(registry)
    with build_lock():
        results = [build_image(role, registry, bases, source, tags, use_cache=use_cache) for role in roles]
    result = digests_file(source, results)
    for role, entry in result.images.items():
        parse_ref(entry.ref, f"images.{role}.ref")
    if out is not None:
        atomic_write_json(out, result.to_json_dict())
    return result, results
