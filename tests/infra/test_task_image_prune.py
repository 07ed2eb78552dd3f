"""Pruning (issue 36.5): a sealed run's staged copies go, and task images are pruned by the documented rule
(pipeline.infra.worker.prune): kept while the record of a run not sealed in the queue names them, the most
recently used of the rest kept up to a count, the others removed by id. Never an image of a run in flight,
never an image found by name or label, never the base a task image was built FROM.

The images are made here, each unique (an imported one-file tar, or a tiny image pushed to the local registry
and pulled by digest on the host engine), in the real engines, and removed again; the prune only ever sees
the records this test writes, so no other image of the shared engines is at stake. The queue is SQLite."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from pipeline.core.contracts import DispatchPayload, GradeCounts, Grading
from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.worker.config import WorkerConfig
from pipeline.infra.worker.images import TASK_IMAGE_LABEL, sandbox_image
from pipeline.infra.worker.prune import (
    STALE_RECORD_SECONDS,
    Pruned,
    after_work,
    note_staged,
    prune_task_images,
    remove_staged,
    runner_image_use,
    runner_use_records,
    task_image_use,
    use_records,
)
from pipeline.infra.worker.task_images import load_task_bases, pull_recorded
from tests.fixtures.infra import remove_from_both_engines, sandbox_engine
from tests.registry.helpers import push_tiny, tiny_image

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


def _backdate(record: Path, age: float) -> None:
    """A use record last written, and naming its images as last used, ``age`` seconds ago."""
    when = time.time() - age
    record.write_text(json.dumps(dict.fromkeys(json.loads(record.read_text()), when)))
    os.utime(record, (when, when))


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
    assert prune_task_images(queue, engine, keep=1, records=records).sandbox == [only_sealed]
    assert not present(engine, only_sealed)
    assert all(present(engine, i) for i in (shared, newer, of_running, of_queued, of_unknown, forged))
    assert prune_task_images(queue, engine, keep=0, records=records).sandbox == [newer]
    assert json.loads((records / sealed).read_text()).keys() == {shared}  # what is left of it: the shared image
    assert all(present(engine, i) for i in (shared, of_running, of_queued, of_unknown, forged))

    # The running run is sealed: its images are now the prune's, the most recently used first.
    _seal(queue, running)
    assert prune_task_images(queue, engine, keep=1, records=records).sandbox == [shared]
    assert not (records / sealed).exists()  # every image it named is gone: the record too
    assert present(engine, of_running) and present(engine, forged)

    # A week untouched: the unknown run's record is folded away and its image falls under the ranking (the
    # oldest, so the first to go); the queued run's record is as old and still protects its image.
    for run_id in ("not-in-this-queue", queued):
        _backdate(records / run_id, STALE_RECORD_SECONDS + 60)
    assert prune_task_images(queue, engine, keep=1, records=records).sandbox == [of_unknown]
    assert not (records / "not-in-this-queue").exists() and (records / queued).is_file()
    assert present(engine, of_running) and present(engine, of_queued) and present(engine, forged)


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
                                                                                   records=records).sandbox))
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
        assert prune_task_images(queue, engine, keep=0, records=records).sandbox == [built[0]]
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
    for name, bad in ((".released", {"sha256:" + "a" * 64: "yesterday"}),
                      (".host", {"sha256:" + "a" * 64: {"present_before": "no", "refs": []}}),
                      (".host", {"sha256:" + "a" * 64: {"present_before": False, "refs": ["x:latest"]}})):
        (records / name).write_text(json.dumps(bad))
        os.chmod(records / name, 0o600)
        with pytest.raises(CheckFailed, match="not"):
            prune_task_images(queue, None, keep=0, records=records, host=object())
        (records / name).unlink()


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
    assert prune_task_images(queue, None, keep=0, records=records) == Pruned([], [])
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


def test_stale_records_of_sealed_or_unknown_runs_are_folded_and_a_run_in_flight_keeps_its_own(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]]) -> None:
    """A record of a run sealed or unknown to the queue, untouched for STALE_RECORD_SECONDS, goes; its images
    stay known in .released (ranked with the rest, never lost to the prune). A queued run's record stays at
    any age, and an unknown run's just short of the age still protects."""
    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    runs = {"sealed_old": _run(queue, make_payload, "SUCCEEDED"), "sealed_new": _run(queue, make_payload, "SUCCEEDED"),
            "queued_old": _run(queue, make_payload, "QUEUED"), "unknown_old": "unknown-old",
            "unknown_edge": "unknown-edge", "unknown_new": "unknown-new"}
    ids = {name: f"sha256:{i:064x}" for i, name in enumerate(runs, 1)}
    for name, run_id in runs.items():
        with task_image_use(run_id, records) as use:
            use.images([ids[name]])
    for name in ("sealed_old", "queued_old", "unknown_old"):
        _backdate(records / runs[name], STALE_RECORD_SECONDS + 60)
    _backdate(records / runs["unknown_edge"], STALE_RECORD_SECONDS - 60)
    (queue.run_dir(runs["sealed_old"]) / "dataset").mkdir(parents=True)

    assert prune_task_images(queue, None, keep=10, records=records) == Pruned([], [])
    left = {p.name for p in records.iterdir() if not p.name.startswith(".")}
    assert left == {runs[n] for n in ("sealed_new", "queued_old", "unknown_edge", "unknown_new")}
    released = json.loads((records / ".released").read_text())
    assert released.keys() == {ids["sealed_old"], ids["unknown_old"]}
    assert not (queue.run_dir(runs["sealed_old"]) / "dataset").exists()  # its staged copies went first
    assert prune_task_images(queue, None, keep=10, records=records) == Pruned([], [])  # nothing more to fold
    assert json.loads((records / ".released").read_text()) == released


