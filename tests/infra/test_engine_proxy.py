"""The runner's engine proxy against hostile requests (a fake engine on a Unix socket records what passes)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.infra.engine_proxy import LABEL, EnginePolicy, EngineProxy


class FakeEngine(threading.Thread):
    """Answers 200 {} to everything, records each raw request; inspect says the container is (not) ours."""

    def __init__(self, path: Path, token: str, owned: set[str]) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.token, self.owned = token, owned
        self.requests: list[bytes] = []

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
