"""Nothing crosses runs (issue 35, point 4), on the real sandbox engine.

A run reaches the engine through its engine proxy only. Before: a build through the proxy could carry
``benchseal.task.hash`` of another task, and the worker found task images again BY THAT LABEL, so the
next run on the host ran the planted image. Now the worker reuses a task image only by the id it
recorded when it built it (root-owned records), the proxy refuses benchseal's labels, and everything
a batch created on the engine is removed when the batch ends."""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import docker
import docker.errors
import pytest

from pipeline.core.errors import CheckFailed
from pipeline.infra.sandbox import engine as sbx
from pipeline.infra.sandbox.engine_proxy import EnginePolicy, EngineProxy
from pipeline.infra.worker.containers import LABEL_BATCH, LABEL_RUN, kill_leftovers, remove_batch_objects
from pipeline.infra.worker.images import TASK_IMAGE_LABEL, _task_context_hash, prebuild_task_images
from tests.fixtures.infra import base_in_sandbox, sandbox_engine
from tests.infra.test_engine_proxy import _call

pytestmark = [pytest.mark.docker, pytest.mark.needs_root("the sandbox engine is set up by root")]


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    engine = sandbox_engine()  # started if needed
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_id(client: docker.DockerClient, base_refs: dict[str, Any]) -> str:
    """The project's base, admitted on the host and copied into the sandbox by id (as the worker does)."""
    return base_in_sandbox(client, base_refs)


def _suite(root: Path, base: str, marker: str) -> Path:
    """Two tasks whose environments are built from ``base`` (their content is this test's own)."""
    for task in ("alpha", "beta"):
        env = root / task / "environment"
        env.mkdir(parents=True)
        (env / "Dockerfile").write_text(f"FROM {base}\nCOPY marker /marker\n")
        (env / "marker").write_text(f"{marker} {task}\n")
        (root / task / "task.toml").write_text('version = "1.0"\n\n[environment]\n')
    return root


