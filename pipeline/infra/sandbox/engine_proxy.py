"""An API-filtering Docker Engine socket for the runner container (defence in depth in front of the engine).

The runner (Harbor + compose) gets this proxy's Unix socket as its
``/var/run/docker.sock`` instead of the engine's (``upstream``: the host's
engine today, the sandbox's own rootless engine once that is the upstream; the
proxy stays in front of either). A filter in front of a root engine cannot be
the containment on its own; it parses each request AS THE ENGINE DOES, checks
it against a whitelist and forwards exactly what it checked:

* HTTP: one request per client connection, parsed by ``h11`` (no hand-written
  parser): conflicting ``Content-Length``, unknown ``Transfer-Encoding``,
  malformed heads are refused; the body is re-framed by the proxy (its own
  ``Content-Length`` or chunking, ``Connection: close``); a body on GET/HEAD/
  DELETE, a form ``Content-Type`` (the engine reads query parameters from a form
  body too), an ``Upgrade`` header on anything but attach / exec start, and
  bytes pipelined after the request are refused, and nothing the client sends
  after its request is ever forwarded unless the engine answered an upgrade with
  101 (then the stream is raw both ways). Paths are percent-decoded and must be
  normal (the engine routes on the decoded path);
* JSON bodies (container create/update, exec create/start, volume create) are
  decoded as Go's ``encoding/json`` would map them to the engine's structs
  (case-insensitive keys; a duplicate or case-variant key, a non-ASCII key or an
  unknown non-zero field is refused) and re-serialised canonical. Create is a
  whitelist: no privileged, capabilities, devices, sysctls, ulimits, cgroup
  parent, runtimes, host/``container:`` namespaces, custom seccomp/apparmor/label
  options (only ``no-new-privileges``), ``MaskedPaths``/``ReadonlyPaths`` (any
  value), ``VolumesFrom``, links, published ports, restart policies, log drivers
  that ship logs anywhere, named volumes (only binds under the allowed roots,
  anonymous volumes and tmpfs with plain options); bind sources are resolved
  (symlinks) on the host and must lie under the roots (the run dir); they are
  forwarded as the resolved path, and re-checked when the container is started
  (or restarted) through the proxy, so a component swapped for a symlink in
  between is refused; the proxy labels what it creates;
* nothing crosses runs: no label naming benchseal may be set by the runner (creates, volumes,
  ``/build`` labels, a Dockerfile ``LABEL``, a base carrying one); the worker's run and batch
  labels are set on every container, built image and volume (it removes them by these when
  the batch ends); a build's tag may not name an image already there, a removal goes by that
  tag, and a container's removal takes its anonymous volumes;
* egress: a container asks for no network (``none``, or the default) or is
  refused; the proxy forces ``NetworkMode`` itself and drops
  ``NetworkingConfig``: ``none``, or, when the policy names a model gateway,
  ``container:<gateway>``, the network namespace of a gateway container it
  starts for that one container (network ``none``, the worker's model relay
  socket mounted, ``python3 -m pipeline.infra.sandbox.relay``), so the trial reaches the
  model on ``127.0.0.1:GATEWAY_PORT`` and nothing else; the gateway is removed
  with its container and when the proxy stops. Gateways are not addressable;
* ``/build`` (classic builder) runs its steps with ``networkmode=none`` and may
  not make the engine fetch anything: no ``remote`` context, no ``pull``, no
  BuildKit; the context tar is read (every member; nothing may follow the
  archive) and its Dockerfile (and the lower-case fallback the engine tries)
  parsed with both escape characters: no ``ADD`` of a URL or git source (nor any
  ``$``, quote or escape in an ``ADD``), no ``ONBUILD``, and every ``FROM`` /
  ``COPY --from`` names a build stage or an image already in the engine (no
  pull) that carries no ONBUILD triggers;
* everything that addresses a container or an exec (start, stop, kill, exec,
  attach, archive, logs, inspect, delete...) only for containers this proxy
  labelled, by a single path segment, with a known sub-resource;
* image pulls only of the allowlisted repositories; image removal only of what
  was built through the proxy; read-only listings and ``/_ping``, ``/version``,
  ``/info``; anything else is refused with 403 and logged.

This module is the server (h11 parsing, forwarding, upgrades) and the rules;
the JSON body whitelists are in ``engine_bodies``, the ``/build`` context and
Dockerfile checks in ``engine_build``, ``Refused``/``NotFound`` in
``engine_refusal``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import posixpath
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import h11

from pipeline.core.digests import ENGINE_ID_PATTERN
from pipeline.core.errors import CheckFailed, InfrastructureError
from pipeline.core.fsutil import bind_unix
from pipeline.infra.sandbox.engine import keep_reachable
from pipeline.infra.sandbox.engine_bodies import (
    _CREATE,
    _EXEC,
    _EXEC_START,
    _UPDATE,
    _VOLUME,
    _canon,
    _dump,
    _load_json,
    check_labels,
)
from pipeline.infra.sandbox.engine_build import (
    _BUILD_QUERY,
    _FALSE,
    _check_add,
    _check_label,
    _context_dockerfiles,
    _instructions,
    _tagged,
)
from pipeline.infra.sandbox.engine_refusal import NotFound as NotFound
from pipeline.infra.sandbox.engine_refusal import Refused as Refused
from pipeline.infra.sandbox.limits import ContainerLimits, enforce
from pipeline.infra.sandbox.relay import GATEWAY_PORT, _pump, _splice

log = logging.getLogger("benchseal.engine_proxy")

LABEL = "benchseal.engine-proxy"
_PROJECT_LABEL = "com.docker.compose.project"  # a trial container's trial (Harbor's compose project, the agent box's)
GATEWAY_LABEL = "benchseal.engine-proxy.gateway"  # on a gateway: "1"; on a trial container: its gateway's id
_MAX_HEAD = 65536
_MAX_BODY = 4 * 1024 * 1024
_MAX_CONTEXT = 1 << 30  # a build context is spooled to disk to be read before it is forwarded
_VERSION = re.compile(r"^/v[0-9.]+(?=/)")
_ID = r"([^/]+)"
# An engine object's full id: what the ownership memo is keyed by (a name can be taken by another container later).
_FULL_ID = re.compile(ENGINE_ID_PATTERN)
_MEMO_MAX = 1 << 16  # entries of either memo before it starts again (a bound on memory, not on correctness)


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

    image: str  # the runner image (by digest; it has pipeline.infra.sandbox.relay)
    socket_dir: Path  # host directory of the worker's relay socket
    mount: str  # where the gateway sees it
    socket_name: str
    labels: dict[str, str] = field(default_factory=dict)  # e.g. the worker's run label (leftover cleanup)
    # A socket of the gateway's own, by the container's compose project (the worker counts each one's model usage:
    # pipeline.infra.sandbox.agents.GatewayRelays); None: every gateway uses ``socket_name``.
    socket_for: Callable[[str], str] | None = None


@dataclass
class EnginePolicy:
    """What the runner may do through the proxy."""

    bind_roots: tuple[Path, ...]
    pull_repositories: tuple[str, ...] = ()  # "registry/repository" names whose images may be pulled
    token: str = field(default_factory=lambda: os.urandom(12).hex())
    gateway: ModelGateway | None = None  # None: every container gets network none
    # Set on everything the runner creates (containers, built images, volumes), over whatever it asked for:
    # the worker's run and batch labels, by which it removes all of it when the batch ends.
    labels: dict[str, str] = field(default_factory=dict)
    # Every container's memory, CPU, process and file-size bounds (``limits.enforce``).
    limits: ContainerLimits = field(default_factory=ContainerLimits)
    # What the worker granted the engine's user (``engine.grant``: the batch dir, the private dirs) and that uid:
    # kept reachable before each request is forwarded (``engine.keep_reachable``), since a chmod of a parent
    # mid-batch leaves the grant ineffective and the engine answers 400 ``stat ...: permission denied``.
    reachable: tuple[Path, ...] = ()
    reachable_by: int | None = None


# --- HTTP: one request per client connection, parsed by h11, re-framed by the proxy ----

_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length", "te",
                  "trailer", "upgrade", "expect", "http2-settings"})
# Go's ParseForm reads query parameters from a form body too (networkmode, remote...): no form types.
_CONTENT_TYPES = frozenset({"", "application/json", "application/x-tar", "application/tar", "text/plain",
                            "application/octet-stream"})
_UPGRADES = re.compile(r"/containers/[^/]+/attach|/exec/[^/]+/start")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass
class _Request:
    method: str
    target: str  # what is forwarded (the client's, or the proxy's rewrite of it)
    path: str  # percent-decoded as the engine's router sees it, version prefix removed
    query: dict[str, list[str]]
    headers: list[tuple[str, str]]  # end-to-end headers (framing and hop-by-hop ones are the proxy's own)
    upgrade: bool = False

    def first(self, key: str) -> str:
        """The engine's ``r.FormValue(key)``: the first value."""
        return (self.query.get(key) or [""])[0]

    def set_query(self, pairs: list[tuple[str, str]]) -> None:
        self.target = self.target.partition("?")[0] + ("?" + urlencode(pairs) if pairs else "")
        self.query = {}
        for key, value in pairs:
            self.query.setdefault(key, []).append(value)

    def head(self, *, length: int | None = None, chunked: bool = False) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/1.1", *(f"{k}: {v}" for k, v in self.headers)]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        elif length is not None:
            lines.append(f"Content-Length: {length}")
        lines += ["Connection: Upgrade", "Upgrade: tcp"] if self.upgrade else ["Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_target(target: str) -> tuple[str, list[tuple[str, str]]]:
    """(decoded path without the version prefix, query pairs) as the engine reads them; Refused when ambiguous."""
    raw_path, _, raw_query = target.partition("?")
    if not raw_path.startswith("/") or "#" in target or _BAD_ESCAPE.search(target) or ";" in raw_query:
        raise Refused("malformed request target")
    path = unquote(raw_path, errors="surrogateescape")
    if "\0" in path or "//" in path or posixpath.normpath(path) != path:
        raise Refused(f"request path {path!r} is not normal")
    return _VERSION.sub("", path), parse_qsl(raw_query, keep_blank_values=True)


def _request(event: h11.Request) -> _Request:
    method, target = event.method.decode("latin-1"), event.target.decode("latin-1")
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items()]
    names = [k.lower() for k, _ in headers]
    if "transfer-encoding" in names and "content-length" in names:
        raise Refused("both Transfer-Encoding and Content-Length")
    types = [v.split(";")[0].strip().lower() for k, v in headers if k.lower() == "content-type"]
    if len(types) > 1 or (types and types[0] not in _CONTENT_TYPES):
        raise Refused(f"Content-Type {', '.join(types)} is not allowed")
    path, pairs = _parse_target(target)
    query: dict[str, list[str]] = {}
    for key, value in pairs:
        query.setdefault(key, []).append(value)
    request = _Request(method, target, path, query, [(k, v) for k, v in headers if k.lower() not in _HOP])
    if "upgrade" in names:
        if method != "POST" or not _UPGRADES.fullmatch(path):
            raise Refused(f"{method} {path}: an Upgrade header is allowed on attach and exec start only")
        request.upgrade = True
    return request