@pytest.mark.docker
def test_the_host_engines_copies_the_worker_pulled_are_pruned_and_no_one_elses(
        tmp_path: Path, image_registry: str, make_payload: Callable[..., dict[str, Any]]) -> None:
    """Task images pulled by digest on the host engine (then moved into the sandbox by id): the worker's own
    pulls go by the sandbox's ranking; an image the host had before the worker's pull, one an operator has
    since tagged or pulled under another digest, and one a run in flight names all stay."""
    from pipeline.imaging.oci import MANIFEST_TYPE, sha256_digest
    from pipeline.imaging.push import Registry

    records = tmp_path / "task-image-use"
    queue = SqliteQueue(tmp_path / "queue.sqlite3", runs_dir=tmp_path / "runs")
    sealed, running = _run(queue, make_payload, "SUCCEEDED"), _run(queue, make_payload, "RUNNING")
    registry, repository = Registry(image_registry), "benchseal-tests/prune-host"
    images = {name: tiny_image() for name in ("pulled", "before", "tagged", "renamed", "warm", "in_flight")}
    refs = {name: ImageRef(f"{image_registry}/{repository}", push_tiny(registry, repository, image))
            for name, image in images.items()}
    ids = {name: sha256_digest(image.config) for name, image in images.items()}
    host, sandboxed = docker.from_env(timeout=120), sandbox_engine()
    try:
        # The operator's, before the worker's pull, and with no name (as `docker load` leaves one): the pull
        # then adds the only name it has, so only the record of its being there keeps it.
        host.api.pull(refs["before"].name, tag=refs["before"].digest)
        saved = b"".join(host.api.get_image(ids["before"]))
        host.images.remove(ids["before"], force=True)
        host.api.load_image(saved)
        assert not host.api.inspect_image(ids["before"])["RepoDigests"]

        def load(run_id: str, *names: str) -> None:  # as a batch does (loop._prepare_batch)
            with task_image_use(run_id, records) as use:
                use.images(load_task_bases(host, sandboxed, {"t": tuple(refs[n] for n in names)}, use).values())

        load(sealed, "pulled", "before", "tagged", "renamed")
        # The operator names two of the worker's pulls in the same repository: by a tag, and by an index's
        # digest (removing either by id would take the operator's name with it). A later batch loading the
        # image by that index digest adds nothing: the name was there before its pull.
        host.api.tag(ids["tagged"], f"{image_registry}/{repository}", "operator")
        index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": [{"mediaType": MANIFEST_TYPE, "digest": images["renamed"].digest,
                                           "size": len(images["renamed"].manifest),
                                           "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
        refs["index"] = ImageRef(refs["renamed"].name, registry.put_manifest(
            repository, sha256_digest(index), index, "application/vnd.oci.image.index.v1+json"))
        host.api.pull(refs["index"].name, tag=refs["index"].digest)
        assert len(host.api.inspect_image(ids["renamed"])["RepoDigests"]) == 2
        load(sealed, "index")
        load(sealed, "warm")  # the most recently used
        load(running, "in_flight")
        pulls = json.loads((records / ".host").read_text())
        assert {n: pulls[ids[n]]["present_before"] for n in images} == {n: n == "before" for n in images}
        assert {n: pulls[ids[n]]["refs"] for n in images} == {n: [refs[n].ref] for n in images}

        pruned = prune_task_images(queue, sandboxed, keep=1, records=records, host=host)
        assert pruned.host == [ids["pulled"]]
        assert set(pruned.sandbox) == {ids[n] for n in ("pulled", "before", "tagged", "renamed")}
        assert [n for n in images if present(host, ids[n])] == ["before", "tagged", "renamed", "warm", "in_flight"]
        assert prune_task_images(queue, sandboxed, keep=0, records=records, host=host).host == [ids["warm"]]
        _seal(queue, running)
        assert prune_task_images(queue, sandboxed, keep=0, records=records, host=host).host == [ids["in_flight"]]
        assert [n for n in images if present(host, ids[n])] == ["before", "tagged", "renamed"]
        # Entries go with their images; the others stay, so the operator's images are never taken later either.
        assert json.loads((records / ".host").read_text()).keys() == {ids[n] for n in ("before", "tagged", "renamed")}
    finally:
        host.close()
        sandboxed.close()
        for image_id in ids.values():
            remove_from_both_engines(image_id)


