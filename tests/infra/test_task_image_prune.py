"""Pruning (issue 36.5): a sealed run's staged copies go, and task images are pruned by the documented rule
(pipeline.infra.worker.prune): kept while the record of a run not sealed in the queue names them, the most
recently used of the rest kept up to a count, the others removed by id. Never an image of a run in flight,
never an image found by name or label, never the base a task image was built FROM.

The images are made here, each unique (an imported one-file tar), in the real sandbox engine, and removed
again; the prune only ever sees the records this test writes, so no other image of the shared engine is at
stake. The queue is SQLite."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading
from pipeline.core.errors import CheckFailed
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.worker.images import TASK_IMAGE_LABEL
from pipeline.infra.worker.prune import note_staged, prune_task_images, remove_staged, task_image_use
from tests.fixtures.infra import sandbox_engine

Image = Callable[..., str]


@pytest.fixture
def engine() -> Iterator[Any]:
    client = sandbox_engine()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def image(engine: Any) -> Iterator[Image]:
    """Makes a unique image in the sandbox engine (optionally labelled and tagged as a task image would be);
    every image made is removed at the end, whatever the test did."""
    made: list[str] = []

    def make(*, label: bool = False, tag: str | None = None) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = uuid.uuid4().hex.encode()
            info = tarfile.TarInfo("marker")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        changes = [f"LABEL {TASK_IMAGE_LABEL}={'0' * 64}"] if label else None
        answer = engine.api.import_image_from_data(buf.getvalue(), changes=changes)
        image_id = str(json.loads(answer.strip().splitlines()[-1])["status"])
        made.append(image_id)
        if tag:
            engine.api.tag(image_id, tag)
        return image_id

    yield make
    for image_id in reversed(made):
        try:
            engine.images.remove(image_id, force=True)
        except docker.errors.ImageNotFound:
            pass


def present(engine: Any, image_id: str) -> bool:
    try:
        return bool(engine.images.get(image_id).id == image_id)
    except docker.errors.ImageNotFound:
        return False


def _run(queue: SqliteQueue, make_payload: Callable[..., dict[str, Any]], state: str) -> str:
    """A run in ``state``: QUEUED, RUNNING (claimed and started) or SUCCEEDED (sealed)."""
    payload = DispatchPayload.model_validate(make_payload(correlation_id=f"prune-{uuid.uuid4().hex[:12]}"))
    run_id, _ = queue.enqueue(payload, max_attempts=1)
    if state == "QUEUED":
        return run_id
    claim = queue.claim("w", 600)
    assert claim is not None and claim.run_id == run_id and claim.lease_token
    queue.start(run_id, claim.lease_token)
    if state == "SUCCEEDED":
        _seal(queue, run_id)
    assert queue.get_run(run_id).state == state
    return run_id


def _seal(queue: SqliteQueue, run_id: str) -> None:
    record = queue.get_run(run_id)
    assert record.lease_token
    payload = record.payload
    queue.complete(run_id, record.lease_token, Grading(
        run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle",
        counts=GradeCounts(total=1, completed=1, resolved=1, unresolved=0, infra_errors=0), score=1.0,
        runner_ref=payload.runner, api_ref=payload.api,
        started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:10Z"), [])


@pytest.mark.docker
@pytest.mark.slow
def test_a_prune_never_removes_an_image_a_run_in_flight_uses(
        tmp_path: Path, engine: Any, image: Image, make_payload: Callable[..., dict[str, Any]]) -> None:
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    sealed, running, queued = (_run(queue, make_payload, s) for s in ("SUCCEEDED", "RUNNING", "QUEUED"))
    only_sealed, shared, newer, of_running, of_queued, of_unknown = (image() for _ in range(6))
    forged = image(label=True, tag=f"benchseal-task-{uuid.uuid4().hex[:8]}:latest")  # a task image by label only
    for run_id, ids in ((sealed, [only_sealed, shared]), (running, [shared]), (running, [of_running]), (queued, [of_queued]),
                        ("not-in-this-queue", [of_unknown]), (sealed, [newer])):
        with task_image_use(run_id, records) as use:
            use.images(ids)

    # keep=1: the sealed run's most recently used image stays; the other goes; the one a running run shares stays.
    assert prune_task_images(queue, engine, keep=1, records=records) == [only_sealed]
    assert not present(engine, only_sealed)
    assert all(present(engine, i) for i in (shared, newer, of_running, of_queued, of_unknown, forged))
    assert prune_task_images(queue, engine, keep=0, records=records) == [newer]
    assert json.loads((records / sealed).read_text()).keys() == {shared}  # what is left of it: the shared image
    assert all(present(engine, i) for i in (shared, of_running, of_queued, of_unknown, forged))

    # The running run is sealed: its images are now the prune's, the most recently used first.
    _seal(queue, running)
    assert prune_task_images(queue, engine, keep=1, records=records) == [shared]
    assert not (records / sealed).exists()  # every image it named is gone: the record too
    assert present(engine, of_running) and present(engine, forged)


@pytest.mark.docker
def test_a_prune_waits_for_a_batch_that_is_picking_its_images(
        tmp_path: Path, engine: Any, image: Image, make_payload: Callable[..., dict[str, Any]]) -> None:
    """A batch reusing an image of a sealed run holds the records' shared lock until its record names it: the
    prune that started meanwhile waits, then sees the image as in use."""
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    sealed, running = _run(queue, make_payload, "SUCCEEDED"), _run(queue, make_payload, "RUNNING")
    reused = image()
    with task_image_use(sealed, records) as use:
        use.images([reused])
    removed: list[list[str]] = []
    with task_image_use(running, records) as use:
        pruning = threading.Thread(target=lambda: removed.append(prune_task_images(queue, engine, keep=0,
                                                                                   records=records)))
        pruning.start()
        pruning.join(timeout=1.0)
        assert pruning.is_alive() and not removed  # blocked on the lock, nothing removed
        use.images([reused])
    pruning.join(timeout=60)
    assert removed == [[]] and present(engine, reused)


@pytest.mark.docker
@pytest.mark.slow
def test_pruning_a_built_task_image_removes_its_build_steps_and_never_its_base(
        tmp_path: Path, engine: Any, image: Image, make_payload: Callable[..., dict[str, Any]]) -> None:
    """The engine's own prune of untagged parents would delete the loaded (untagged) base: the rule removes the
    legacy builder's intermediate images and stops at the base the batch recorded."""
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    sealed = _run(queue, make_payload, "SUCCEEDED")
    base = image()
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\nCOPY Dockerfile /app/x\nSTOPSIGNAL SIGKILL\n")
    built = [c["aux"]["ID"] for c in engine.api.build(path=str(context), rm=True, forcerm=True, pull=False,
                                                      nocache=True, network_mode="none", decode=True) if "aux" in c]
    assert len(built) == 1
    chain, parent = [], built[0]
    try:
        while parent and parent != base:
            chain.append(parent)
            parent = engine.api.inspect_image(parent).get("Parent") or ""
        assert parent == base and len(chain) >= 2  # the task image and at least one build step
        with task_image_use(sealed, records) as use:
            use.bases([base])
            use.images([built[0]])
        assert prune_task_images(queue, engine, keep=0, records=records) == [built[0]]
        assert [i for i in chain if present(engine, i)] == [] and present(engine, base)
    finally:
        for image_id in chain:
            try:
                engine.images.remove(image_id, force=True, noprune=True)
            except docker.errors.ImageNotFound:
                pass