class _Client:
    """The client side of one connection: h11 parses its one request; nothing after it is forwarded."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)

    def _next(self) -> Any:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise Refused(f"malformed request: {exc}") from None
            if event is not h11.NEED_DATA:
                return event
            if self.conn.they_are_waiting_for_100_continue:
                self.sock.sendall(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            self.conn.receive_data(self.sock.recv(65536))

    def request(self) -> _Request | None:
        event = self._next()
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise Refused("malformed request")
        return _request(event)

    def chunks(self) -> Iterable[bytes]:
        while True:
            event = self._next()
            if isinstance(event, h11.EndOfMessage):
                return
            if not isinstance(event, h11.Data):
                raise Refused("incomplete body")
            yield bytes(event.data)

    def read(self, limit: int) -> bytes:
        body = bytearray()
        for chunk in self.chunks():
            body += chunk
            if len(body) > limit:
                raise Refused("body too large")
        return bytes(body)

    def spool(self) -> IO[bytes]:
        spool = tempfile.TemporaryFile()
        try:
            for chunk in self.chunks():
                spool.write(chunk)
                if spool.tell() > _MAX_CONTEXT:
                    raise Refused("build context too large")
        except BaseException:
            spool.close()
            raise
        return spool

    @property
    def trailing(self) -> bytes:
        return bytes(self.conn.trailing_data[0])


def _discard(client: socket.socket, upstream: socket.socket) -> None:
    """Read and drop what the client sends after its request; its EOF becomes the engine's (a client gone)."""
    with contextlib.suppress(OSError):
        while client.recv(65536):
            pass
        upstream.shutdown(socket.SHUT_WR)


