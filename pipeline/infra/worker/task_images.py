"""Task images by digest (issue 36.2): a task's prebuilt ``[environment] docker_image``.

A task in Harbor's format may name a prebuilt image instead of building ``environment/Dockerfile``.
benchseal runs such a task only when that image is pinned and admitted:

* ``pipeline.core.datasets.task_images``: the field must be ``<registry>/<repository>@sha256:<64 hex>``
  (``pipeline.core.digests.parse_ref``, the one grammar); a tag, an implied registry or anything else is
  refused in one line naming the task and the field.
* ``check_task_images``: the image's registry must be one the suite's
  ``task_image_registries`` admits (``InfraPolicy.check_task_image``).

Both run on the staged, re-hashed dataset (``pipeline.infra.worker.dataset.stage_dataset``: at worker
start for every suite, when a run is planned and before every batch), the earliest point where the
task files the digest covers are at hand: the policy names a dataset by digest, not its files, and
``infra accept`` has no dataset to read.

* ``load_task_images``: for a batch, each image is pulled BY DIGEST on the host engine with the
  registry credentials of the runner's pull (``images.pull_by_digest``: RepoDigests must list exactly
  that reference), its id is checked against the config digest of the manifest that digest names
  (fetched and re-hashed here), and it is moved into the sandbox engine by id (``images.sandbox_image``,
  as the runner is). The rendered task.toml then names the image by that id, so the trial runs on
  exactly those bytes and nothing is ever pulled inside the sandbox. Given the batch's ``TaskImageUse``,
  each host pull is recorded first (whether the host engine already had the image), so the prune can
  remove the host engine's copies the worker made, and only those (``pipeline.infra.worker.prune``).

A task built from ``environment/Dockerfile`` may build FROM a registry image pinned the same way
(``pipeline.core.datasets.task_bases``; its registry admitted by ``check_task_bases``): ``load_task_bases``
brings each such base into the sandbox through the same pull-and-check, and the rendered Dockerfile's
FROM names it by that id (``pipeline.infra.worker.images.render_suite``).
"""

from __future__ import annotations

import hashlib
import json
import platform
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.datasets import task_base_field, task_bases, task_image_field, task_images
from pipeline.core.digests import ImageRef, validate_digest
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.registry_auth import AuthSession, registry_url, scope
from pipeline.infra.intake.policy import InfraPolicy
from pipeline.infra.worker.config import ImageRefused, InfraFailure
from pipeline.infra.worker.images import local_id, pull_by_digest, sandbox_image
from pipeline.infra.worker.prune import TaskImageUse

_MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                   "application/vnd.docker.distribution.manifest.v2+json")
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_MAX_MANIFEST = 4 << 20
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class LoadedTaskImage:
    """A task's image as a batch ran it: the reference the task pinned and the id it has in the sandbox."""

    ref: ImageRef
    image_id: str


def check_task_images(policy: InfraPolicy, suite: str, dataset: Path,
                      tasks: Iterable[str] | None = None) -> dict[str, ImageRef]:
    """``pipeline.core.datasets.task_images``, each from a registry the suite admits (ValidationError otherwise)."""
    found = task_images(dataset, tasks)
    for task, ref in found.items():
        policy.check_task_image(suite, task, ref, task_image_field(task))
    return found


def check_task_bases(policy: InfraPolicy, suite: str, dataset: Path,
                     tasks: Iterable[str] | None = None) -> dict[str, tuple[ImageRef, ...]]:
    """``pipeline.core.datasets.task_bases``, each from a registry the suite admits (ValidationError otherwise)."""
    found = task_bases(dataset, tasks)
    for task, refs in found.items():
        for ref in refs:
            policy.check_task_image(suite, task, ref, task_base_field(task))
    return found


def _load_checked(host: Any, sandboxed: Any, task: str, ref: ImageRef, use: TaskImageUse | None) -> str:
    """``ref`` pulled by digest, its id checked against its manifest's config, moved into the sandbox: its id.
    With ``use`` (a batch's), the host engine's copy is recorded first, so a prune may later remove it
    (``prune.TaskImageUse.host_pull``: never an image the host engine had before)."""
    try:
        expected = config_digest(ref, host)
        if use is not None:
            use.host_pull(host, expected, ref.ref)
        image_id = sandbox_image(host, sandboxed, ref)
    except InfraFailure as exc:  # the registry lacks the digest, or cannot be reached: retried
        raise InfraFailure(f"task {task}: {exc}") from None
    if image_id != expected:
        raise ImageRefused(f"task {task}: image {ref.ref} loaded as {image_id}, but its manifest names the "
                           f"config {expected}")
    return image_id


def pull_recorded(host: Any, ref: ImageRef, use: TaskImageUse) -> str:
    """``ref`` pulled by digest on the host engine (its id checked against its manifest's config), named in the
    run's record before the pull, as is whether the host engine had it before (``TaskImageUse.host_pull``: an
    image it had is never pruned there). An image the engine holds under ``ref`` is used as it is, with no
    registry round trip (as ``pull_by_digest`` does). Returns the id."""
    expected = local_id(host, ref) or config_digest(ref, host)
    use.host_pull(host, expected, ref.ref)
    use.images([expected])
    image_id = pull_by_digest(host, ref)
    if image_id != expected:
        raise ImageRefused(f"image {ref.ref} pulled as {image_id}, but its manifest names the config {expected}")
    return image_id


