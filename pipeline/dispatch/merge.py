"""Merge the per-image digests files of a matrix build into one, re-validated."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.contracts import IMAGE_ROLES, DigestsFile, SourceInfo, load_model
from pipeline.core.errors import CheckFailed, UsageError


def merge_digests(paths: Sequence[Path], *, expect_commit: str | None = None) -> DigestsFile:
    if not paths:
        raise UsageError("merge-digests needs at least one digests file")
    images: dict[str, object] = {}
    source: SourceInfo | None = None
    agent: dict[str, object] | None = None  # the runner's file names the release's agent
    project_images: dict[str, object] = {}  # the adopter's own images (built in the api's leg)
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: not a readable JSON digests file ({type(exc).__name__})") from None
        part = load_model(DigestsFile, data, str(path))
        if source is None:
            source = part.source
        elif part.source != source:
            raise CheckFailed(f"{path}: source {part.source.model_dump()} differs from the other digests files")
        for role, entry in part.images.items():
            if role in images:
                raise CheckFailed(f"{path}: image {role!r} appears in more than one digests file")
            images[role] = entry.model_dump(mode="json")
        for name, entry in part.project_images.items():
            if name in project_images:
                raise CheckFailed(f"{path}: project image {name!r} appears in more than one digests file")
            project_images[name] = entry.model_dump(mode="json")
        if part.agent is not None:
            if "runner" not in part.images:
                raise CheckFailed(f"{path}: names an agent but no runner (the agent is the runner's)")
            agent = part.agent.model_dump(mode="json")
    missing = [role for role in IMAGE_ROLES if role not in images]
    if missing:
        raise CheckFailed(f"digests files lack image(s) {', '.join(missing)}")
    if source is None:
        raise UsageError("merge-digests needs at least one digests file")
    merged = load_model(DigestsFile, {"schema": "benchseal.digests/v1", "source": source.model_dump(),
                                      "images": images, "agent": agent, "project_images": project_images},
                        "merged digests")
    if expect_commit is not None and merged.source.commit != expect_commit:
        raise CheckFailed(f"digests were built from {merged.source.commit}, but the tag resolves to {expect_commit}")
    return merged