def _answer(client: socket.socket, upstream: socket.socket, first: bytes = b"") -> None:
    """The engine's answer to the client, then both closed: only once the discarding thread is done with them
    (the shutdown wakes its read), so it never reads from or shuts down a number a later connection reuses."""
    discard = threading.Thread(target=_discard, args=(client, upstream), daemon=True)
    discard.start()
    with contextlib.suppress(OSError):
        if first:
            client.sendall(first)
        _pump(upstream, client)
    with contextlib.suppress(OSError):
        client.shutdown(socket.SHUT_RDWR)
    discard.join(timeout=10)
    for s in (client, upstream):
        with contextlib.suppress(OSError):
            s.close()


def _answer_upgrade(peer: _Client, upstream: socket.socket) -> None:
    """Raw both ways only once the engine answered 101; else an ordinary answer."""
    head = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in head and len(head) < _MAX_HEAD:
            chunk = upstream.recv(65536)
            if not chunk:
                break
            head += chunk
    if not head.startswith((b"HTTP/1.1 101 ", b"HTTP/1.0 101 ")):
        _answer(peer.sock, upstream, head)
        return
    try:
        peer.sock.sendall(head)
        if peer.trailing:
            upstream.sendall(peer.trailing)
    except OSError:
        pass
    _splice(peer.sock, upstream)