@dataclass
class Runner:
    """A run's engine proxy in front of the sandbox engine, labelling what it creates as the worker asks."""

    proxy: EngineProxy
    run_id: str
    batch: str

    def call(self, method: str, path: str, body: bytes | dict[str, Any] | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
        return _call(self.proxy, method, path, body, headers={"Content-Type": content_type})

    def build(self, dockerfile: str, query: str = "", files: dict[str, str] | None = None) -> tuple[int, bytes]:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as archive:
            for name, text in {"Dockerfile": dockerfile, **(files or {})}.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return self.call("POST", f"/v1.41/build?{query.lstrip('&')}", out.getvalue(), "application/x-tar")


@pytest.fixture
def runners(tmp_path: Path, client: docker.DockerClient) -> Iterator[list[Runner]]:
    """Two runs' proxies (run A and run B) on the one sandbox engine."""
    made: list[Runner] = []
    for name in ("a", "b"):
        run_id = f"run-{uuid.uuid4().hex[:20]}"
        batch = f"batch-{uuid.uuid4().hex[:12]}"
        run_dir = tmp_path / f"run-{name}"
        run_dir.mkdir()
        policy = EnginePolicy(bind_roots=(run_dir,), labels={LABEL_RUN: run_id, LABEL_BATCH: batch})
        made.append(Runner(EngineProxy(tmp_path / f"proxy-{name}.sock", policy, upstream=str(sbx.default_sandbox().socket)).start(),
                           run_id, batch))
    yield made
    for runner in made:
        runner.proxy.stop()
        kill_leftovers(client, runner.run_id)


def _labelled(client: docker.DockerClient, label: str) -> dict[str, list[str]]:
    return {"containers": [c.id for c in client.containers.list(all=True, filters={"label": label})],
            "images": [i.id for i in client.images.list(filters={"label": label})],
            "volumes": [v.name for v in client.volumes.list(filters={"label": label})]}


def _chain(client: docker.DockerClient, image: str) -> set[str]:
    return {str(h["Id"]) for h in client.images.get(image).history() if h["Id"] != "<missing>"}


def test_a_build_carrying_another_tasks_hash_is_refused_and_a_planted_image_is_never_picked_up(
        tmp_path: Path, client: docker.DockerClient, base_id: str, runners: list[Runner]) -> None:
    records = tmp_path / "records"
    suite = _suite(tmp_path / "suite", base_id, uuid.uuid4().hex)
    beta_env = suite / "beta" / "environment"
    alpha_hash, beta_hash = (_task_context_hash(suite / t / "environment") for t in ("alpha", "beta"))
    hostile = runners[0]
    hostile_tag = f"hostile-beta-{uuid.uuid4().hex[:8]}"  # this test's own name on the shared engine
    # The hostile run builds beta's exact context first: the worker's build takes no layer of it (no cache).
    status, answer = hostile.build((beta_env / "Dockerfile").read_text(), f"t={hostile_tag}",
                                   {"marker": (beta_env / "marker").read_text()})
    assert status == 200 and b"Successfully built" in answer, answer[-300:]
    mine = prebuild_task_images(client, suite, records)
    assert _chain(client, mine["beta"]) & _chain(client, hostile_tag) == _chain(client, base_id)
    evil = f"FROM {base_id}\nRUN echo evil > /marker\n"
    # The attack as found: the build's labels carry another task's hash (any spelling), or the Dockerfile does.
    for labels in ({TASK_IMAGE_LABEL: beta_hash}, {"BenchSeal.Task.Hash": beta_hash}, {"dev.benchseal.agent": "{}"}):
        status, answer = hostile.build(evil, "labels=" + quote(json.dumps(labels)))
        assert status == 403 and b"benchseal" in answer, (labels, status, answer[-300:])
    for dockerfile in (f"{evil}LABEL {TASK_IMAGE_LABEL}={beta_hash}\n",
                       f'{evil}LABEL "bench"seal.task.hash={beta_hash}\n',
                       f"{evil}label bench\\\n  seal.task.hash={beta_hash}\n",
                       f"{evil}ARG K=benchseal.task.hash\nLABEL $K={beta_hash}\n",
                       f"FROM {mine['alpha']}\nRUN echo evil > /marker\n"):  # would inherit the worker's label
        status, answer = hostile.build(dockerfile)
        assert status == 403, (dockerfile, status, answer[-300:])
    assert [i.id for i in client.images.list(filters={"label": f"{TASK_IMAGE_LABEL}={beta_hash}"})] == [mine["beta"]]
    # beta's image gone, and one carrying beta's hash got there anyway (built without the proxy: what a run
    # before this change could leave): it is never picked up, the worker builds beta itself.
    client.images.remove(mine["beta"], force=True)
    planted, _ = client.images.build(fileobj=io.BytesIO(evil.encode()), labels={TASK_IMAGE_LABEL: beta_hash},
                                     rm=True, network_mode="none")
    assert [i.id for i in client.images.list(filters={"label": f"{TASK_IMAGE_LABEL}={beta_hash}"})] == [planted.id]
    again: dict[str, str] = {}
    try:
        for task in ("alpha", "beta"):
            (suite / task / "task.toml").write_text('version = "1.0"\n\n[environment]\n')
        again = prebuild_task_images(client, suite, records)
        assert again["beta"] not in (planted.id, mine["beta"]) and again["alpha"] == mine["alpha"]
        assert (records / beta_hash).read_text().strip() == again["beta"]
        assert (records / alpha_hash).read_text().strip() == mine["alpha"]
        run = client.containers.run(again["beta"], ["cat", "/marker"], remove=True, network_disabled=True)
        assert b"beta" in run and b"evil" not in run
    finally:
        client.images.remove(planted.id, force=True)
        client.images.remove(hostile_tag, force=True)
        for image_id in {mine["alpha"], *again.values()}:
            client.images.remove(image_id, force=True)


def test_warm_runs_reuse_the_workers_own_image_and_a_name_the_worker_uses_is_never_picked_up(
        tmp_path: Path, client: docker.DockerClient, base_id: str, runners: list[Runner]) -> None:
    records = tmp_path / "records"
    marker = f"warm {uuid.uuid4().hex}"  # this test's own task hashes (a tmp dir's name repeats across sessions)
    suites = [_suite(tmp_path / f"s{i}", base_id, marker) for i in range(3)]
    built = prebuild_task_images(client, suites[0], records)
    # This test's task images: the worker labels what it builds with the task's hash, and these hashes are this
    # test's own (its marker): the engine is shared, and other tests' images are never counted.
    hashes = [_task_context_hash(suites[1] / task / "environment") for task in ("alpha", "beta")]

    def task_images() -> set[str]:
        return {i.id for h in hashes for i in client.images.list(filters={"label": f"{TASK_IMAGE_LABEL}={h}"})}

    assert task_images() == set(built.values())
    hostile_tag = f"hostile-alpha-{uuid.uuid4().hex[:8]}"
    # A hostile run tags its own image with names that spell the worker's image (its short id, the
    # base's), and builds one labelled like it: none of it is what the next run gets.
    status, answer = runners[0].build(f"FROM {base_id}\nRUN echo evil > /marker\n",
                                      f"t={built['alpha'][7:19]}")
    assert status == 403 and b"already in the engine" in answer, answer[-300:]
    short = built["alpha"][7:19]
    assert runners[0].call("DELETE", f"/v1.41/images/{short}?force=1")[0] == 403
    # A tag that spells the short id, removed twice: the second removal must not fall back to the id prefix.
    status, answer = runners[0].build(f"FROM {base_id}\n", f"t={short}%3Alatest")
    assert status == 200, answer[-300:]
    assert runners[0].call("DELETE", f"/v1.41/images/{short}?force=1")[0] == 200
    assert runners[0].call("DELETE", f"/v1.41/images/{short}?force=1")[0] == 404
    assert client.images.get(built["alpha"]).id == built["alpha"]
    status, answer = runners[0].build(f"FROM {base_id}\nRUN echo evil > /marker\n", f"t={hostile_tag}")
    assert status == 200 and b"Successfully built" in answer, answer[-300:]
    client.images.get(f"{hostile_tag}:latest").tag(short)  # on the engine directly: as if it could
    try:
        started = time.perf_counter()
        warm = prebuild_task_images(client, suites[1], records)
        elapsed = time.perf_counter() - started
        assert warm == built  # no rebuild: a nocache build would give another id
        assert task_images() == set(built.values())  # nothing built for this suite's tasks, nothing picked up
        assert client.images.get(short).id == client.images.get(hostile_tag).id not in task_images()
        assert f'docker_image = "{built["alpha"]}"' in (suites[1] / "alpha" / "task.toml").read_text()
        print(f"warm prebuild of 2 tasks: {elapsed * 1000:.1f} ms")
    finally:
        client.images.remove(short, force=True)
        client.images.remove(hostile_tag, force=True)
    # Removed behind the worker's back: built again, not trusted.
    client.images.remove(built["alpha"], force=True)
    rebuilt = prebuild_task_images(client, suites[2], records)
    assert rebuilt["alpha"] != built["alpha"] and rebuilt["beta"] == built["beta"]
    assert (records / _task_context_hash(suites[2] / "alpha" / "environment")).read_text().strip() == rebuilt["alpha"]
    for image_id in {*built.values(), *rebuilt.values()} - {built["alpha"]}:
        client.images.remove(image_id, force=True)


def test_records_only_the_worker_could_write_are_trusted(tmp_path: Path, client: docker.DockerClient,
                                                        base_id: str) -> None:
    records = tmp_path / "records"
    suite = _suite(tmp_path / "s", base_id, "records " + tmp_path.name)
    built = prebuild_task_images(client, suite, records)
    assert {p.stat().st_mode & 0o777 for p in records.iterdir()} == {0o600}
    assert records.stat().st_mode & 0o777 == 0o700
    # A record another user could have written (mode, or a symlink) names the base image, not alpha's: not used.
    alpha = records / _task_context_hash(suite / "alpha" / "environment")
    beta = records / _task_context_hash(suite / "beta" / "environment")
    alpha.write_text(base_id + "\n")
    alpha.chmod(0o666)
    beta.unlink()
    (tmp_path / "elsewhere").write_text(base_id + "\n")
    beta.symlink_to(tmp_path / "elsewhere")
    again = _suite(tmp_path / "again", base_id, "records " + tmp_path.name)
    rebuilt = prebuild_task_images(client, again, records)
    assert base_id not in rebuilt.values() and rebuilt["alpha"] != built["alpha"] and rebuilt["beta"] != built["beta"]
    assert not beta.is_symlink() and alpha.stat().st_mode & 0o777 == 0o600
    # A records directory others can write: refused outright.
    records.chmod(0o770)
    with pytest.raises(CheckFailed, match="writable by nobody else"):
        prebuild_task_images(client, _suite(tmp_path / "third", base_id, "x"), records)
    for image_id in {*built.values(), *rebuilt.values()}:
        client.images.remove(image_id, force=True)


def test_what_a_batch_created_is_gone_when_it_ends_and_another_runs_is_left_alone(
        client: docker.DockerClient, base_id: str, runners: list[Runner]) -> None:
    made: dict[str, dict[str, Any]] = {}
    for runner in runners:
        tag = f"leftover-{uuid.uuid4().hex[:10]}"
        status, answer = runner.build(f"FROM {base_id}\nRUN echo hi > /hi\n", f"t={tag}&labels="
                                      + quote(json.dumps({"com.example": "x"})))
        assert status == 200 and b"Successfully built" in answer, answer[-300:]
        # Labels that would make it look like another run's (or the worker's) are refused.
        for labels in ({LABEL_RUN: runners[1].run_id}, {LABEL_BATCH: runners[1].batch}):
            status, _ = runner.call("POST", "/v1.41/containers/create", {"Image": tag, "Labels": labels})
            assert status == 403
            status, _ = runner.call("POST", "/v1.41/volumes/create", {"Labels": labels})
            assert status == 403
        # A container kept (with an anonymous volume), one the runner removes itself (its volume goes too),
        # a named volume.
        status, answer = runner.call("POST", "/v1.41/containers/create", {"Image": tag, "Volumes": {"/data": {}}})
        assert status == 201, answer
        kept = json.loads(answer)["Id"]
        status, answer = runner.call("POST", "/v1.41/containers/create", {"Image": tag, "Volumes": {"/data": {}}})
        assert status == 201, answer
        dropped = json.loads(answer)["Id"]
        dropped_volume = client.containers.get(dropped).attrs["Mounts"][0]["Name"]
        assert runner.call("DELETE", f"/v1.41/containers/{dropped}")[0] == 204
        with pytest.raises(docker.errors.NotFound):
            client.volumes.get(dropped_volume)
        status, answer = runner.call("POST", "/v1.41/volumes/create", {"Name": f"leftover-{uuid.uuid4().hex[:10]}"})
        assert status == 201, answer
        volume = json.loads(answer)["Name"]
        made[runner.batch] = {"tag": tag, "kept": kept, "anonymous": client.containers.get(kept).attrs["Mounts"][0]["Name"],
                              "volume": volume}
        assert client.images.get(tag).labels[LABEL_BATCH] == runner.batch
        assert client.volumes.get(volume).attrs["Labels"][LABEL_RUN] == runner.run_id
    a, b = runners
    removed = remove_batch_objects(client, a.batch)  # run A's batch ended
    assert removed and _labelled(client, f"{LABEL_BATCH}={a.batch}") == {"containers": [], "images": [], "volumes": []}
    for gone in (lambda: client.images.get(made[a.batch]["tag"]), lambda: client.containers.get(made[a.batch]["kept"]),
                 lambda: client.volumes.get(made[a.batch]["anonymous"]), lambda: client.volumes.get(made[a.batch]["volume"])):
        with pytest.raises(docker.errors.NotFound):
            gone()
    # Run B's are all there.
    assert client.images.get(made[b.batch]["tag"]) and client.containers.get(made[b.batch]["kept"])
    assert client.volumes.get(made[b.batch]["anonymous"]) and client.volumes.get(made[b.batch]["volume"])
    # A dead worker's run (nobody ran its batch's end): removed by the run's label.
    kill_leftovers(client, b.run_id)
    assert _labelled(client, f"{LABEL_RUN}={b.run_id}") == {"containers": [], "images": [], "volumes": []}
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get(made[b.batch]["anonymous"])
