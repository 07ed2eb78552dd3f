"""The runner's engine proxy against hostile requests: a fake engine on a Unix socket records what passes; the real
Engine (dockerd on /var/run/docker.sock) shows what a request that passes would do."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import io
import json
import socket
import tarfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import docker
import docker.errors
import pytest

from pipeline.imaging.build import ensure_local
from pipeline.infra.sandbox.engine_proxy import GATEWAY_LABEL, LABEL, EnginePolicy, EngineProxy


class FakeEngine(threading.Thread):
    """Answers 200 {} to everything, records each raw request; inspect says the container is (not) ours."""

    def __init__(self, path: Path, token: str, owned: set[str]) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.token, self.owned = token, owned
        self.requests: list[bytes] = []
        self.images: dict[str, dict[str, str]] = {}  # name (as in the path) -> its labels; others answer 404

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            data = b""
            try:
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    if b"\r\n\r\n" in data and (b"Content-Length" not in data.split(b"\r\n\r\n")[0]
                                                 or len(data.split(b"\r\n\r\n", 1)[1]) >= int(
                                                     data.split(b"Content-Length: ")[1].split(b"\r\n")[0])):
                        break
            except TimeoutError:
                pass
            line = data.split(b"\r\n", 1)[0].decode()
            body: dict[str, Any] = {}
            if line.startswith("GET /images/") and line.split()[1].endswith("/json"):
                name = line.split()[1].removeprefix("/images/").removesuffix("/json")
                if name not in self.images:  # an image that is not there (a new tag): the engine's 404
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    conn.close()
                    continue
                body = {"Config": {"Labels": self.images[name]}}
                raw = json.dumps(body).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
                conn.close()
                continue
            if "/json" in line and line.startswith("GET /containers/"):
                ident = line.split("/")[2]
                labels = {LABEL: self.token} if ident in self.owned else {}
                body = {"Config": {"Labels": labels}}
                if ident == "missing":
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    conn.close()
                    continue
            else:
                self.requests.append(data)
            raw = json.dumps(body).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
            conn.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Any:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "escape").symlink_to("/")
    policy = EnginePolicy(bind_roots=(run_dir,))
    engine = FakeEngine(tmp_path / "engine.sock", policy.token, owned={"mine"})
    engine.start()
    p = EngineProxy(tmp_path / "proxy.sock", policy, upstream=str(tmp_path / "engine.sock")).start()
    yield p, engine, run_dir
    p.stop()
    engine.sock.close()


def _send(p: EngineProxy, raw: bytes) -> tuple[int, bytes]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(p.socket_path))
    s.sendall(raw)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return int(data.split(b" ", 2)[1]), data


def _post(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (f"POST /v1.41{path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


@pytest.mark.parametrize(("case", "host_config"), [
    ("privileged", {"Privileged": True}),
    ("cap add", {"CapAdd": ["SYS_ADMIN"]}),
    ("device", {"Devices": [{"PathOnHost": "/dev/sda"}]}),
    ("host pid", {"PidMode": "host"}),
    ("host ipc", {"IpcMode": "host"}),
    ("host userns", {"UsernsMode": "host"}),
    ("host network", {"NetworkMode": "host"}),
    ("container network", {"NetworkMode": "container:other"}),
    ("bridge network", {"NetworkMode": "bridge"}),
    ("named network", {"NetworkMode": "benchseal-other-net"}),
    ("published port", {"PortBindings": {"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8080"}]}}),
    ("publish all", {"PublishAllPorts": True}),
    ("seccomp unconfined", {"SecurityOpt": ["seccomp=unconfined"]}),
    ("volumes from", {"VolumesFrom": ["other"]}),
    ("bind root", {"Binds": ["/:/host"]}),
    ("bind docker socket", {"Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}),
    ("bind traversal", {"Binds": ["RUN/../../etc:/x"]}),
    ("bind symlink", {"Binds": ["RUN/escape:/x"]}),
    ("mount etc", {"Mounts": [{"Type": "bind", "Source": "/etc", "Target": "/x"}]}),
    ("mount npipe", {"Mounts": [{"Type": "npipe", "Source": "x", "Target": "/x"}]}),
    ("volume with bind opts", {"Mounts": [{"Type": "volume", "Source": "v", "Target": "/x",
                                            "VolumeOptions": {"DriverConfig": {"Options": {"o": "bind"}}}}]}),
])
def test_dangerous_creates_are_refused(proxy: Any, case: str, host_config: dict[str, Any]) -> None:
    p, engine, run_dir = proxy
    host_config = json.loads(json.dumps(host_config).replace("RUN", str(run_dir)))
    status, data = _send(p, _post("/containers/create", {"Image": "x", "HostConfig": host_config}))
    assert status == 403 and b"benchseal engine proxy" in data, case
    assert engine.requests == []


def _refusal(data: bytes) -> str:
    return str(json.loads(data.partition(b"\r\n\r\n")[2])["message"])


@pytest.mark.parametrize("mode", ["rshared", "shared", "ro,rshared", "rw,shared", "rslave", "slave", "z", "Z"])
def test_bind_modes_outside_the_allow_list_are_refused(proxy: Any, mode: str) -> None:
    """``Binds`` modes: shared propagation would let a mount made in the container appear on the host (slave: the
    reverse), z/Z make the engine relabel the host directory. The same bind with allowed modes passes first, so
    the refusal is the mode's."""
    p, engine, run_dir = proxy
    (run_dir / "data").mkdir()
    status, _ = _send(p, _post("/containers/create", {"Image": "x", "HostConfig": {
        "Binds": [f"{run_dir}/data:/data:ro,rprivate"]}}))
    assert status == 200 and len(engine.requests) == 1
    status, data = _send(p, _post("/containers/create", {"Image": "x", "HostConfig": {
        "Binds": [f"{run_dir}/data:/data:{mode}"]}}))
    assert status == 403 and f"mode {mode!r} is not allowed" in _refusal(data), data
    assert len(engine.requests) == 1