@pytest.mark.docker
def test_runner_images_are_pruned_by_their_own_count_after_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: Any, image: Image,
        make_payload: Callable[..., dict[str, Any]]) -> None:
    """Each agent release brings a runner of its own: the worker records the runner under its run in records of
    their own (``runner_image_use``), and ``after_work`` prunes them by ``keep_runner_images``, apart from the
    task images' count; a runner of a run in flight stays whatever the count."""
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    db = tmp_path / "queue.sqlite3"
    queue = SqliteQueue(db, runs_dir=tmp_path / "runs")
    old, new, in_flight, task = (_run(queue, make_payload, s) for s in ("SUCCEEDED", "SUCCEEDED", "RUNNING", "SUCCEEDED"))
    runners = {run_id: image() for run_id in (old, new, in_flight)}
    for run_id, runner_id in runners.items():  # one after another: "new" is used after "old"
        with runner_image_use(run_id) as use:
            use.images([runner_id])
    task_image = image()
    with task_image_use(task) as use:
        use.images([task_image])
    assert runner_use_records() != use_records() and (runner_use_records() / old).is_file()
    config = WorkerConfig(db=db, keep_runner_images=1, keep_task_images=1)
    after_work(config, None)
    assert not present(engine, runners[old])  # the oldest runner of a sealed run: beyond the count of 1
    assert present(engine, runners[new]) and present(engine, runners[in_flight]) and present(engine, task_image)
    assert not (runner_use_records() / old).exists()  # its only image gone: the record goes with it
    after_work(dataclasses.replace(config, keep_runner_images=0), None)
    assert not present(engine, runners[new]) and present(engine, runners[in_flight]) and present(engine, task_image)


@pytest.mark.docker
def test_a_runner_the_worker_pulled_is_recorded_before_the_pull_and_pruned_from_both_engines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_registry: str,
        make_payload: Callable[..., dict[str, Any]]) -> None:
    """``pull_recorded`` (the runner's pull in ``loop._prepare_batch``): the run's record names the runner's id and
    ``.host`` says the host engine lacked it, both before the pull; once the run is sealed and beyond the count,
    ``after_work`` removes the worker's pull from the host engine and its copy from the sandbox. A runner the
    host engine already held under its digest is recorded as there before."""
    from pipeline.imaging.oci import sha256_digest
    from pipeline.imaging.push import Registry

    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    db = tmp_path / "queue.sqlite3"
    queue = SqliteQueue(db, runs_dir=tmp_path / "runs")
    run_id = _run(queue, make_payload, "RUNNING")
    registry, repository = Registry(image_registry), "benchseal-tests/prune-runner"
    tiny = tiny_image()
    ref = ImageRef(f"{image_registry}/{repository}", push_tiny(registry, repository, tiny))
    runner_id = sha256_digest(tiny.config)
    host, sandboxed = docker.from_env(timeout=120), sandbox_engine()
    try:
        with runner_image_use(run_id) as use:
            assert pull_recorded(host, ref, use) == runner_id
        assert json.loads((runner_use_records() / ".host").read_text()) == {
            runner_id: {"present_before": False, "refs": [ref.ref]}}
        assert runner_id in json.loads((runner_use_records() / run_id).read_text())
        assert sandbox_image(host, sandboxed, ref) == runner_id
        config = WorkerConfig(db=db, keep_runner_images=0)
        after_work(config, None)  # in flight: both copies stay
        assert present(host, runner_id) and present(sandboxed, runner_id)
        _seal(queue, run_id)
        after_work(config, None)
        assert not present(host, runner_id) and not present(sandboxed, runner_id)
        # Held under its digest by someone else before the worker's pull: recorded so, and never the prune's.
        host.api.pull(ref.name, tag=ref.digest)
        with runner_image_use("run-2") as use:
            assert pull_recorded(host, ref, use) == runner_id
        assert json.loads((runner_use_records() / ".host").read_text())[runner_id]["present_before"] is True
    finally:
        host.close()
        sandboxed.close()
        remove_from_both_engines(runner_id)