def load_task_bases(host: Any, sandboxed: Any, refs: dict[str, tuple[ImageRef, ...]],
                    use: TaskImageUse | None = None) -> dict[str, str]:
    """Each task's registry base (``check_task_bases``) in the sandbox by id: {name@sha256: image id}."""
    ids: dict[str, str] = {}
    for task, bases in sorted(refs.items()):
        for ref in bases:
            if ref.ref not in ids:
                ids[ref.ref] = _load_checked(host, sandboxed, task, ref, use)
    return ids


def load_task_images(host: Any, sandboxed: Any, suite_dir: Path, refs: dict[str, ImageRef],
                     use: TaskImageUse | None = None) -> dict[str, LoadedTaskImage]:
    """Pull each image by digest, check its id against its manifest, move it into the sandbox by id and
    point the rendered task.toml (in ``suite_dir``) at that id. Returns {task: loaded image}."""
    ids: dict[ImageRef, str] = {}
    loaded: dict[str, LoadedTaskImage] = {}
    for task, ref in sorted(refs.items()):
        if ref not in ids:
            ids[ref] = _load_checked(host, sandboxed, task, ref, use)
        set_docker_image(suite_dir / task / "task.toml", ids[ref])
        loaded[task] = LoadedTaskImage(ref=ref, image_id=ids[ref])
    return loaded


def config_digest(ref: ImageRef, host: Any | None = None) -> str:
    """The config digest (= the image id an engine gives it) of the image manifest ``ref`` names, read from
    its registry with the worker's credentials and re-hashed; for an index, the entry of this host's platform."""
    session = AuthSession(ref.registry)
    manifest = _manifest(session, ref, ref.digest)
    if manifest.get("mediaType") in _INDEX_TYPES or "manifests" in manifest:
        machine = (host.info().get("Architecture") if host is not None else None) or platform.machine()
        arch = _ARCH.get(str(machine), str(machine))
        entries = [m for m in manifest.get("manifests") or [] if isinstance(m, dict)
                   and (m.get("platform") or {}).get("os") == "linux"
                   and (m.get("platform") or {}).get("architecture") == arch]
        if len(entries) != 1:
            raise ImageRefused(f"image {ref.ref} is an index with {len(entries)} linux/{arch} manifests, not one")
        manifest = _manifest(session, ref, validate_digest(entries[0].get("digest"), f"{ref.ref} index entry"))
    config = manifest.get("config")
    if not isinstance(config, dict):
        raise ImageRefused(f"image {ref.ref}: its manifest has no config")
    try:
        return validate_digest(config.get("digest"), f"{ref.ref} manifest config.digest")
    except ValidationError as exc:
        raise ImageRefused(str(exc)) from None


def _manifest(session: AuthSession, ref: ImageRef, digest: str) -> dict[str, Any]:
    url = f"{registry_url(ref.registry)}/v2/{ref.repository}/manifests/{digest}"
    try:
        response = session.request("GET", url, [scope(ref.repository)],
                                   headers={"Accept": ", ".join(_MANIFEST_TYPES + _INDEX_TYPES)})
    except (InfrastructureError, CheckFailed) as exc:
        raise InfraFailure(f"fetching the manifest of {ref.name}@{digest} failed: {exc}") from None
    if response.status_code == 404:
        raise InfraFailure(f"registry {ref.registry} has no manifest {digest} for {ref.repository}")
    if response.status_code != 200:
        raise InfraFailure(f"fetching the manifest of {ref.name}@{digest}: HTTP {response.status_code}")
    body = response.content
    if len(body) > _MAX_MANIFEST:
        raise ImageRefused(f"manifest {ref.name}@{digest} is larger than {_MAX_MANIFEST} bytes")
    actual = "sha256:" + hashlib.sha256(body).hexdigest()
    if actual != digest:
        raise ImageRefused(f"the manifest the registry served for {ref.name}@{digest} hashes to {actual}")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise ImageRefused(f"manifest {ref.name}@{digest} is not JSON") from None
    if not isinstance(parsed, dict):
        raise ImageRefused(f"manifest {ref.name}@{digest} is not a JSON object")
    return parsed


def set_docker_image(task_toml: Path, image_id: str) -> None:
    """Replace ``[environment] docker_image`` in a rendered task.toml by ``image_id`` (the suite's staged file
    is never touched); exactly one such line, checked by reading the result back."""
    lines = task_toml.read_text(encoding="utf-8").splitlines(keepends=True)
    section = None
    hits = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        elif section == "[environment]" and stripped.split("=", 1)[0].strip() == "docker_image":
            hits.append(i)
    if len(hits) != 1:
        raise CheckFailed(f"{task_toml}: expected one [environment] docker_image line, found {len(hits)}")
    lines[hits[0]] = f'docker_image = "{image_id}"\n'
    text = "".join(lines)
    if tomllib.loads(text).get("environment", {}).get("docker_image") != image_id:
        raise CheckFailed(f"{task_toml}: could not point docker_image at {image_id}")
    task_toml.write_text(text, encoding="utf-8")
