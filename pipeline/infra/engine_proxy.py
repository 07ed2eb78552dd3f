"""An API-filtering Docker Engine socket for the runner container (no root-equivalent access).

The runner (Harbor + compose) gets this proxy's Unix socket as its
``/var/run/docker.sock`` instead of the engine's. Every request is checked
before it is forwarded, one request per upstream connection (``Connection:
close`` is forced, so a kept-alive connection cannot smuggle a second,
unchecked request; hijacked exec/attach streams stay raw after the check):

* container create: no privileged, no added capabilities, no devices, no host
  PID/IPC/UTS/user/cgroup namespaces, no seccomp/apparmor ``unconfined``, no
  ``VolumesFrom``, no published ports, and every bind mount's source (symlinks
  resolved on the host) under the allowed roots (the run dir); the proxy labels
  what it creates;
* egress: a container asks for no network (``none``, or the default) or is
  refused (bridge, host, ``container:``, any named network); the proxy then
  forces ``NetworkMode`` itself and drops ``NetworkingConfig``: ``none``, or,
  when the policy names a model gateway, ``container:<gateway>``, the network
  namespace of a gateway container it starts for that one container (network
  ``none``, the worker's model relay socket mounted, ``python3 -m
  pipeline.infra.relay``), so the trial reaches the model on
  ``127.0.0.1:GATEWAY_PORT`` and nothing else; the gateway is removed with its
  container and when the proxy stops. Gateways are not addressable by the runner;
* ``/build`` runs its steps with ``networkmode=none`` (forced; any other mode is
  refused), so a build step has no network either;
* everything that addresses a container or an exec (start, stop, kill, exec,
  attach, archive, logs, inspect, delete...) only for containers this proxy
  labelled: no exec into, or inspect of, any other container;
* image pulls only of the allowlisted repositories; volume create without
  driver options (a ``local`` volume with ``o=bind`` is a bind mount);
* read-only listings and ``/_ping``, ``/version``, ``/info``; anything else is
  refused with 403 and logged.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from pipeline.infra.relay import GATEWAY_PORT, _splice

log = logging.getLogger("benchseal.engine_proxy")

LABEL = "benchseal.engine-proxy"
GATEWAY_LABEL = "benchseal.engine-proxy.gateway"  # on a gateway: "1"; on a trial container: its gateway's id
_MAX_HEAD = 65536
_MAX_BODY = 4 * 1024 * 1024
_VERSION = re.compile(r"^/v[0-9]+\.[0-9]+(?=/)")
_ID = r"([^/]+)"
_HOST_MODES = ("PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode")


class Refused(Exception):
    """A request the proxy will not forward (its message goes back to the client)."""

    status = 403


class NotFound(Refused):
    """The addressed container or exec does not exist (the engine's 404, passed on)."""

    status = 404


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self._path)
        self.sock = sock


@dataclass(frozen=True)
class ModelGateway:
    """The one way out a trial container gets: the worker's model relay socket, via a gateway container."""

    image: str  # the runner image (by digest; it has pipeline.infra.relay)
    socket_dir: Path  # host directory of the worker's relay socket
    mount: str  # where the gateway sees it
    socket_name: str
    labels: dict[str, str] = field(default_factory=dict)  # e.g. the worker's run label (leftover cleanup)