@pytest.mark.parametrize("propagation", ["rshared", "shared", "rslave", "slave"])
def test_mount_propagation_outside_the_allow_list_is_refused(proxy: Any, propagation: str) -> None:
    """The same rule for ``Mounts`` (``BindOptions.Propagation``), with the same positive control."""
    p, engine, run_dir = proxy

    def create(value: str) -> tuple[int, bytes]:
        return _send(p, _post("/containers/create", {"Image": "x", "HostConfig": {"Mounts": [
            {"Type": "bind", "Source": str(run_dir), "Target": "/x", "BindOptions": {"Propagation": value}}]}}))

    assert create("rprivate")[0] == 200 and len(engine.requests) == 1
    status, data = create(propagation)
    assert status == 403 and f"Propagation={propagation!r} is not allowed" in _refusal(data), data
    assert len(engine.requests) == 1


def test_allowed_create_is_labelled_and_forwarded_alone(proxy: Any) -> None:
    p, engine, run_dir = proxy
    (run_dir / "logs").mkdir()
    status, _ = _send(p, _post("/containers/create", {"Image": "x", "Labels": {"a": "b"}, "HostConfig": {
        "Binds": [f"{run_dir}/logs:/logs", "/anonymous"], "NetworkMode": "none"}}))
    assert status == 200
    head, _, body = engine.requests[0].partition(b"\r\n\r\n")
    assert json.loads(body)["Labels"] == {"a": "b", LABEL: p.policy.token}
    assert b"Connection: close" in head and f"Content-Length: {len(body)}".encode() in head
    # The default network (what `docker run` asks for) becomes none; extra endpoints are dropped.
    status, _ = _send(p, _post("/containers/create", {"Image": "x", "HostConfig": {"NetworkMode": "default"},
                                                      "NetworkingConfig": {"EndpointsConfig": {"bridge": {}}}}))
    assert status == 200
    forced = json.loads(engine.requests[1].partition(b"\r\n\r\n")[2])
    assert forced["HostConfig"]["NetworkMode"] == "none" and "NetworkingConfig" not in forced


def test_forwarded_create_is_the_canonical_body_that_was_checked(proxy: Any) -> None:
    """Keys as Go maps them, only known fields, zero-valued unknown ones dropped: the engine decodes what passed."""
    p, engine, run_dir = proxy
    (run_dir / "logs").mkdir()
    raw = json.dumps({"image": "x", "cmd": "true", "Annotations": None, "hostconfig": {
        "binds": [f"{run_dir}/logs/../logs:/logs:ro"], "privileged": False, "networkmode": "default",
        "NotYetKnown": 0}}).encode()
    status, _ = _send(p, (f"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: {len(raw)}\r\n\r\n").encode()
                      + raw)
    assert status == 200
    forwarded = json.loads(engine.requests[0].partition(b"\r\n\r\n")[2])
    assert forwarded == {"Image": "x", "Cmd": "true", "NetworkDisabled": False, "Labels": {LABEL: p.policy.token},
                         "HostConfig": {"Binds": [f"{run_dir.resolve()}/logs:/logs:ro"], "NetworkMode": "none",
                                        # The bounds every container gets (limits.enforce), none asked for here.
                                        "Memory": 2 << 30, "MemorySwap": 2 << 30, "NanoCpus": 1_000_000_000,
                                        "PidsLimit": 1024, "Ulimits": [{"Name": "fsize", "Soft": 1 << 30,
                                                                        "Hard": 1 << 30}]}}


def test_build_steps_run_without_network(proxy: Any) -> None:
    p, engine, _ = proxy
    for query in ("t=a", "t=a&networkmode=default", "networkmode=none&t=a"):
        status, _ = _send(p, f"POST /v1.41/build?{query} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n".encode())
        assert status == 200, query
    lines = [r.split(b"\r\n", 1)[0].decode() for r in engine.requests]
    assert all(line.count("networkmode=") == 1 and "networkmode=none" in line for line in lines), lines
    for mode in ("bridge", "host", "container%3Aother", "some-net"):
        status, _ = _send(p, f"POST /v1.41/build?networkmode={mode} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n".encode())
        assert status == 403, mode
    assert len(engine.requests) == 3


