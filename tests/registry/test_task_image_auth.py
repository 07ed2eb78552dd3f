"""A task's prebuilt image from a registry that demands credentials (issue 36.2): the worker reads its
manifest and pulls it by digest with the credentials the runner's pull uses (a Docker config as
`docker login` writes it), checks the pulled id against the manifest's config, moves it into the sandbox
by id and points the rendered task at that id. Without the credentials: one line, no secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.core.digests import ImageRef
from pipeline.imaging.oci import MANIFEST_TYPE, sha256_digest
from pipeline.imaging.push import Registry
from pipeline.infra.worker.config import ImageRefused, InfraFailure
from pipeline.infra.worker.task_images import config_digest, load_task_images
from tests.fixtures.infra import sandbox_engine
from tests.fixtures.tb_mini import write_tb_mini
from tests.registry.helpers import AuthRegistry, assert_no_secret, push_tiny, tiny_image

pytestmark = pytest.mark.docker
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


def test_a_task_image_is_pulled_with_registry_credentials_and_checked(
        tmp_path: Path, htpasswd_registry: AuthRegistry, docker_login: Any) -> None:
    docker_login(htpasswd_registry.address, "alice", htpasswd_registry.users["alice"])
    image = tiny_image()
    ref = ImageRef(f"{htpasswd_registry.address}/tasks/tb", push_tiny(Registry(htpasswd_registry.address),
                                                                       "tasks/tb", image))
    suite = write_tb_mini(tmp_path / "suite", ref.ref)
    host, sandboxed = docker.from_env(timeout=120), sandbox_engine()
    try:
        loaded = load_task_images(host, sandboxed, suite, {"count-lines": ref, "reverse-lines": ref})
        image_id = sha256_digest(image.config)  # what the manifest names: the id the image must load as
        assert {t: (x.ref, x.image_id) for t, x in loaded.items()} == {
            "count-lines": (ref, image_id), "reverse-lines": (ref, image_id)}
        assert sandboxed.images.get(image_id).id == image_id
        assert f'docker_image = "{image_id}"' in (suite / "count-lines" / "task.toml").read_text()
        # Wrong credentials: the manifest cannot be read; one line naming the task, and no secret.
        docker_login(htpasswd_registry.address, "alice", "wrong-" + htpasswd_registry.users["alice"])
        with pytest.raises(InfraFailure) as info:
            config_digest(ref)
        with pytest.raises(InfraFailure) as in_batch:
            load_task_images(host, sandboxed, suite, {"count-lines": ref})
        for line in (str(info.value), str(in_batch.value)):
            assert "\n" not in line and ref.name in line, line
            assert_no_secret(line, htpasswd_registry)
        assert str(in_batch.value).startswith("task count-lines: ")
    finally:
        for engine in (host, sandboxed):
            try:
                engine.images.remove(sha256_digest(image.config), force=True)
            except docker.errors.ImageNotFound:
                pass
            engine.close()


def _index(entries: list[tuple[bytes, str]]) -> bytes:
    """An OCI index of (manifest, architecture) entries, all linux."""
    return json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [
        {"mediaType": MANIFEST_TYPE, "digest": sha256_digest(manifest), "size": len(manifest),
         "platform": {"os": "linux", "architecture": arch}} for manifest, arch in entries]}).encode()


def test_a_task_image_by_index_digest_loads_the_hosts_platform_and_an_ambiguous_index_is_refused(
        tmp_path: Path, image_registry: str) -> None:
    """A multi-platform image pinned by its index digest: the engine pulls the host's entry and the worker
    requires exactly that entry's config as the id; an index with no entry or two entries for the host is refused."""
    client = Registry(image_registry)
    repository = "benchseal-tests/tb-index"
    own, other = tiny_image(), tiny_image()
    for image in (own, other):
        push_tiny(client, repository, image)
    refs = {}
    for name, entries in {"one": [(other.manifest, "arm64"), (own.manifest, "amd64")],
                          "none": [(other.manifest, "arm64")],
                          "two": [(own.manifest, "amd64"), (other.manifest, "amd64")]}.items():
        body = _index(entries)
        refs[name] = ImageRef(f"{image_registry}/{repository}", client.put_manifest(repository, sha256_digest(body),
                                                                                  body, INDEX_TYPE))
    assert config_digest(refs["one"]) == sha256_digest(own.config)
    for name, count in (("none", 0), ("two", 2)):
        with pytest.raises(ImageRefused, match=f"is an index with {count} linux/amd64 manifests, not one"):
            config_digest(refs[name])
    suite = write_tb_mini(tmp_path / "suite", refs["one"].ref)
    host, sandboxed = docker.from_env(timeout=120), sandbox_engine()
    try:
        loaded = load_task_images(host, sandboxed, suite, {"count-lines": refs["one"]})
        assert loaded["count-lines"].image_id == sha256_digest(own.config)
    finally:
        for engine in (host, sandboxed):
            try:
                engine.images.remove(sha256_digest(own.config), force=True)
            except docker.errors.ImageNotFound:
                pass
            engine.close()
