"""A batch's missing task images are built in parallel (issue 36.5), on the real sandbox engine.

Shown by the engine, not by timing: each build's RUN step waits for a file only this test writes, and the
test writes it only once the engine has reported every build's RUN container started; builds one after
another would never get there. A failing build fails with its task named, after the builds beside it
finished and were recorded: the next call reuses their ids and builds nothing."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.infra.worker.config import InfraFailure
from pipeline.infra.worker.images import _task_context_hash, prebuild_task_images
from tests.fixtures.infra import (
    base_in_sandbox,
    gated_run_step,
    gated_steps_started,
    open_gates,
    remove_build_chain,
    sandbox_engine,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.needs_root("the sandbox engine is set up by root")]

GATED = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    client = sandbox_engine()
    yield client
    client.close()


@pytest.fixture(scope="module")
def base_id(engine: docker.DockerClient, base_refs: dict[str, Any]) -> str:
    """The project's base, copied into the sandbox by id (as the worker does)."""
    return base_in_sandbox(engine, base_refs)


def _task(suite: Path, task: str, dockerfile: str) -> None:
    env = suite / task / "environment"
    env.mkdir(parents=True)
    (env / "Dockerfile").write_text(dockerfile)
    (suite / task / "task.toml").write_text('version = "1.0"\n\n[environment]\n')


def test_missing_task_images_build_at_once_and_a_failing_build_names_its_task_after_the_others_are_recorded(
        tmp_path: Path, engine: docker.DockerClient, base_id: str) -> None:
    token = uuid.uuid4().hex[:12]  # this test's own: the engine is shared
    suite, records = tmp_path / "suite", tmp_path / "records"

    def gated(task: str) -> str:
        return f"FROM {base_id}\n" + gated_run_step(f"{token}-{task}")

    for task in GATED:
        _task(suite, task, gated(task))
    _task(suite, "delta", gated("alpha"))  # alpha's context exactly: one build for both
    _task(suite, "broken", f"FROM {base_id}\nRUN echo {token}-broken && exit 3\n")
    used: list[str] = []
    outcome: dict[str, Any] = {}

    def build() -> None:
        try:
            outcome["pinned"] = prebuild_task_images(engine, suite, records, concurrency=4, record_use=used.extend)
        except Exception as exc:
            outcome["error"] = exc

    since = int(time.time()) - 1
    worker = threading.Thread(target=build)
    worker.start()
    running: dict[str, str] = {}  # RUN container id -> the task whose build it is
    built: set[str] = set()
    try:
        markers = {f"{token}-{t}": t for t in GATED}
        running = {cid: markers[m] for cid, m in gated_steps_started(engine, since, markers, limit=180).items()}
        # Every gated build's RUN step was running at once, one per distinct context (delta is alpha's).
        assert sorted(running.values()) == sorted(GATED), (running, outcome)
    finally:
        open_gates(engine, running)
        worker.join(timeout=300)
        built = {path.read_text().strip() for path in records.iterdir()} if records.is_dir() else set()
        try:
            assert not worker.is_alive(), "the builds did not end once released"
            error = outcome.get("error")
            assert isinstance(error, InfraFailure), outcome
            line = str(error)
            assert "task broken" in line and "\n" not in line, line
            # The three builds beside it were checked, recorded (the worker's records and the prune's use
            # records) and are in the engine.
            assert {path.name for path in records.iterdir()} == {_task_context_hash(suite / t / "environment")
                                                                 for t in GATED}
            assert sorted(used) == sorted(built) and len(built) == 3
            assert all(engine.images.get(image_id).id == image_id for image_id in built)
            # Each was pinned as its build was checked (its trials may start while the others build):
            # delta on alpha's.
            for task in (*GATED, "delta"):
                text = (suite / task / "task.toml").read_text()
                assert sum(f'docker_image = "{image_id}"' in text for image_id in built) == 1, (task, text)
            assert "docker_image" not in (suite / "broken" / "task.toml").read_text()
            # Rendered again without the broken task, the next call builds nothing: it reuses exactly those
            # ids, delta on alpha's.
            shutil.rmtree(suite / "broken")
            for task in (*GATED, "delta"):
                (suite / task / "task.toml").write_text('version = "1.0"\n\n[environment]\n')
            pinned = prebuild_task_images(engine, suite, records)
            assert set(pinned) == {*GATED, "delta"} and set(pinned.values()) == built
            assert pinned["delta"] == pinned["alpha"]
            assert f'docker_image = "{pinned["gamma"]}"' in (suite / "gamma" / "task.toml").read_text()
        finally:
            for image_id in built:
                remove_build_chain(engine, image_id, base_id)