@pytest.mark.parametrize("body", [b"[]", b'{"HostConfig": []}', b'{"HostConfig": {"Mounts": ["x"]}}', b'"x"'])
def test_malformed_create_bodies_are_refused(proxy: Any, body: bytes) -> None:
    p, engine, _ = proxy
    raw = (f"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    status, _ = _send(p, raw)
    assert status == 403 and engine.requests == []


def test_smuggling_and_framing_tricks_are_refused(proxy: Any) -> None:
    p, engine, _ = proxy
    evil = _post("/containers/create", {"Image": "x", "HostConfig": {"Privileged": True}})
    # A second request pipelined on a kept-alive connection, after a body, or after an Upgrade header on a
    # call that is no upgrade: refused, the engine sees nothing.
    for first in (b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: keep-alive\r\n\r\n",
                  _post("/containers/create", {"Image": "x"}),
                  b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"):
        status, _ = _send(p, first + evil)
        assert status == 403, first
    for raw in (
        b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",  # no upgrade route
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        b"5\r\n{}   \r\n0\r\n\r\n",  # both framings
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ",
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length : 2\r\n\r\n{}",
        b"GET /containers/json HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}",  # a body on GET
        b"POST /build HTTP/1.1\r\nHost: d\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 17\r\n\r\nnetworkmode=host&",  # the engine reads form bodies as query parameters
        b"POST /containers/mine/%73tart/../start HTTP/1.1\r\nHost: d\r\n\r\n",
        b"POST /containers/mine/st%zzart HTTP/1.1\r\nHost: d\r\n\r\n",
        b"POST /containers/mine/start?a=1;b=2 HTTP/1.1\r\nHost: d\r\n\r\n",
        b"GET /_ping HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ):
        status, _ = _send(p, raw)
        assert status == 403, raw[:120]
    assert engine.requests == []
    # A chunked body is decoded and checked like any other, and re-framed by the proxy.
    body = json.dumps({"Image": "x", "HostConfig": {"Privileged": True}}).encode()
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    head = b"POST /containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert _send(p, head + chunked + b"0\r\n\r\n")[0] == 403
    ok = b'{"Image": "x"}'
    assert _send(p, head + b"%x\r\n%b\r\n0\r\n\r\n" % (len(ok), ok))[0] == 200
    forwarded = engine.requests[0]
    assert b"Transfer-Encoding" not in forwarded and b"Connection: close" in forwarded
    assert json.loads(forwarded.partition(b"\r\n\r\n")[2])["Image"] == "x"


@pytest.mark.parametrize(("request_line", "allowed"), [
    ("POST /v1.41/containers/mine/start", True),
    ("POST /v1.41/containers/other/start", False),
    ("GET /v1.41/containers/other/json", False),
    ("POST /v1.41/containers/other/exec", False),
    ("DELETE /v1.41/containers/other?force=1", False),
    ("PUT /v1.41/containers/other/archive?path=/", False),
    ("POST /v1.41/images/create?fromImage=evil/image&tag=latest", False),
    ("DELETE /v1.41/images/benchseal%2Fbase:latest", False),
    ("POST /v1.41/build?networkmode=host", False),
    ("POST /v1.41/build?remote=https%3A%2F%2Fexample.test%2Fctx.tar", False),
    ("POST /v1.41/build?t=task-main", True),
    ("POST /v1.41/grpc", False),
    ("POST /v1.41/session", False),
    ("POST /v1.41/swarm/init", False),
    ("POST /v1.41/plugins/pull?remote=x", False),
    ("POST /v1.41/networks/create", False),
    ("POST /v1.41/networks/bridge/connect", False),
    ("POST /v1.41/containers/mine/update", True),
    ("POST /v1.41/containers/prune", False),
    ("GET /v1.41/_ping", True),
    ("GET /v1.41/containers/json?all=1", True),
])
def test_operations_only_on_own_containers(proxy: Any, request_line: str, allowed: bool) -> None:
    p, engine, _ = proxy
    status, _ = _send(p, f"{request_line} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n".encode())
    assert (status == 200) is allowed, (request_line, status)
    assert (len(engine.requests) == 1) is allowed


def test_missing_container_is_the_engines_404(proxy: Any) -> None:
    p, engine, _ = proxy
    status, _ = _send(p, b"GET /containers/missing/json HTTP/1.1\r\nHost: d\r\n\r\n")
    assert status == 404 and engine.requests == []


def test_only_images_built_through_the_proxy_may_be_removed(proxy: Any) -> None:
    p, engine, _ = proxy
    assert _send(p, b"DELETE /v1.41/images/task-main:latest HTTP/1.1\r\nHost: d\r\n\r\n")[0] == 403
    assert _send(p, b"POST /v1.41/build?t=task-main HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n")[0] == 200
    assert _send(p, b"DELETE /v1.41/images/task-main:latest HTTP/1.1\r\nHost: d\r\n\r\n")[0] == 200
    assert _send(p, b"DELETE /v1.41/images/task-main HTTP/1.1\r\nHost: d\r\n\r\n")[0] == 200
    assert _send(p, b"DELETE /v1.41/images/task-main:other HTTP/1.1\r\nHost: d\r\n\r\n")[0] == 403
    assert len(engine.requests) == 3


def test_what_the_runner_creates_carries_the_workers_labels_and_none_of_benchseals_own(tmp_path: Path) -> None:
    """The worker's run and batch labels are set over the runner's (it removes by them); a label naming
    benchseal (the worker's task hash, the proxy's own, a gateway's) is refused wherever the runner sets one."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = EnginePolicy(bind_roots=(run_dir,), labels={"benchseal.infra.run_id": "run-" + "1" * 20})
    engine = FakeEngine(tmp_path / "engine.sock", policy.token, owned={"mine"})
    engine.start()
    p = EngineProxy(tmp_path / "proxy.sock", policy, upstream=str(tmp_path / "engine.sock")).start()
    try:
        own = {"benchseal.infra.run_id": "run-" + "1" * 20, LABEL: policy.token}
        assert _send(p, _post("/containers/create", {"Image": "x", "Labels": {"com.example": "1"}}))[0] == 200
        assert json.loads(engine.requests[-1].split(b"\r\n\r\n", 1)[1])["Labels"] == {"com.example": "1", **own}
        assert _send(p, _post("/volumes/create", {"Name": "v"}))[0] == 200
        assert json.loads(engine.requests[-1].split(b"\r\n\r\n", 1)[1])["Labels"] == own
        labels = quote(json.dumps({"com.example": "1"}))
        assert _send(p, f"POST /v1.41/build?t=a&labels={labels} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n"
                     .encode())[0] == 200
        target = engine.requests[-1].split(b" ", 2)[1].decode()
        assert json.loads(parse_qs(target.split("?", 1)[1])["labels"][0]) == {"com.example": "1", **own}
        # A container's removal takes its anonymous volumes along.
        assert _send(p, b"DELETE /v1.41/containers/mine?v=0 HTTP/1.1\r\nHost: d\r\n\r\n")[0] == 200
        assert engine.requests[-1].startswith(b"DELETE /v1.41/containers/mine?v=1 ")
        count = len(engine.requests)
        for key in ("benchseal.task.hash", "BENCHSEAL.infra.batch", "dev.benchseal.agent", LABEL, GATEWAY_LABEL):
            assert _send(p, _post("/containers/create", {"Image": "x", "Labels": {key: "1"}}))[0] == 403, key
            assert _send(p, _post("/volumes/create", {"Labels": {key: "1"}}))[0] == 403, key
            query = quote(json.dumps({key: "1"}))
            assert _send(p, f"POST /v1.41/build?labels={query} HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n"
                         .encode())[0] == 403, key
        # A build may not take the name of an image already there (its removal would then be allowed).
        engine.images["taken"] = {}
        assert _send(p, b"POST /v1.41/build?t=taken HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n")[0] == 403
        assert len(engine.requests) == count
    finally:
        p.stop()
        engine.sock.close()


# --- against the real Engine: the proxy parses as dockerd does ------------------------
# Each hostile request below got through the previous proxy and the Engine acted on it (a privileged or
# host-namespace container, a host bind, a fetch by dockerd); here each is refused and nothing happens.

ENGINE = "/var/run/docker.sock"


@dataclass
class Real:
    proxy: EngineProxy
    run_dir: Path
    image: str
    client: docker.DockerClient
    names: list[str]  # names given to containers a request tried to create (removed afterwards)

    def name(self, prefix: str) -> str:
        self.names.append(f"{prefix}-{uuid.uuid4().hex[:10]}")
        return self.names[-1]

    def named(self, name: str) -> list[Any]:
        return [c for c in self.client.containers.list(all=True, filters={"name": name}) if c.name == name]


@pytest.fixture
def real(tmp_path: Path, base_refs: Any) -> Iterator[Real]:
    base = base_refs["base"]
    ensure_local(base)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = EnginePolicy(bind_roots=(run_dir,))
    p = EngineProxy(tmp_path / "real.sock", policy, upstream=ENGINE).start()
    client = docker.from_env()
    state = Real(p, run_dir, base.ref, client, [])
    yield state
    p.stop()
    leftovers = client.containers.list(all=True, filters={"label": f"{LABEL}={policy.token}"})
    for container in leftovers + [c for n in state.names for c in state.named(n)]:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=120)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(str(self._path))


def _call(p: EngineProxy, method: str, path: str, body: bytes | dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request through the proxy as the docker CLI sends it (no half-close)."""
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    conn = _UnixConnection(p.socket_path)
    try:
        conn.request(method, path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _raw(p: EngineProxy, data: bytes, wait: float = 5) -> bytes:
    """Raw bytes through the proxy; whatever comes back until the connection closes (or ``wait`` passes)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(wait)
    s.connect(str(p.socket_path))
    s.sendall(data)
    out = b""
    with contextlib.suppress(TimeoutError, OSError):
        while chunk := s.recv(65536):
            out += chunk
    s.close()
    return out


@pytest.fixture(scope="module")
def victim(base_refs: Any) -> Iterator[str]:
    """A container the runner did not create (another tenant's)."""
    base = base_refs["base"]
    ensure_local(base)
    container = docker.from_env().containers.run(base.ref, ["sleep", "300"], detach=True, network_mode="none",
                                                 labels={"benchseal.test": "engine-proxy-victim"})
    yield str(container.id)
    container.remove(force=True)


_HOSTILE_CREATES = [
    ("lower-case privileged", '{"HostConfig": {"privileged": true}}'),
    ("lower-case HostConfig (merged with the proxy's own)", '{"hostconfig": {"Privileged": true}}'),
    ("HostConfig twice in two cases", '{"HostConfig": {}, "hostconfig": {"Privileged": true}}'),
    ("exact duplicate key", '{"HostConfig": {"Privileged": true, "Privileged": false}}'),
    ("privileged at the top level (deprecated embedded HostConfig)", '{"Privileged": true}'),
    ("lower-case binds", '{"HostConfig": {"binds": ["/etc:/x"]}}'),
    ("Binds twice, the last wins", '{"HostConfig": {"Binds": [], "binds": ["/:/host"]}}'),
    ("Mounts twice, the last wins",
     '{"HostConfig": {"Mounts": [], "mounts": [{"Type": "bind", "Source": "/etc", "Target": "/x"}]}}'),
    ("lower-case mount fields", '{"HostConfig": {"Mounts": [{"type": "bind", "source": "/etc", "target": "/x"}]}}'),
    ("networkmode after NetworkMode", '{"HostConfig": {"NetworkMode": "none", "networkmode": "host"}}'),
    ("lower-case pidmode", '{"HostConfig": {"pidmode": "host"}}'),
    ("lower-case capadd", '{"HostConfig": {"capadd": ["SYS_ADMIN"]}}'),
    ("lower-case devices", '{"HostConfig": {"devices": [{"PathOnHost": "/dev/zero", "PathInContainer": "/dev/hz",'
                           ' "CgroupPermissions": "rwm"}]}}'),
    ("long s folds to S (SecurityOpt)", '{"HostConfig": {"\\u017fecurityOpt": ["seccomp=unconfined"]}}'),
    ("Kelvin sign folds to K", '{"HostConfig": {"\\u212aernelMemoryTCP": 1}}'),
    ("MaskedPaths empty", '{"HostConfig": {"MaskedPaths": []}}'),
    ("ReadonlyPaths empty", '{"HostConfig": {"ReadonlyPaths": []}}'),
    ("custom seccomp profile", '{"HostConfig": {"SecurityOpt": ["seccomp={\\"defaultAction\\": \\"SCMP_ACT_ALLOW\\"}"]}}'),
    ("selinux label", '{"HostConfig": {"SecurityOpt": ["label=type:spc_t"]}}'),
    ("pid of another container", '{"HostConfig": {"PidMode": "container:VICTIM"}}'),
    ("ipc of another container", '{"HostConfig": {"IpcMode": "container:VICTIM"}}'),
    ("cgroup of another container", '{"HostConfig": {"Cgroup": "container:VICTIM"}}'),
    ("named volume bind", '{"HostConfig": {"Binds": ["benchseal-p2-named:/x"]}}'),
    ("named volume mount", '{"HostConfig": {"Mounts": [{"Type": "volume", "Source": "benchseal-p2-named", '
                           '"Target": "/x"}]}}'),
    ("sysctls", '{"HostConfig": {"Sysctls": {"kernel.msgmax": "65536"}}}'),
    ("cgroup parent", '{"HostConfig": {"CgroupParent": "/benchseal-p2"}}'),
    ("runtime", '{"HostConfig": {"Runtime": "io.containerd.runc.v2"}}'),
    ("oom kill disabled", '{"HostConfig": {"OomKillDisable": true}}'),
    ("tmpfs with dev,suid", '{"HostConfig": {"Tmpfs": {"/x": "dev,suid,exec"}}}'),
    ("huge shm", '{"HostConfig": {"ShmSize": 1099511627776}}'),
    ("ulimits", '{"HostConfig": {"Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}]}}'),
    ("init as a path", '{"HostConfig": {"Init": "/bin/sh"}}'),
    ("log driver shipping logs over the network",
     '{"HostConfig": {"LogConfig": {"Type": "syslog", "Config": {"syslog-address": "tcp://127.0.0.1:9"}}}}'),
    ("restart policy always (restarted without the proxy)", '{"HostConfig": {"RestartPolicy": {"Name": "always"}}}'),
    ("legacy link", '{"HostConfig": {"Links": ["VICTIM:v"]}}'),
    ("bind propagation shared", '{"HostConfig": {"Mounts": [{"Type": "bind", "Source": "RUN", "Target": "/x", '
                                '"BindOptions": {"Propagation": "rshared"}}]}}'),
    ("unknown field", '{"HostConfig": {"NotAField": "x"}}'),
    ("NaN", '{"HostConfig": {"Memory": NaN}}'),
]


@pytest.mark.docker
@pytest.mark.parametrize(("case", "body"), _HOSTILE_CREATES, ids=[c for c, _ in _HOSTILE_CREATES])
def test_create_bodies_are_read_as_the_engine_reads_them(real: Real, victim: str, case: str, body: str) -> None:
    spec = body.replace("VICTIM", victim).replace("RUN", str(real.run_dir))
    raw = (f'{{"Image": "{real.image}", "Cmd": ["true"], ' + spec[1:]).encode()
    name = real.name("p2-json")
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/create?name={name}", raw)
    assert status == 403 and b"benchseal engine proxy" in answer, (case, status, answer[:300])
    assert real.named(name) == [], case


@pytest.mark.docker
def test_legitimate_create_is_forwarded_canonical(real: Real) -> None:
    (real.run_dir / "data").mkdir()
    (real.run_dir / "data" / "f").write_text("from the run dir\n")
    link = real.run_dir / "via-link"
    link.symlink_to(real.run_dir / "data")  # a symlink INSIDE the roots: allowed, forwarded resolved
    name = real.name("p2-ok")
    body = {"Image": real.image, "Cmd": ["cat", "/data/f", "/link/f"], "Labels": {"a": "b"}, "HostConfig": {
        "Binds": [f"{real.run_dir}/data:/data:ro", f"{link}:/link"], "NetworkMode": "default",
        "Tmpfs": {"/scratch": "rw,noexec,size=1m"}, "SecurityOpt": ["no-new-privileges"], "CapDrop": ["ALL"],
        "MaskedPaths": None, "Privileged": False, "Devices": [], "Memory": 64 << 20}}
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/create?name={name}", body)
    assert status == 201, answer
    ident = json.loads(answer)["Id"]
    assert _call(real.proxy, "POST", f"/v1.41/containers/{ident}/start")[0] == 204
    container = real.client.containers.get(ident)
    assert container.wait(timeout=60)["StatusCode"] == 0
    assert container.logs() == b"from the run dir\nfrom the run dir\n"
    host = container.attrs["HostConfig"]
    assert host["Binds"] == [f"{real.run_dir}/data:/data:ro", f"{real.run_dir}/data:/link"]
    assert host["NetworkMode"] == "none" and not host["Privileged"]
    assert container.labels[LABEL] == real.proxy.policy.token and container.labels["a"] == "b"


@pytest.mark.docker
def test_exec_and_volume_bodies_are_read_as_the_engine_reads_them(real: Real) -> None:
    name = real.name("p2-exec")
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/create?name={name}",
                           {"Image": real.image, "Cmd": ["sleep", "60"]})
    assert status == 201, answer
    ident = json.loads(answer)["Id"]
    assert _call(real.proxy, "POST", f"/v1.41/containers/{ident}/start")[0] == 204
    for raw in (b'{"Cmd": ["true"], "privileged": true}', b'{"Cmd": ["true"], "PRIVILEGED": true}',
                b'{"Cmd": ["true"], "Privileged": false, "privileged": true}', b'{"Cmd": ["true"], "Privileged": 1}'):
        status, answer = _call(real.proxy, "POST", f"/v1.41/containers/{ident}/exec", raw)
        assert status == 403, (raw, answer)
    assert real.client.api.inspect_container(ident)["ExecIDs"] is None
    # A plain exec still works, through the proxy's real upgrade path (hijacked stream after 101).
    sdk = docker.DockerClient(base_url=f"unix://{real.proxy.socket_path}")
    result = sdk.containers.get(ident).exec_run(["sh", "-c", "echo exec-ok"])
    assert result.exit_code == 0 and result.output == b"exec-ok\n"
    volume = f"benchseal-p2-{uuid.uuid4().hex[:8]}"
    for opts in ('"driveropts"', '"DRIVEROPTS"', '"DriverOpts": {}, "driverOpts"'):
        raw = f'{{"Name": "{volume}", {opts}: {{"type": "none", "o": "bind", "device": "/"}}}}'.encode()
        assert _call(real.proxy, "POST", "/v1.41/volumes/create", raw)[0] == 403, opts
    assert volume not in [v.name for v in real.client.volumes.list()]


@pytest.mark.docker
def test_ownership_is_remembered_by_full_id_only(real: Real, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container the proxy found its own is not inspected again for its exec, archive and removal requests (two
    engine round trips a request, five an exec): by its full id only. A name is looked up every time: once the
    container is gone, the name can be another's, which stays refused."""
    name = real.name("memo")
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/create?name={name}",
                           {"Image": real.image, "Cmd": ["sleep", "60"]})
    assert status == 201, answer
    ident = json.loads(answer)["Id"]
    assert _call(real.proxy, "POST", f"/v1.41/containers/{ident}/start")[0] == 204  # inspected (its binds)
    inspected: list[str] = []
    inspect = real.proxy._inspect

    def counted(path: str) -> dict[str, Any]:
        inspected.append(path)
        return inspect(path)

    monkeypatch.setattr(real.proxy, "_inspect", counted)
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/{ident}/exec", {"Cmd": ["true"]})
    assert status == 201, answer
    exec_id = json.loads(answer)["Id"]
    assert _call(real.proxy, "POST", f"/v1.41/exec/{exec_id}/start", {"Detach": True})[0] == 200
    assert _call(real.proxy, "GET", f"/v1.41/exec/{exec_id}/json")[0] == 200
    assert _call(real.proxy, "HEAD", f"/v1.41/containers/{ident}/archive?path=/etc")[0] == 200
    assert inspected == [f"/exec/{exec_id}/json"]  # the exec's container once, by its id: never again
    assert _call(real.proxy, "POST", f"/v1.41/containers/{name}/exec", {"Cmd": ["true"]})[0] == 201
    assert _call(real.proxy, "POST", f"/v1.41/containers/{name}/exec", {"Cmd": ["true"]})[0] == 201
    assert inspected[1:] == [f"/containers/{name}/json"] * 2  # by name: looked up each time
    assert _call(real.proxy, "DELETE", f"/v1.41/containers/{ident}?force=1")[0] == 204
    other = real.client.containers.create(real.image, ["sleep", "60"], name=name)  # the name, not the proxy's
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/{name}/exec", {"Cmd": ["true"]})
    assert status == 403 and b"not created by this runner" in answer, answer
    assert _call(real.proxy, "POST", f"/v1.41/containers/{other.id}/exec", {"Cmd": ["true"]})[0] == 403
    assert real.client.api.inspect_container(other.id)["ExecIDs"] is None


@pytest.mark.docker
@pytest.mark.parametrize("first", [
    b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nHost: d\r\nupgrade: h2c\r\nConnection: keep-alive\r\n\r\n",
    b"GET /version HTTP/1.1\r\nHost: d\r\nUpgrade: tcp\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: keep-alive\r\n\r\n",
    b"GET /_ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"POST /v1.41/containers/create HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
], ids=["upgrade", "upgrade-lower-case", "upgrade-no-connection", "keep-alive", "http-1.0", "after-chunked"])
def test_nothing_after_the_request_reaches_the_engine(real: Real, first: bytes) -> None:
    name = real.name("p2-smuggled")
    evil = json.dumps({"Image": real.image, "Cmd": ["true"], "HostConfig": {"Privileged": True}}).encode()
    second = (f"POST /v1.41/containers/create?name={name} HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(evil)}\r\n\r\n").encode() + evil
    answer = _raw(real.proxy, first + second)
    assert real.named(name) == [], answer[:400]
    assert answer.startswith(b"HTTP/1.1 403"), answer[:400]
    # A body on a GET that carries a second request: refused as well.
    answer = _raw(real.proxy, b"GET /_ping HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n" % len(second) + second)
    assert answer.startswith(b"HTTP/1.1 403") and real.named(name) == []


def _create_bound(real: Real, binds: list[str] | None = None, mounts: list[dict[str, Any]] | None = None,
                  cmd: tuple[str, ...] = ("cat", "/data/secret")) -> str:
    host: dict[str, Any] = {"Binds": binds} if binds else {"Mounts": mounts}
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/create?name={real.name('p2-bind')}",
                           {"Image": real.image, "Cmd": list(cmd), "HostConfig": host})
    assert status == 201, answer
    return str(json.loads(answer)["Id"])


def _swap_for_symlink(path: Path, target: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))  # (a running container keeps the directory it mounted)
    path.symlink_to(target)


@pytest.mark.docker
@pytest.mark.parametrize("how", ["binds", "mounts", "parent", "restart", "encoded-start"])
def test_bind_swapped_for_a_symlink_after_create_is_refused_at_start(real: Real, tmp_path: Path, how: str) -> None:
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "secret").write_text("host file\n")
    (outside / "b" / "secret").write_text("host file\n")
    data = real.run_dir / "data"
    (data / "b").mkdir(parents=True)
    (data / "secret").write_text("run dir\n")
    (data / "b" / "secret").write_text("run dir\n")
    if how == "mounts":
        ident = _create_bound(real, mounts=[{"Type": "bind", "Source": str(data), "Target": "/data"}])
    elif how == "parent":  # the bound directory stays; a component above it becomes a symlink
        ident = _create_bound(real, binds=[f"{data}/b:/data:ro"])
    else:
        ident = _create_bound(real, binds=[f"{data}:/data:ro"],
                              cmd=("sleep", "60") if how == "restart" else ("cat", "/data/secret"))
    if how == "restart":
        assert _call(real.proxy, "POST", f"/v1.41/containers/{ident}/start")[0] == 204
    _swap_for_symlink(data, outside)
    call = {"restart": "restart", "encoded-start": "%73tart"}.get(how, "start")
    status, answer = _call(real.proxy, "POST", f"/v1.41/containers/{ident}/{call}")
    assert status == 403 and b"symlink" in answer, (status, answer)
    container = real.client.containers.get(ident)
    if how == "restart":
        assert container.status == "running"  # not restarted: still the mount it started with
        assert container.exec_run(["cat", "/data/secret"]).output == b"run dir\n"
    else:
        assert container.status == "created" and b"host file" not in container.logs()


# --- builds: dockerd fetches nothing -------------------------------------------------

class _Listener(http.server.ThreadingHTTPServer):
    """A local HTTP server: every request dockerd makes to it is recorded (none may come)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                listener.requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.send_header("Content-Length", "3")
                self.end_headers()
                self.wfile.write(b"hi\n")

            do_HEAD = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def listener() -> Iterator[_Listener]:
    server = _Listener()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _context(files: dict[str, str | bytes | tuple[str, str]], gzip: bool = False) -> bytes:
    """A build context tar: name -> content, or name -> ("symlink", target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gzip else "w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            if isinstance(content, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, content[1]
                archive.addfile(info)
            else:
                data = content.encode() if isinstance(content, str) else content
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _build(real: Real, context: bytes, query: str = "", content_type: str = "application/x-tar") -> tuple[int, bytes]:
    tag = f"benchseal-p2-build-{uuid.uuid4().hex[:10]}"
    status, answer = _call(real.proxy, "POST", f"/v1.41/build?t={tag}{query}", context,
                           headers={"Content-Type": content_type})
    with contextlib.suppress(docker.errors.APIError):
        real.client.images.remove(tag, force=True)
    return status, answer


_HOSTILE_BUILDS: list[tuple[str, dict[str, str | bytes | tuple[str, str]], str]] = [
    ("ADD of a URL", {"Dockerfile": "FROM BASE\nADD http://SRV/a /a\n"}, ""),
    ("lower-case add", {"Dockerfile": "FROM BASE\nadd http://SRV/b /b\n"}, ""),
    ("keyword split by a continuation", {"Dockerfile": "FROM BASE\nAD\\\nD http://SRV/c /c\n"}, ""),
    ("source after a continuation and a comment", {"Dockerfile": "FROM BASE\nADD \\\n# x\n  http://SRV/d /d\n"}, ""),
    ("escape directive", {"Dockerfile": "# escape=`\nFROM BASE\nADD `\n  http://SRV/e /e\n"}, ""),
    ("URL from an ARG", {"Dockerfile": "FROM BASE\nARG U=http://SRV/f\nADD $U /f\n"}, ""),
    ("URL from a build arg", {"Dockerfile": "FROM BASE\nARG U\nADD ${U} /g\n"},
     "&buildargs=" + quote(json.dumps({"U": "http://SRV/g"}))),
    ("URL escaped", {"Dockerfile": "FROM BASE\nADD h\\ttp://SRV/h /h\n"}, ""),
    ("JSON form", {"Dockerfile": 'FROM BASE\nADD ["http://SRV/i", "/i"]\n'}, ""),
    ("named Dockerfile", {"sub/Build.df": "FROM BASE\nADD http://SRV/j /j\n"}, "&dockerfile=sub%2FBuild.df"),
    ("lower-case fallback name", {"dockerfile": "FROM BASE\nADD http://SRV/k /k\n"}, ""),
    ("symlinked Dockerfile", {"real.txt": "FROM BASE\nADD http://SRV/l /l\n", "Dockerfile": ("symlink", "real.txt")},
     ""),
    ("Dockerfile twice in the tar", {"Dockerfile": "FROM BASE\n", "./Dockerfile": "FROM BASE\nADD http://SRV/m /m\n"},
     ""),
    ("base image from another registry (a pull)", {"Dockerfile": "FROM SRV/p2/none:latest\n"}, ""),
    ("COPY --from another registry (a pull)", {"Dockerfile": "FROM BASE\nCOPY --from=SRV/p2/none:1 /x /x\n"}, ""),
    ("ONBUILD", {"Dockerfile": "FROM BASE\nONBUILD ADD http://SRV/n /n\n"}, ""),
    ("remote context", {"Dockerfile": "FROM BASE\n"}, "&remote=http%3A%2F%2FSRV%2Fctx.tar"),
    ("BuildKit", {"Dockerfile": "FROM BASE\n"}, "&version=2"),
    ("platform flag (a pull)", {"Dockerfile": "FROM --platform=linux/arm64 BASE\n"}, ""),
]


@pytest.mark.docker
@pytest.mark.parametrize(("case", "files", "query"), _HOSTILE_BUILDS, ids=[c for c, _, _ in _HOSTILE_BUILDS])
def test_builds_make_the_engine_fetch_nothing(real: Real, listener: _Listener, case: str,
                                              files: dict[str, Any], query: str) -> None:
    def fill(text: str) -> str:
        return text.replace("BASE", real.image).replace("SRV", listener.address)

    context = _context({fill(k): (v if isinstance(v, tuple) else fill(v)) for k, v in files.items()})
    status, answer = _build(real, context, fill(query))
    assert status == 403 and b"benchseal engine proxy" in answer, (case, status, answer[-400:])
    assert listener.requests == [], case


@pytest.mark.docker
def test_build_smuggled_parameters_and_pulls_fetch_nothing(real: Real, listener: _Listener) -> None:
    # Query parameters in a form body (the engine's ParseForm reads them): a remote context.
    form = f"remote=http%3A%2F%2F{listener.address}%2Fctx.tar".encode()
    assert _build(real, form, content_type="application/x-www-form-urlencoded")[0] == 403
    # pull=1 of a base that is local but named after a registry: the engine would contact it.
    local = f"{listener.address}/p2/base:latest"
    real.client.images.get(real.image).tag(local)
    try:
        context = _context({"Dockerfile": f"FROM {local}\n"})
        assert _build(real, context, "&pull=1")[0] == 403
        assert _build(real, context, "&pull=true")[0] == 403
        gz = _context({"Dockerfile": f"FROM {real.image}\nADD http://{listener.address}/gz /gz\n"}, gzip=True)
        assert _build(real, gz)[0] == 403  # a compressed context is read too
    finally:
        real.client.images.remove(local)
    assert listener.requests == []


@pytest.mark.docker
def test_a_base_with_onbuild_triggers_is_refused(real: Real, listener: _Listener) -> None:
    """An image already in the engine (built without the proxy) whose ONBUILD trigger fetches a URL."""
    parent = f"benchseal-p2-onbuild-{uuid.uuid4().hex[:8]}"
    context = _context({"Dockerfile": f"FROM {real.image}\nONBUILD ADD http://{listener.address}/trigger /t\n"})
    real.client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=parent, network_mode="none")
    try:
        status, answer = _build(real, _context({"Dockerfile": f"FROM {parent}\n"}))
        assert status == 403 and b"ONBUILD" in answer, answer[-400:]
    finally:
        real.client.images.remove(parent, force=True)
    assert listener.requests == []


@pytest.mark.docker
def test_legitimate_build_still_works(real: Real, listener: _Listener) -> None:
    inner = _context({"payload.txt": "from a local archive\n"})
    context = _context({"Dockerfile": f"# a comment\nFROM {real.image} AS base\nCOPY hello.txt /hello.txt\n"
                                      "ADD inner.tar /unpacked/\nRUN cat /hello.txt /unpacked/payload.txt\n"
                                      "FROM base\nCOPY --from=base /hello.txt /again.txt\n",
                        "hello.txt": "hello\n", "inner.tar": inner})
    status, answer = _build(real, context, "&pull=0")
    assert status == 200 and b"Successfully built" in answer and b"errorDetail" not in answer, answer[-600:]
    assert listener.requests == []