_READ_ONLY = re.compile(r"/_ping|/version|/info|/events|/(containers|images|networks|volumes|plugins)/json|"
                        r"/networks|/volumes|/plugins|/(images|networks|volumes|plugins)/.+/json|"
                        r"/networks/[^/]+|/volumes/[^/]+")
_JSON_BODIES = re.compile(r"/containers/create|/containers/[^/]+/(exec|update)|/exec/[^/]+/start|/volumes/create")
_CONTAINER_CALLS: dict[str, tuple[str, ...]] = {
    "": ("DELETE",), "/json": ("GET", "HEAD"), "/logs": ("GET",), "/top": ("GET",), "/changes": ("GET",),
    "/stats": ("GET",), "/archive": ("GET", "HEAD", "PUT"), **{f"/{call}": ("POST",) for call in (
        "wait", "start", "stop", "restart", "kill", "pause", "unpause", "resize", "attach", "exec", "update")},
}
_BIND_MODES = frozenset({"", "ro", "rw", "private", "rprivate"})


class EngineProxy:
    """Listen on ``socket_path``; forward checked requests to the engine at ``upstream``."""

    def __init__(self, socket_path: Path, policy: EnginePolicy, upstream: str = "/var/run/docker.sock") -> None:
        self.socket_path = socket_path
        self.policy = policy
        self.upstream = upstream
        self.refused: list[str] = []
        self.built: set[str] = set()  # image tags built through this proxy (compose removes them on down)
        self.gateways: set[str] = set()  # ids of the gateway containers this proxy started and not yet removed
        # What the ownership check found, by full id, so that the exec, archive and removal requests of a trial
        # do not each inspect the same container again (two engine round trips an exec request, five an exec).
        # Sound because what it rests on never changes: a container's labels are fixed at create (no endpoint
        # this proxy forwards changes them), an exec belongs to one container for its life, and a full id is
        # never given to another object. Only positive findings are kept; a start still inspects (its binds).
        self._owned: dict[str, str] = {}  # container id -> its gateway's id ("" without one)
        self._exec_owner: dict[str, str] = {}  # exec id -> its (owned) container's id
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bind_unix(self._listener, socket_path)  # a deep temp dir: through /proc/self/fd
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
        peer = _Client(client)
        spool: IO[bytes] | None = None
        try:
            request = peer.request()
            if request is None:
                client.close()
                return
            self._keep_reachable()
            body, spool, streamed = self._read_body(peer, request)
            body, after = self._check(request, body, spool)
        except Refused as exc:
            self._refuse(client, str(exc), exc.status)
            return
        except (OSError, ValueError, h11.ProtocolError) as exc:
            log.warning("engine proxy: %s", exc)
            client.close()
            return
        try:
            self._forward(peer, request, body, spool, streamed)
        finally:
            if spool is not None:
                spool.close()
        if after is not None:
            self._remove_gateway(after)

    @staticmethod
    def _read_body(peer: _Client, request: _Request) -> tuple[bytes | None, IO[bytes] | None, bool]:
        """(buffered body, spooled build context, streamed): only an archive upload streams past the proxy."""
        method, path = request.method, request.path
        if method == "PUT" and re.fullmatch(r"/containers/[^/]+/archive", path):
            return None, None, True
        if method == "POST" and path == "/build":
            spool = peer.spool()
            body, where = None, "build context"
        else:
            body = peer.read(_MAX_BODY)
            spool, where = None, f"{method} {path}"
            if body and not (method == "POST" and _JSON_BODIES.fullmatch(path)):
                raise Refused(f"{where}: a request body is not allowed here")
        if peer.trailing and not request.upgrade:
            if spool is not None:
                spool.close()
            raise Refused(f"{where}: data pipelined after the request (one request per connection)")
        return body, spool, False

    def _forward(self, peer: _Client, request: _Request, body: bytes | None, spool: IO[bytes] | None,
                 streamed: bool) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.upstream)
            if streamed:
                upstream.sendall(request.head(chunked=True))
                for chunk in peer.chunks():
                    if chunk:
                        upstream.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                upstream.sendall(b"0\r\n\r\n")
            elif spool is not None:
                size = spool.seek(0, os.SEEK_END)
                spool.seek(0)
                upstream.sendall(request.head(length=size))
                while chunk := spool.read(1 << 20):
                    upstream.sendall(chunk)
            else:
                data = body or b""
                upstream.sendall(request.head(length=len(data) if data or request.method in ("POST", "PUT") else None)
                                 + data)
        except (OSError, Refused):
            for s in (peer.sock, upstream):
                s.close()
            return
        if request.upgrade:
            _answer_upgrade(peer, upstream)
        else:
            _answer(peer.sock, upstream)

    def _keep_reachable(self) -> None:
        uid = self.policy.reachable_by
        if uid is None:
            return
        for path in self.policy.reachable:
            try:
                for fixed in keep_reachable(path, uid):
                    log.warning("engine proxy: %s was no longer reachable by the engine (a chmod narrowed its ACL "
                                "mask): granted again", fixed)
            except (OSError, CheckFailed, InfrastructureError) as exc:  # the engine's own answer says the rest
                log.warning("engine proxy: keeping %s reachable by the engine failed: %s", path, exc)

    def _refuse(self, client: socket.socket, message: str, status: int = 403) -> None:
        if status == 403:
            self.refused.append(message)
            log.warning("engine proxy refused: %s", message)
        raw = json.dumps({"message": f"benchseal engine proxy: {message}"}).encode()
        reason = "Forbidden" if status == 403 else "Not Found"
        with contextlib.suppress(OSError):
            client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
            # Read (and drop) what the client is still sending, briefly: closing on unread data would reset
            # the connection and lose the answer. Nothing read here is parsed or forwarded.
            client.shutdown(socket.SHUT_WR)
            client.settimeout(0.5)
            drained, deadline = 0, time.monotonic() + 2
            while drained < _MAX_BODY and time.monotonic() < deadline and (chunk := client.recv(65536)):
                drained += len(chunk)
        client.close()

    # --- the rules -----------------------------------------------------------------------

    def _check(self, request: _Request, body: bytes | None,
               spool: IO[bytes] | None = None) -> tuple[bytes | None, str | None]:
        """(body to forward, gateway to remove once the engine answered) or Refused."""
        method, path = request.method, request.path
        return self._rule(request, body, spool), self._gateway_after(method, path)

    def _gateway_after(self, method: str, path: str) -> str | None:
        match = re.fullmatch(r"/containers/" + _ID, path)
        if method != "DELETE" or not match:
            return None
        ident = match.group(1)
        with self._lock:
            gateway = self._owned.get(ident)
        if gateway is None:
            info = self._inspect(f"/containers/{quote(ident, safe='')}/json")
            gateway = str(((info.get("Config") or {}).get("Labels") or {}).get(GATEWAY_LABEL) or "")
        return gateway if gateway in self.gateways else None

    def _rule(self, request: _Request, body: bytes | None, spool: IO[bytes] | None) -> bytes | None:
        method, path = request.method, request.path
        what = f"{method} {path}"
        if method in ("GET", "HEAD") and _READ_ONLY.fullmatch(path):
            return body
        if method == "POST" and path == "/containers/create":
            return self._check_create(body or b"", request.first("name"))
        if method == "POST" and path == "/build":
            self._check_build(request, spool)
            return None
        if method == "DELETE" and path.startswith("/images/"):
            name = _tagged(path[len("/images/"):])
            with self._lock:
                if name not in self.built:
                    raise Refused(f"{what}: only images this runner built may be removed")
            # By the tag it built, spelled out: a bare name the engine no longer knows as a tag would be read
            # as an image id prefix (the worker's image, if the runner had named its build after that id).
            raw_path, _, raw_query = request.target.partition("?")
            version = _VERSION.match(unquote(raw_path))
            request.target = (version.group(0) if version else "") + "/images/" + quote(name, safe="/:@") \
                + ("?" + raw_query if raw_query else "")
            return body
        if method == "POST" and path == "/images/create":
            self._check_pull(request)
            return body
        if method == "POST" and path == "/volumes/create":
            volume = _canon(_load_json(body or b"{}", what), _VOLUME, "volume")
            volume["Labels"] = {**check_labels(volume.get("Labels"), "volume.Labels"), **self._own_labels()}
            return _dump(volume)
        match = re.fullmatch(r"/containers/" + _ID + r"(/[a-z]+)?", path)
        if match:
            return self._container_call(request, body, match.group(1), match.group(2) or "")
        match = re.fullmatch(r"/exec/" + _ID + r"/(start|resize|json)", path)
        if match:
            self._require_owned_exec(match.group(1), what)
            if match.group(2) == "start" and body:
                return _dump(_canon(_load_json(body, what), _EXEC_START, "exec start"))
            return body
        raise Refused(f"{what} is not allowed")

    def _container_call(self, request: _Request, body: bytes | None, ident: str, call: str) -> bytes | None:
        what = f"{request.method} {request.path}"
        if request.method not in _CONTAINER_CALLS.get(call, ()):
            raise Refused(f"{what} is not allowed")
        if call in ("/start", "/restart"):
            self._check_started_binds(self._require_owned_container(ident, what), what)
        else:
            self._require_owned(ident, what)
        if call == "" and request.method == "DELETE":
            # Its anonymous volumes go with it (nothing of a run is left for a later one to find).
            request.set_query([*((k, v) for k, vs in request.query.items() if k != "v" for v in vs), ("v", "1")])
        if call == "/exec":
            return _dump(_canon(_load_json(body or b"{}", what), _EXEC, "exec"))
        if call == "/update":
            spec = _canon(_load_json(body or b"{}", what), _UPDATE, "update")
            if set(spec) - {"RestartPolicy"}:
                # Limits are fixed at create (``limits.enforce``): an update could lift them (PidsLimit 0 is none).
                raise Refused(f"{what}: a container's limits cannot be changed ({', '.join(sorted(spec))})")
            return _dump(spec)
        return body

    def _check_pull(self, request: _Request) -> None:
        what = "POST /images/create"
        extra = sorted(set(request.query) - {"fromImage", "tag"})
        if extra:  # fromSrc makes the engine download a URL; repo/changes/message/platform belong to imports
            raise Refused(f"{what}: {', '.join(extra)} is not allowed")
        image = request.first("fromImage")
        name = re.sub(r"[@:][^/]*$", "", image)
        if name not in self.policy.pull_repositories:
            raise Refused(f"{what}: pulling {image!r} is not allowed "
                          f"(allowed: {', '.join(self.policy.pull_repositories) or 'none'})")
        request.set_query([("fromImage", image), *(("tag", t) for t in request.query.get("tag", [])[:1])])


    def _check_create(self, body: bytes, name: str) -> bytes:
        spec = _canon(_load_json(body, "POST /containers/create"), _CREATE, "create")
        host: dict[str, Any] = spec.get("HostConfig") or {}
        enforce(host, self.policy.limits)
        if "Binds" in host:
            host["Binds"] = [self._check_bind(str(bind)) for bind in host["Binds"]]
        for mount in host.get("Mounts") or []:
            kind = mount.get("Type")
            if kind == "bind":
                mount["Source"] = self._resolved_source(str(mount.get("Source") or ""))
            elif mount.get("Source"):
                raise Refused(f"HostConfig.Mounts: a named {kind} {mount['Source']!r} is not allowed (anonymous only)")
        labels = {**check_labels(spec.get("Labels"), "create.Labels"), **self._own_labels()}
        spec["NetworkDisabled"] = False
        host["NetworkMode"] = "none"
        if self.policy.gateway is not None:
            gateway = self._start_gateway(self.policy.gateway, name, str(labels.get(_PROJECT_LABEL) or ""))
            labels[GATEWAY_LABEL] = gateway
            host["NetworkMode"] = f"container:{gateway}"
            # What the engine refuses beside a container network mode (the gateway's namespace has them).
            for key in ("Hostname", "Domainname", "MacAddress", "ExposedPorts"):
                spec.pop(key, None)
            for key in ("Dns", "DnsOptions", "DnsSearch", "ExtraHosts"):
                host.pop(key, None)
        spec["HostConfig"] = host
        spec["Labels"] = labels
        return _dump(spec)

    def _check_bind(self, bind: str) -> str:
        """A ``Binds`` entry as the engine's Linux parser splits it; forwarded with the source resolved."""
        parts = bind.split(":")
        if len(parts) == 1:
            return bind  # a destination only: an anonymous volume
        if len(parts) > 3 or not parts[0] or not parts[0].startswith("/"):
            raise Refused(f"HostConfig.Binds {bind!r}: only a host path under the run dir may be bound "
                          "(no named volumes)")
        modes = parts[2].split(",") if len(parts) == 3 else []
        if not set(modes) <= _BIND_MODES:
            raise Refused(f"HostConfig.Binds {bind!r}: mode {parts[2]!r} is not allowed")
        return ":".join([self._resolved_source(parts[0]), *parts[1:]])

    def _resolved_source(self, source: str) -> str:
        real = os.path.realpath(source)
        if not source.startswith("/") or not self._under_roots(Path(real)) or ":" in real or "," in real:
            raise Refused(f"bind mount of {source} is not allowed (only under {', '.join(map(str, self._roots()))})")
        return real

    def _under_roots(self, real: Path) -> bool:
        return any(real == root or root in real.parents for root in self._roots())

    def _check_started_binds(self, info: dict[str, Any], what: str) -> None:
        """Each bind source must still be its own resolved path under the roots when the engine mounts it.

        The engine mounts a bind source by path when the container starts, so a directory under the run
        dir swapped for a symlink after create would be followed then (create forwarded resolved paths,
        so any symlink now on the path is a swap). A window is left: between this check and the
        engine's mount() the runner, which can write in the run dir, can still swap a component. What
        closes it is the sandbox's rootless engine (its root is not the host's), not this proxy."""
        host = info.get("HostConfig") or {}
        sources = [str(m.get("Source") or "") for m in info.get("Mounts") or [] if m.get("Type") == "bind"]
        sources += [str(b).split(":")[0] for b in host.get("Binds") or [] if str(b).startswith("/")]
        sources += [str(m.get("Source") or "") for m in host.get("Mounts") or [] if m.get("Type") == "bind"]
        for source in sources:
            real = os.path.realpath(source)
            if real != os.path.normpath(source) or not self._under_roots(Path(real)):
                raise Refused(f"{what}: bind source {source} is now a symlink or outside the run dir")

    # --- /build --------------------------------------------------------------------------

    def _check_build(self, request: _Request, spool: IO[bytes] | None) -> None:
        what = "POST /build"
        if "remote" in request.query:
            raise Refused(f"{what}: a remote build context (fetched by the engine) is not allowed")
        unknown = sorted(set(request.query) - _BUILD_QUERY)
        if unknown:
            raise Refused(f"{what}: {', '.join(unknown)} is not allowed")
        mode = request.first("networkmode")
        if mode not in ("", "default", "none"):
            raise Refused(f"{what}: networkmode {mode} is not allowed (build steps run with network none)")
        if request.first("pull").strip().lower() not in _FALSE:
            raise Refused(f"{what}: pull is not allowed (the engine would fetch the base images)")
        if request.first("version") not in ("", "1"):
            raise Refused(f"{what}: only the classic builder (version 1) is allowed")
        labels = self._build_labels(request)
        for tag in request.query.get("t", []):
            self._check_tag(tag, what)
        tags = [_tagged(t) for t in request.query.get("t", [])]
        pairs = [(k, v) for k, values in request.query.items() if k not in ("networkmode", "labels") for v in values]
        request.set_query([*pairs, ("networkmode", "none"), ("labels", json.dumps(labels))])
        if spool is not None and spool.seek(0, os.SEEK_END):
            for text in _context_dockerfiles(spool, request.first("dockerfile")):
                self._check_dockerfile(text)
        with self._lock:
            self.built.update(tags)

    def _own_labels(self) -> dict[str, str]:
        """The labels the proxy sets on what it lets the runner create (over the runner's own)."""
        return {**self.policy.labels, LABEL: self.policy.token}

    def _build_labels(self, request: _Request) -> dict[str, str]:
        """The build's ``labels`` (the engine reads the first value), none of benchseal's, plus the proxy's own."""
        raw = request.query.get("labels", [])
        try:
            asked = json.loads(raw[0]) if raw and raw[0] else None
        except ValueError:
            raise Refused("POST /build: labels is not JSON") from None
        return {**check_labels(asked, "POST /build labels"), **self._own_labels()}

    def _check_tag(self, tag: str, what: str) -> None:
        """A build may name a new image, or one this proxy built, never an image that is already there
        (another run's, or the worker's: the name would move to this build, and its removal be allowed)."""
        with self._lock:
            if _tagged(tag) in self.built:
                return
        for name in {tag, _tagged(tag)}:  # as given, the engine also reads it as an image id prefix
            try:
                self._inspect(f"/images/{quote(name, safe='')}/json")
            except NotFound:
                continue
            raise Refused(f"{what}: t={tag} names an image already in the engine that this runner did not build")

    def _check_dockerfile(self, text: str) -> None:
        """No instruction that makes the engine fetch: read with either escape character (``# escape=``)."""
        for escape in ("\\", "`"):
            stages: list[str] = []
            for keyword, args in _instructions(text, escape):
                if keyword == "ONBUILD":
                    raise Refused("Dockerfile ONBUILD is not allowed (a trigger runs in another build)")
                if keyword == "ADD":
                    _check_add(args)
                if keyword == "LABEL":
                    _check_label(args)
                if keyword == "FROM":
                    stages.append(self._check_from(args, stages))
                if keyword == "COPY":
                    for word in args.split():
                        if word.lower().startswith("--from="):
                            self._check_base(word.split("=", 1)[1], stages)

    def _check_from(self, args: str, stages: list[str]) -> str:
        words = args.split()
        if not words or words[0].startswith("--"):
            raise Refused(f"Dockerfile FROM {args!r}: flags are not allowed (--platform makes the engine pull)")
        self._check_base(words[0], stages)
        return words[2].lower() if len(words) == 3 and words[1].lower() == "as" else ""

    def _check_base(self, image: str, stages: list[str]) -> None:
        """A build stage, or an image already in the engine without ONBUILD triggers (never a pull)."""
        if image.lower() in stages or image.isdigit() or image == "scratch":
            return
        if "$" in image:
            raise Refused(f"Dockerfile base {image!r}: a variable is not allowed")
        try:
            info = self._inspect(f"/images/{quote(image, safe='')}/json")
        except NotFound:
            raise Refused(f"Dockerfile base {image!r} is not in the engine (the build would pull it)") from None
        config = info.get("Config") or {}
        if config.get("OnBuild"):
            raise Refused(f"Dockerfile base {image!r} has ONBUILD triggers")
        try:
            check_labels(config.get("Labels"), f"Dockerfile base {image!r}")
        except Refused:  # its labels would be the new image's: a copy of the worker's own, say
            raise Refused(f"Dockerfile base {image!r} carries benchseal's labels (the build would inherit them)") from None

    # --- model gateways ------------------------------------------------------------------

    def _start_gateway(self, gateway: ModelGateway, name: str, project: str = "") -> str:
        socket_name = gateway.socket_for(project) if gateway.socket_for is not None else gateway.socket_name
        spec = {
            "Image": gateway.image,
            "Entrypoint": ["python3", "-m", "pipeline.infra.sandbox.relay"],
            "Cmd": [f"{gateway.mount}/{socket_name}", str(GATEWAY_PORT)],
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

    def _require_owned(self, ident: str, what: str) -> None:
        """``_require_owned_container``, answered from the memo when ``ident`` is a full id found owned before."""
        with self._lock:
            if ident in self._owned:
                return
        self._require_owned_container(ident, what)

    def _require_owned_container(self, ident: str, what: str) -> dict[str, Any]:
        """The container's inspect, or Refused: it must carry this proxy's token and not be a model gateway."""
        if not ident:
            raise Refused(f"{what}: no container")
        info = self._inspect(f"/containers/{quote(ident, safe='')}/json")
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL) != self.policy.token:
            raise Refused(f"{what}: container {ident} was not created by this runner")
        if labels.get(GATEWAY_LABEL) == "1":
            raise Refused(f"{what}: container {ident} is a model gateway")
        if _FULL_ID.fullmatch(ident) and info.get("Id") == ident:  # by its id, never by a name
            self._remember(self._owned, ident, str(labels.get(GATEWAY_LABEL) or ""))
        return info

    def _require_owned_exec(self, ident: str, what: str) -> None:
        """The exec must belong to a container this proxy may address (its owner, from the memo or inspected)."""
        with self._lock:
            owner = self._exec_owner.get(ident)
        if owner is not None:
            self._require_owned(owner, what)
            return
        info = self._inspect(f"/exec/{quote(ident, safe='')}/json")
        owner = str(info.get("ContainerID", ""))
        self._require_owned(owner, what)
        if _FULL_ID.fullmatch(ident) and info.get("ID") == ident and _FULL_ID.fullmatch(owner):
            self._remember(self._exec_owner, ident, owner)

    def _remember(self, memo: dict[str, str], key: str, value: str) -> None:
        with self._lock:
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[key] = value
