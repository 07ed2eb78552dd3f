"""The API image as benchseal-api.service runs it: ``benchseal api check-image`` admits only an image a
release in the queue carries and the policy's signer signed (cosign, the private Sigstore instance),
and pulls it by digest; ``docker_argv`` runs the real API image by digest, read-only, on 127.0.0.1,
over the queue mounted read-only, which the container then cannot write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed
from pipeline.core.paths import REPO_ROOT
from pipeline.host.api import CONTAINER_NAME, QUEUE_MOUNT, URL_MOUNT, ApiContainer, docker_argv
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.reader import open_reader
from pipeline.infra.queue.sql import SqliteQueue
from tests.api.history import REPOSITORY, commit_of, http_get, seed
from tests.fixtures.sigstore import push_unique_image
from tests.registry.helpers import free_port, wait_listening

REF = parse_ref("127.0.0.1:5055/benchseal/api@sha256:" + "c" * 64)


def test_docker_argv_runs_the_image_by_digest_read_only_on_loopback(tmp_path: Path) -> None:
    db = tmp_path / "infra" / "queue.sqlite3"
    argv = docker_argv(ApiContainer(image=REF, uid=990, gid=991, port=8099, queue_db=db))
    image_at = argv.index(REF.ref)
    options, command = argv[:image_at], argv[image_at + 1:]
    assert options[:3] == ["docker", "run", "--rm"]
    assert "--read-only" in options and options[options.index("--cap-drop") + 1] == "ALL"
    assert options[options.index("--security-opt") + 1] == "no-new-privileges"
    assert options[options.index("--user") + 1] == "990:991"
    assert options[options.index("--pull") + 1] == "never" and options[options.index("--name") + 1] == CONTAINER_NAME
    assert options[options.index("--publish") + 1] == "127.0.0.1:8099:8080"
    assert options[options.index("--mount") + 1] == f"type=bind,source={db.parent},target={QUEUE_MOUNT},readonly"
    assert [o for o in options if o.startswith(("-v", "--volume", "--privileged", "--network=host"))] == []
    assert command == ["benchseal", "api", "serve", "--host", "0.0.0.0", "--port", "8080", "--release-url-base",
                       "https://github.com", "--queue-db", f"{QUEUE_MOUNT}/queue.sqlite3"]
    url_file = tmp_path / "api-queue-url"
    pg = docker_argv(ApiContainer(image=REF, uid=1, gid=1, port=8099, queue_db=None, queue_url_file=url_file))
    assert f"type=bind,source={url_file},target={URL_MOUNT},readonly" in pg and pg[-2:] == ["--queue-url-file", URL_MOUNT]
    assert "postgresql" not in " ".join(pg)
    for bad in (ApiContainer(image=REF, uid=1, gid=1, port=1, queue_db=None),
                ApiContainer(image=REF, uid=1, gid=1, port=1, queue_db=db, queue_url_file=url_file),
                ApiContainer(image=REF, uid=1, gid=1, port=1, queue_db=Path("rel/q.sqlite3")),
                ApiContainer(image=REF, uid=1, gid=1, port=1, queue_db=tmp_path / "a,readonly=false" / "q")):
        with pytest.raises(ValueError, match=r"exactly one queue|mount source"):
            docker_argv(bad)


def test_container_verb_prints_what_it_runs(tmp_path: Path) -> None:
    env = {**os.environ, "BENCHSEAL_HOME": str(tmp_path / "home"), "BENCHSEAL_API_PORT": "8123"}
    done = subprocess.run([sys.executable, "-m", "pipeline", "api", "container", REF.ref, "--print"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert "127.0.0.1:8123:8080" in argv and "--user" in argv and argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert f"type=bind,source={tmp_path / 'home' / 'infra'},target=/queue,readonly" in argv
    tagged = subprocess.run([sys.executable, "-m", "pipeline", "api", "container", "127.0.0.1:5055/x/api:latest", "--print"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert tagged.returncode == 2 and "invalid REF: must be pinned by digest" in tagged.stderr


# --- with the Docker Engine, the local registry, cosign and the private Sigstore instance ----------

def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)


def _wait_answering(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until the service in the container answers /healthz: the engine's port proxy accepts on the host
    port as soon as the container starts, and resets connections until the service listens inside."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_get(port, "/healthz")[0] == 200:
                return
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the API container never answered /healthz"
        time.sleep(0.2)


@pytest.fixture
def running_api(local_images: dict[str, Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    api = local_images["api"]
    db = tmp_path / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        seeded = seed(queue, api=api.ref)
    with open_reader(db) as host_side:  # what `api check-image` does on the host: the wal files stay
        host_side.list_runs()
    name = f"benchseal-api-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    argv = docker_argv(ApiContainer(image=api, uid=os.getuid(), gid=os.getgid(), port=port, queue_db=db, name=name))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_listening(port, "the API container", alive=lambda: proc.poll() is None, timeout=60)
        _wait_answering(port, proc)
        yield {"port": port, "name": name, "db": db, "run_ids": seeded.run_ids, "api": api}
    finally:
        proc.terminate()  # the docker client passes SIGTERM on to the container (--rm removes it)
        try:
            proc.wait(timeout=40)
        finally:
            _docker("rm", "--force", name)


@pytest.mark.docker
@pytest.mark.slow
def test_the_api_image_serves_the_queue_it_cannot_write(running_api: dict[str, Any]) -> None:
    port, name, db = running_api["port"], running_api["name"], running_api["db"]
    status, headers, body = http_get(port, "/repos/acme/widget")
    assert status == 200 and b"&lt;img src=x onerror=alert(1)&gt;" in body, body[:500]
    assert "default-src 'none'" in headers["content-security-policy"]
    status, _, body = http_get(port, "/runs")
    assert status == 200 and len(json.loads(body)["runs"]) == 3
    # The worker keeps writing on the host; the container sees it through the shared wal-index.
    with SqliteQueue(db) as writer:
        seed(writer, "acme/second", {"v0.1.0": {"hello": (1, 1, 1)}}, api=running_api["api"].ref)
    status, _, body = http_get(port, "/repos/acme/second/history")
    assert status == 200 and json.loads(body)["releases"][0]["tag"] == "v0.1.0"
    # Nothing in the container can write the queue, or anything else.
    write = ("import sqlite3\nc = sqlite3.connect('file:/queue/queue.sqlite3?mode=rw', uri=True)\n"
             "c.execute(\"INSERT INTO events (run_id, at, event) VALUES ('run-x', 'now', 'written')\")\nc.commit()\n")
    done = _docker("exec", name, "python3", "-c", write)
    assert done.returncode != 0 and ("readonly" in done.stderr or "read-only" in done.stderr.lower()
                                     or "unable to open" in done.stderr), done.stderr
    for target in ("/queue/planted", "/planted", "/tmp/planted"):
        touched = _docker("exec", name, "touch", target)
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr, (target, touched.stderr)
    with SqliteQueue(db) as reader:
        assert all(e.event != "written" for r in reader.list_runs() for e in reader.events(r.run_id))
    inspected = json.loads(_docker("inspect", name).stdout)[0]
    host = inspected["HostConfig"]
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    assert [(m["Destination"], m["RW"]) for m in inspected["Mounts"]] == [("/queue", False)]
    assert inspected["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"
    assert inspected["Config"]["Image"] == running_api["api"].ref


@pytest.fixture(scope="module")
def signed_api(built_images: DigestsFile, sign_release_images: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    api = built_images.images["api"]
    trust = sign_release_images(REPOSITORY, "v1.2.0", [api.ref], commit=commit_of("v1.2.0"))
    unsigned = push_unique_image("benchseal-api-test/api", "unsigned")
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    images = {"runner": [{"registry": "127.0.0.1:5055", "repository": "benchseal/runner"}],
              "api": [{"registry": api.name.partition("/")[0], "repository": api.name.partition("/")[2]},
                      {"registry": "127.0.0.1:5055", "repository": "benchseal-api-test/api"}]}
    data["sources"] = [{"repository": REPOSITORY, "signer": {"workflow": "tag.yml"}, "images": images}]
    policy = tmp_path_factory.mktemp("api-policy") / "infra.yaml"
    policy.write_text(yaml.safe_dump(data))
    return {"api": api.ref, "unsigned": unsigned, "trust": trust, "policy": policy}


def _check(signed: dict[str, Any], ref: str, db: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENCHSEAL_INFRA_POLICY": str(signed["policy"]), "BENCHSEAL_HOME": str(db.parent.parent),
           "BENCHSEAL_SIGSTORE_URL": signed["trust"].fulcio_url, "BENCHSEAL_TRUSTED_ROOT": str(signed["trust"].trusted_root)}
    return subprocess.run([sys.executable, "-m", "pipeline", "api", "check-image", ref, "--db", str(db)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False, env=env)


@pytest.mark.docker
@pytest.mark.slow
def test_check_image_admits_only_a_signed_api_image_a_release_carries(signed_api: dict[str, Any], tmp_path: Path) -> None:
    from pipeline.infra.worker.api_image import check_api_image

    db = tmp_path / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        seed(queue, api=signed_api["api"])
        seed(queue, "acme/widget", {"v3.0.0": {"hello": (1, 1, 1)}}, api=signed_api["unsigned"])
    done = _check(signed_api, signed_api["api"], db)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["image"] == signed_api["api"] and found["release"] == f"{REPOSITORY}@v1.2.0"
    assert found["signer"] == f"https://github.com/{REPOSITORY}/.github/workflows/tag.yml@refs/tags/v1.2.0"
    assert found["image_id"].startswith("sha256:")
    # A release carries it, but nobody the policy admits signed it.
    unsigned = _check(signed_api, signed_api["unsigned"], db)
    assert unsigned.returncode == 1 and "is not signed by any identity the policy admits" in unsigned.stderr, unsigned.stderr
    # Signed, but no release in this queue carries it.
    with SqliteQueue(tmp_path / "other" / "infra" / "queue.sqlite3") as other:
        seed(other, api="127.0.0.1:5055/benchseal/api@sha256:" + "e" * 64)
    orphan = _check(signed_api, signed_api["api"], tmp_path / "other" / "infra" / "queue.sqlite3")
    assert orphan.returncode == 1 and "no release the infra accepted carries it" in orphan.stderr
    # The policy no longer admits that image for the repository.
    narrowed = yaml.safe_load(signed_api["policy"].read_text())
    narrowed["sources"][0]["images"]["api"] = narrowed["sources"][0]["images"]["api"][1:]
    policy = tmp_path / "narrowed.yaml"
    policy.write_text(yaml.safe_dump(narrowed))
    with SqliteQueue(db, read_only=True) as queue, pytest.raises(CheckFailed, match="not an allowed api image"):
        check_api_image(signed_api["api"], queue, signed_api["trust"], policy=load_policy(policy))
