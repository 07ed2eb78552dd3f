"""A task built from its environment/Dockerfile on a registry base pinned by digest (issue 36.2): tb-mini's
count-lines without its prebuilt image, its Dockerfile saying ``FROM <local registry>/...@sha256:``. The base
is made here (benchseal's base plus a unique label), pushed and removed from the engine; the worker pulls it
by digest, checks it, moves it into the sandbox by id, builds the task image FROM that id without a network,
and runs the oracle through a real runner: 1.0 (the data file exists only in the built image). The same task
naming its base by tag is refused when its run is planned: FAILED, nothing run. Once the run is sealed its
staged copies are gone and its record names both images (pipeline.infra.worker.prune)."""

from __future__ import annotations

import io
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.imaging.base import ensure_local
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.worker.prune import use_records
from pipeline.infra.worker.task_images import config_digest
from tests.fixtures.datasets import oracle_runs
from tests.fixtures.infra import remove_build_chain, remove_from_both_engines, sandbox_engine
from tests.fixtures.tb_mini import TEMPLATE

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TASK = "count-lines"


def _push_base(registry: str, base: ImageRef) -> ImageRef:
    """A registry base of this test's own (a unique label: an id no other test has), pushed by digest and
    removed from the engine so the worker has to pull it."""
    ensure_local(base)
    client = docker.from_env(timeout=600)
    repository, tag = f"{registry}/benchseal-tests/task-base", f"t{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {base.ref}\nLABEL benchseal-tests.base={tag}\n".encode()
    try:
        image, _ = client.images.build(fileobj=io.BytesIO(dockerfile), tag=f"{repository}:{tag}", rm=True, pull=False)
        for chunk in client.api.push(repository, tag=tag, stream=True, decode=True):
            assert "error" not in chunk, chunk
        image.reload()
        pushed = [d for d in image.attrs.get("RepoDigests") or [] if d.partition("@")[0] == repository]
        assert len(pushed) == 1, image.attrs.get("RepoDigests")
        client.images.remove(image.id, force=True)
    finally:
        client.close()
    return parse_ref(pushed[0], "pushed task base")


def _write_suite(target: Path, base: str) -> None:
    """count-lines built from its Dockerfile on ``base`` (its prebuilt image line removed)."""
    shutil.copytree(TEMPLATE / TASK, target / TASK)
    toml = target / TASK / "task.toml"
    toml.write_text("".join(line for line in toml.read_text().splitlines(keepends=True)
                            if not line.startswith("docker_image")))
    (target / TASK / "environment" / "Dockerfile").write_text(
        f"FROM {base}\nWORKDIR /app\nCOPY data.txt /app/data.txt\nSTOPSIGNAL SIGKILL\n")


def _remove(base_id: str, built: list[str]) -> None:
    """The engines as the test found them: the built task image and its build steps, then the base (host and
    sandbox). Only ids this test made."""
    sandboxed = sandbox_engine()
    try:
        for image_id in built:
            remove_build_chain(sandboxed, image_id, base_id)
    finally:
        sandboxed.close()
    remove_from_both_engines(base_id)


def test_a_task_builds_on_its_registry_base_pulled_by_digest(
        tmp_path: Path, built_images: DigestsFile, sign_release_images: Any, base_refs: dict[str, ImageRef],
        image_registry: str, request: pytest.FixtureRequest) -> None:
    base = _push_base(image_registry, base_refs["base"])
    base_id = config_digest(base)
    built: list[str] = []
    request.addfinalizer(lambda: _remove(base_id, built))
    suites = tmp_path / "suites"
    _write_suite(suites / "based", base.ref)
    _write_suite(suites / "tagged", f"{base.name}:latest")  # the same base by tag: refused before anything runs
    _, db, run = oracle_runs(tmp_path, built_images, sign_release_images, suites, ("based", "tagged"),
                             base.registry, "task-base")
    refused = run("tagged")
    assert refused is not None and refused.state == "FAILED" and refused.grading is not None
    assert refused.grading.counts.total == 0 and refused.grading.trials == ()  # nothing planned, nothing run
    assert f"task {TASK}: environment/Dockerfile FROM" in str(refused.reason)
    assert "tags are not accepted" in str(refused.reason) and "\n" not in str(refused.reason)

    outcome = run("based")
    record = use_records() / outcome.run_id if outcome is not None else None
    used = json.loads(record.read_text()) if record is not None and record.is_file() else {}
    built.extend(i for i in used if i != base_id)
    assert outcome is not None and outcome.state == "SUCCEEDED", outcome and outcome.reason
    assert outcome.grading is not None and outcome.grading.score == 1.0 and outcome.grading.counts.resolved == 1
    # The run's record names the base it pulled and the image built on it; that image's parent chain ends at
    # the base's id (the FROM was rendered as that id), and the build's records hold it like any task image's.
    assert base_id in used and len(built) == 1
    sandboxed = sandbox_engine()
    try:
        parent = built[0]
        while parent and parent != base_id:
            parent = sandboxed.api.inspect_image(parent).get("Parent") or ""
        assert parent == base_id
    finally:
        sandboxed.close()
    records = use_records().parent / "task-images"
    assert any(p.read_text().strip() == built[0] for p in records.iterdir() if p.is_file())
    with SqliteQueue(db) as queue:
        run_dir = queue.run_dir(outcome.run_id)
    assert not (run_dir / "dataset").exists() and list(run_dir.glob("batches/*/suite")) == []  # sealed: staged copies gone