def test_an_untrusted_record_stops_the_prune(tmp_path: Path) -> None:
    """A record the worker did not write alone could be what protects an image: the prune refuses to guess."""
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    with task_image_use("run-a", records) as use:
        use.images(["sha256:" + "a" * 64])
    os.chmod(records / "run-a", 0o666)
    with pytest.raises(CheckFailed, match="not a task image use record of this worker"):
        prune_task_images(queue, None, keep=0, records=records)
    (records / "run-a").unlink()
    (records / "run-a").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        prune_task_images(queue, None, keep=0, records=records)
    (records / "run-a").unlink()
    os.chmod(records, 0o777)
    with pytest.raises(CheckFailed, match="writable by nobody else"):
        prune_task_images(queue, None, keep=0, records=records)
    os.chmod(records, 0o700)
    with pytest.raises(CheckFailed, match="not sha256"), task_image_use("run-b", records) as use:
        use.images(["benchseal-task:latest"])


def test_a_sealed_runs_staged_copies_are_removed_and_its_evidence_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for sub in ("dataset/t1", "batches/0000-a/suite/t1", "batches/0000-a/harbor/t1", "batches/0003-b/suite",
                "harbor/t1", "logs"):
        (run_dir / sub).mkdir(parents=True)
        (run_dir / sub / "f").write_text("x")
    (run_dir / "grading.json").write_text("{}")
    removed = remove_staged(run_dir)
    assert removed == [run_dir / "dataset", run_dir / "batches/0000-a/suite", run_dir / "batches/0003-b/suite"]
    left = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    assert left == ["batches", "batches/0000-a", "batches/0000-a/harbor", "batches/0000-a/harbor/t1",
                    "batches/0000-a/harbor/t1/f", "batches/0003-b", "grading.json", "harbor", "harbor/t1",
                    "harbor/t1/f", "logs", "logs/f"]
    assert remove_staged(run_dir) == []


def test_a_prune_clears_the_staged_copies_of_runs_sealed_elsewhere_and_keeps_those_in_flight(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]]) -> None:
    """A run whose batches ran here but which another host sealed: its use record (written from its first batch,
    even with no task image) lets this host's next prune find its staged copies; a running run's stay."""
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    running = _run(queue, make_payload, "RUNNING")
    elsewhere = _run(queue, make_payload, "RUNNING")
    for run_id in (running, elsewhere):
        (queue.run_dir(run_id) / "dataset").mkdir(parents=True)
        note_staged(run_id, records)  # as planning does, right after staging
        assert json.loads((records / run_id).read_text()) == {}
        with task_image_use(run_id, records):
            (queue.run_dir(run_id) / "batches/0000-a/suite").mkdir(parents=True)
    _seal(queue, elsewhere)  # by "another host": nothing here removed its copies yet
    assert prune_task_images(queue, None, keep=0, records=records) == []
    assert not (queue.run_dir(elsewhere) / "dataset").exists()
    assert not (queue.run_dir(elsewhere) / "batches/0000-a/suite").exists()
    assert not (records / elsewhere).exists()
    assert (queue.run_dir(running) / "dataset").is_dir() and (queue.run_dir(running) / "batches/0000-a/suite").is_dir()
    assert (records / running).is_file()


def test_two_batches_of_one_run_recording_at_once_lose_no_image(tmp_path: Path) -> None:
    """Both hold the shared lock; each update of the run's record is one read-modify-write at a time, or an image
    one batch uses would drop out of the record and lose its protection."""
    records = tmp_path / "task-image-use"
    start = threading.Barrier(2)

    def batch(prefix: str) -> None:
        start.wait()
        for i in range(40):
            with task_image_use("run-shared", records) as use:
                use.images([f"sha256:{prefix}{i:063x}"])

    threads = [threading.Thread(target=batch, args=(p,)) for p in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(json.loads((records / "run-shared").read_text())) == 80
