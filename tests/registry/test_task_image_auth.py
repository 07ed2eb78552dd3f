"""A task's prebuilt image from a registry that demands credentials (issue 36.2): the worker reads its
manifest and pulls it by digest with the credentials the runner's pull uses (a Docker config as
`docker login` writes it), checks the pulled id against the manifest's config, moves it into the sandbox
by id and points the rendered task at that id. Without the credentials: one line, no secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.core.digests import ImageRef
from pipeline.imaging.oci import sha256_digest
from pipeline.imaging.push import Registry
from pipeline.infra.worker.config import InfraFailure
from pipeline.infra.worker.task_images import config_digest, load_task_images
from tests.fixtures.infra import sandbox_engine
from tests.fixtures.tb_mini import write_tb_mini
from tests.registry.helpers import AuthRegistry, assert_no_secret, push_tiny, tiny_image

pytestmark = pytest.mark.docker


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
