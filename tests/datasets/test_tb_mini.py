"""A second dataset in Harbor's format (issue 36.3), Terminal-Bench style: two tasks that name a prebuilt
image by digest (tests/datasets/data/tb-mini). The image is built here from the tasks' own
environment/Dockerfile on benchseal's base, pushed to the local registry and removed from the engine;
the worker stages the dataset by its content digest, pulls the image by that digest, checks it, moves
it into the sandbox by id and runs the oracle on it through a real runner: 1.0, each trial recording
the image it ran on. The tasks' data file exists only in that image. The same dataset naming the image
by tag is refused when its run is planned: FAILED, nothing planned or run."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.imaging.base import ensure_local
from pipeline.infra.worker.prune import use_records
from pipeline.infra.worker.task_images import config_digest
from tests.fixtures.datasets import oracle_runs
from tests.fixtures.infra import remove_from_both_engines
from tests.fixtures.tb_mini import TASKS, TEMPLATE, write_tb_mini

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _push_task_image(registry: str, base: ImageRef) -> ImageRef:
    """The tasks' image, built from their Dockerfile on the base, pushed, and then removed from the engine so
    the worker has to pull it by digest."""
    ensure_local(base)
    client = docker.from_env(timeout=600)
    repository, tag = f"{registry}/benchseal-tests/tb-mini", f"t{uuid.uuid4().hex[:12]}"
    try:
        image, _ = client.images.build(path=str(TEMPLATE / "count-lines" / "environment"), buildargs={"BASE": base.ref},
                                       tag=f"{repository}:{tag}", rm=True, pull=False,
                                       labels={"benchseal-tests.run": tag})  # an id of this run's alone
        for chunk in client.api.push(repository, tag=tag, stream=True, decode=True):
            assert "error" not in chunk, chunk
        image.reload()
        pushed = [d for d in image.attrs.get("RepoDigests") or [] if d.partition("@")[0] == repository]
        assert len(pushed) == 1, image.attrs.get("RepoDigests")
        client.images.remove(image.id, force=True)
    finally:
        client.close()
    return parse_ref(pushed[0], "pushed task image")


def test_a_terminal_bench_style_dataset_runs_on_its_images_pulled_by_digest(
        tmp_path: Path, built_images: DigestsFile, sign_release_images: Any, base_refs: dict[str, ImageRef],
        image_registry: str, request: pytest.FixtureRequest) -> None:
    image = _push_task_image(image_registry, base_refs["base"])
    request.addfinalizer(lambda: remove_from_both_engines(config_digest(image)))
    suites = tmp_path / "suites"
    write_tb_mini(suites / "tb", image.ref)
    write_tb_mini(suites / "tagged", f"{image.name}:latest")  # the same image by tag: refused before anything runs
    policy, _, run = oracle_runs(tmp_path, built_images, sign_release_images, suites, ("tb", "tagged"),
                                 image.registry, "tb-mini", trial_concurrency=2)
    refused = run("tagged")
    assert refused is not None and refused.state == "FAILED" and refused.grading is not None
    assert refused.grading.counts.total == 0 and refused.grading.trials == ()  # nothing planned, nothing run
    assert "task count-lines: task.toml [environment] docker_image" in str(refused.reason)
    assert "tags are not accepted" in str(refused.reason) and "\n" not in str(refused.reason)
    outcome = run("tb")
    assert outcome is not None
    assert outcome.state == "SUCCEEDED", outcome.reason
    grading = outcome.grading
    assert grading is not None and grading.score == 1.0 and grading.counts.resolved == len(TASKS)
    assert grading.dataset_digest == policy.suites["tb"].dataset.digest
    assert sorted(t.task for t in grading.trials) == list(TASKS)
    assert {t.task_image for t in grading.trials} == {image.ref}  # the evidence names the image by digest
    # The host engine did not have the image before the worker pulled it: the worker's own copy, which its prune
    # may remove there once no run in flight names it (pipeline.infra.worker.prune).
    pulls = json.loads((use_records() / ".host").read_text())
    assert pulls[config_digest(image)] == {"present_before": False, "refs": [image.ref]}