@dataclass
class EnginePolicy:
    """What the runner may do through the proxy."""

    bind_roots: tuple[Path, ...]
    pull_repositories: tuple[str, ...] = ()  # "registry/repository" names whose images may be pulled
    token: str = field(default_factory=lambda: os.urandom(12).hex())
    gateway: ModelGateway | None = None  # None: every container gets network none


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    @property
    def path(self) -> str:
        return _VERSION.sub("", urlsplit(self.target).path)

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def head_bytes(self, *, body_length: int | None = None) -> bytes:
        upgrade = (self.header("Upgrade") or "") != ""
        lines = [f"{self.method} {self.target} {self.version}"]
        for key, value in self.headers:
            low = key.lower()
            if low in ("connection", "keep-alive", "proxy-connection") and not upgrade:
                continue
            if low == "content-length" and body_length is not None:
                continue
            lines.append(f"{key}: {value}")
        if body_length is not None:
            lines.append(f"Content-Length: {body_length}")
        if not upgrade:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_head(sock: socket.socket) -> tuple[_Request, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            if data:
                raise Refused("incomplete request head")
            return None
        data += chunk
        if len(data) > _MAX_HEAD:
            raise Refused("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise Refused("malformed request line")
    headers = []
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if not sep:
            raise Refused("malformed header")
        headers.append((key.strip(), value.strip()))
    return _Request(parts[0], parts[1], parts[2], headers), rest


def _read_body(sock: socket.socket, request: _Request, rest: bytes) -> bytes:
    if request.header("Transfer-Encoding"):
        raise Refused(f"{request.method} {request.path}: a chunked body is not accepted here")
    length = int(request.header("Content-Length") or 0)
    if length < 0 or length > _MAX_BODY:
        raise Refused("body too large")
    body = rest
    while len(body) < length:
        chunk = sock.recv(min(65536, length - len(body)))
        if not chunk:
            raise Refused("incomplete body")
        body += chunk
    if len(body) > length:
        raise Refused("pipelined data after the body")
    return body


def _set_query(request: _Request, key: str, value: str) -> None:
    """Rewrite ``request.target`` with ``key=value`` (replacing every earlier ``key``)."""
    parts = urlsplit(request.target)
    items = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key] + [(key, value)]
    request.target = urlunsplit(("", "", parts.path, urlencode(items), ""))


def _tagged(name: str) -> str:
    """``name`` with an explicit tag (``:latest`` when none)."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last or "@" in last else f"{name}:latest"


class EngineProxy:
    """Listen on ``socket_path``; forward checked requests to the engine at ``upstream``."""

    def __init__(self, socket_path: Path, policy: EnginePolicy, upstream: str = "/var/run/docker.sock") -> None:
        self.socket_path = socket_path
        self.policy = policy
        self.upstream = upstream
        self.refused: list[str] = []
        self.built: set[str] = set()  # image tags built through this proxy (compose removes them on down)
        self.gateways: set[str] = set()  # ids of the gateway containers this proxy started and not yet removed
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(socket_path))
        os.chmod(socket_path, 0o600)
        self._listener.listen(64)
        self._thread = threading.Thread(target=self._serve, name="engine-proxy", daemon=True)

    def start(self) -> EngineProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)
        for ident in sorted(self.gateways):
            self._remove_gateway(ident)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    # --- one client connection: one checked request, then the upstream's answer ---------

    def _handle(self, client: socket.socket) -> None:
        try:
            parsed = _read_head(client)
            if parsed is None:
                client.close()
                return
            request, rest = parsed
            body: bytes | None = None
            if self._needs_body(request):
                body = _read_body(client, request, rest)
                rest = b""
            body, after = self._check(request, body)
        except Refused as exc:
            self._refuse(client, str(exc), exc.status)
            return
        except (AttributeError, TypeError, KeyError) as exc:  # JSON of the wrong shape
            self._refuse(client, f"malformed request: {type(exc).__name__}")
            return
        except (OSError, ValueError) as exc:
            log.warning("engine proxy: %s", exc)
            client.close()
            return
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.upstream)
            if body is not None:
                upstream.sendall(request.head_bytes(body_length=len(body)) + body)
            else:
                upstream.sendall(request.head_bytes() + rest)
        except OSError:
            client.close()
            return
        _splice(client, upstream)
        if after is not None:
            self._remove_gateway(after)

    def _refuse(self, client: socket.socket, message: str, status: int = 403) -> None:
        if status == 403:
            self.refused.append(message)
            log.warning("engine proxy refused: %s", message)
        raw = json.dumps({"message": f"benchseal engine proxy: {message}"}).encode()
        reason = "Forbidden" if status == 403 else "Not Found"
        with contextlib.suppress(OSError):
            client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        client.close()

    @staticmethod
    def _needs_body(request: _Request) -> bool:
        path = request.path
        return request.method == "POST" and (
            path == "/containers/create" or bool(re.fullmatch(r"/containers/[^/]+/exec", path))
            or path == "/volumes/create")

    # --- the rules -----------------------------------------------------------------------

    def check(self, request: _Request, body: bytes | None) -> bytes | None:
        """Raise Refused unless allowed; return the (possibly rewritten) body to forward."""
        return self._check(request, body)[0]

    def _check(self, request: _Request, body: bytes | None) -> tuple[bytes | None, str | None]:
        """(body to forward, gateway to remove once the engine answered) or Refused."""
        method, path = request.method, request.path
        return self._rule(request, body, method, path), self._gateway_after(request, method, path)

    def _gateway_after(self, request: _Request, method: str, path: str) -> str | None:
        match = re.fullmatch(r"/containers/" + _ID, path)
        if method != "DELETE" or not match:
            return None
        info = self._inspect(f"/containers/{quote(unquote(match.group(1)), safe='')}/json")
        gateway = str(((info.get("Config") or {}).get("Labels") or {}).get(GATEWAY_LABEL) or "")
        return gateway if gateway in self.gateways else None

    def _rule(self, request: _Request, body: bytes | None, method: str, path: str) -> bytes | None:
        what = f"{method} {path}"
        if method in ("GET", "HEAD") and path in ("/_ping", "/version", "/info", "/containers/json", "/images/json",
                                                 "/networks", "/volumes", "/events"):
            return body
        if method in ("GET", "HEAD") and (path == "/plugins" or re.fullmatch(
                r"/(images|networks|volumes|plugins)/.+/json|/networks/[^/]+|/volumes/[^/]+", path)):
            return body
        if method == "POST" and path == "/containers/create":
            return self._check_create(body or b"", request.query.get("name", [""])[0])
        if method == "POST" and path == "/build":
            mode = request.query.get("networkmode", [""])[0]
            if mode not in ("", "default", "none"):
                raise Refused(f"{what}: networkmode {mode} is not allowed (build steps run with network none)")
            _set_query(request, "networkmode", "none")
            if request.query.get("remote"):
                raise Refused(f"{what}: a remote build context (fetched by the engine) is not allowed")
            with self._lock:
                self.built.update(_tagged(t) for t in request.query.get("t", []))
            return body
        if method == "DELETE" and path.startswith("/images/"):
            name = _tagged(unquote(path[len("/images/"):]))
            with self._lock:
                if name not in self.built:
                    raise Refused(f"{what}: only images this runner built may be removed")
            return body
        if method == "POST" and path == "/images/create":
            image = request.query.get("fromImage", [""])[0]
            name = re.sub(r"[@:][^/]*$", "", image)
            if name not in self.policy.pull_repositories:
                raise Refused(f"{what}: pulling {image!r} is not allowed (allowed: {', '.join(self.policy.pull_repositories) or 'none'})")
            return body
        if method == "POST" and path == "/volumes/create":
            spec = json.loads(body or b"{}")
            if spec.get("DriverOpts") or (spec.get("Driver") or "local") != "local":
                raise Refused(f"{what}: volumes with a driver or driver options are not allowed")
            return body
        match = re.fullmatch(r"/containers/" + _ID + r"(/.*)?", path)
        if match:
            self._require_owned_container(unquote(match.group(1)), what)
            if method == "POST" and match.group(2) == "/exec":
                spec = json.loads(body or b"{}")
                if spec.get("Privileged"):
                    raise Refused(f"{what}: privileged exec is not allowed")
            return body
        match = re.fullmatch(r"/exec/" + _ID + r"/(start|resize|json)", path)
        if match:
            info = self._inspect(f"/exec/{quote(unquote(match.group(1)), safe='')}/json")
            self._require_owned_container(str(info.get("ContainerID", "")), what)
            return body
        raise Refused(f"{what} is not allowed")

    def _check_create(self, body: bytes, name: str) -> bytes:
        try:
            spec: dict[str, Any] = json.loads(body)
        except ValueError:
            raise Refused("POST /containers/create: body is not JSON") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("HostConfig") if "HostConfig" in spec else {}, dict):
            raise Refused("POST /containers/create: body is not a container config (an object with a HostConfig object)")
        host = spec.get("HostConfig") or {}
        if host.get("Privileged"):
            raise Refused("privileged containers are not allowed")
        for key in ("CapAdd", "Devices", "DeviceRequests", "DeviceCgroupRules", "VolumesFrom"):
            if host.get(key):
                raise Refused(f"HostConfig.{key} is not allowed")
        for key in _HOST_MODES:
            if str(host.get(key) or "") == "host":
                raise Refused(f"HostConfig.{key}=host is not allowed")
        network = str(host.get("NetworkMode") or "")
        if network not in ("", "default", "none"):
            raise Refused(f"HostConfig.NetworkMode={network} is not allowed (trial containers get no network)")
        if host.get("PortBindings") or host.get("PublishAllPorts"):
            raise Refused("HostConfig.PortBindings/PublishAllPorts: publishing ports is not allowed")
        for opt in host.get("SecurityOpt") or []:
            if "unconfined" in str(opt) or str(opt).startswith("label=disable"):
                raise Refused(f"HostConfig.SecurityOpt {opt} is not allowed")
        for bind in host.get("Binds") or []:
            source = str(bind).split(":", 1)[0]
            if source.startswith("/"):
                self._check_bind_source(source)
        for mount in host.get("Mounts") or []:
            kind = mount.get("Type")
            if kind == "bind":
                self._check_bind_source(str(mount.get("Source") or ""))
            elif kind == "volume" and ((mount.get("VolumeOptions") or {}).get("DriverConfig") or {}).get("Options"):
                raise Refused("volume mounts with driver options are not allowed")
            elif kind not in ("volume", "tmpfs"):
                raise Refused(f"mount type {kind!r} is not allowed")
        labels = dict(spec.get("Labels") or {})
        labels.pop(GATEWAY_LABEL, None)
        labels[LABEL] = self.policy.token
        spec.pop("NetworkingConfig", None)
        spec["NetworkDisabled"] = False
        host["NetworkMode"] = "none"
        if self.policy.gateway is not None:
            gateway = self._start_gateway(self.policy.gateway, name)
            labels[GATEWAY_LABEL] = gateway
            host["NetworkMode"] = f"container:{gateway}"
            # What the engine refuses beside a container network mode (the gateway's namespace has them).
            for key in ("Hostname", "Domainname", "MacAddress", "ExposedPorts"):
                spec.pop(key, None)
            for key in ("Dns", "DnsOptions", "DnsSearch", "ExtraHosts", "PortBindings", "PublishAllPorts"):
                host.pop(key, None)
        spec["HostConfig"] = host
        spec["Labels"] = labels
        return json.dumps(spec).encode()

    # --- model gateways ------------------------------------------------------------------

    def _start_gateway(self, gateway: ModelGateway, name: str) -> str:
        spec = {
            "Image": gateway.image,
            "Entrypoint": ["python3", "-m", "pipeline.infra.relay"],
            "Cmd": [f"{gateway.mount}/{gateway.socket_name}", str(GATEWAY_PORT)],
            "Env": ["PYTHONDONTWRITEBYTECODE=1"],
            "Labels": {**gateway.labels, LABEL: self.policy.token, GATEWAY_LABEL: "1"},
            "HostConfig": {"NetworkMode": "none", "Binds": [f"{gateway.socket_dir}:{gateway.mount}:rw"],
                           "CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"], "ReadonlyRootfs": True},
        }
        query = f"?name={quote(name + '-model-gateway', safe='')}" if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}", name) else ""
        status, data = self._call("POST", f"/containers/create{query}", spec)
        if status != 201:
            raise Refused(f"could not create the model gateway: the engine answered {status}: {data[:300]!r}")
        ident = str(json.loads(data)["Id"])
        with self._lock:
            self.gateways.add(ident)
        status, data = self._call("POST", f"/containers/{ident}/start", None)
        if status not in (204, 304):
            self._remove_gateway(ident)
            raise Refused(f"could not start the model gateway: the engine answered {status}: {data[:300]!r}")
        return ident

    def _remove_gateway(self, ident: str) -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            status, _ = self._call("DELETE", f"/containers/{ident}?force=1", None)
            if status in (204, 404):
                with self._lock:
                    self.gateways.discard(ident)
                return
        log.warning("engine proxy: could not remove model gateway %s", ident)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        conn = _UnixHTTPConnection(self.upstream)
        try:
            raw = json.dumps(body).encode() if body is not None else None
            headers = {"Connection": "close", **({"Content-Type": "application/json"} if raw is not None else {})}
            conn.request(method, path, body=raw, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _check_bind_source(self, source: str) -> None:
        real = Path(os.path.realpath(source))
        if not any(real == root or root in real.parents for root in self._roots()):
            raise Refused(f"bind mount of {source} is not allowed (only under {', '.join(map(str, self._roots()))})")

    def _roots(self) -> Iterable[Path]:
        return tuple(Path(os.path.realpath(r)) for r in self.policy.bind_roots)

    def _inspect(self, path: str) -> dict[str, Any]:
        conn = _UnixHTTPConnection(self.upstream)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status == 404:
            raise NotFound(f"{path}: no such object")
        if response.status != 200:
            raise Refused(f"{path}: the engine answered {response.status}")
        result: dict[str, Any] = json.loads(data)
        return result

    def _require_owned_container(self, ident: str, what: str) -> None:
        if not ident:
            raise Refused(f"{what}: no container")
        info = self._inspect(f"/containers/{quote(ident, safe='')}/json")
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL) != self.policy.token:
            raise Refused(f"{what}: container {ident} was not created by this runner")
        if labels.get(GATEWAY_LABEL) == "1":
            raise Refused(f"{what}: container {ident} is a model gateway")
