"""Byte relays that give a network-less runner exactly one way out: the model endpoint.

The runner container keeps ``network_mode: none``. The worker (host side)
listens on a Unix socket in a private directory mounted into the runner and
connects each accepted stream to the ONE endpoint the policy names
(``UnixToTcpRelay``). Inside the runner, ``benchseal trial run`` listens on its
own loopback and forwards to that socket (``TcpToUnixRelay``), so the agent's
HTTP client talks to ``http://127.0.0.1:<port>``. Nothing else is reachable: no
registry, no host ports, no metadata address, no internet.

Trial containers get the same single way out when the agent is model-backed:
the engine proxy starts a gateway container per trial container (network
``none``, the relay socket mounted, ``python3 -m pipeline.infra.sandbox.relay``) and
puts the trial container into the gateway's network namespace, so the model is
``http://127.0.0.1:GATEWAY_PORT`` there and there is no other interface.

The host side is where the untrusted side ends, so it forwards HTTP, not bytes: one request per
connection, parsed by the standard library's request-head parser (``BaseHTTPRequestHandler``),
admitted only as ``POST <the policy's model path>/chat/completions`` (origin-form target, a
loopback or the upstream's own ``Host``, a ``Content-Length`` body of bounded size, no
``Upgrade``, no ``Transfer-Encoding``, no bytes after the body, a head of bounded size read
within a deadline) and re-serialised for the one upstream the policy names. Anything else gets a
4xx JSON answer from the relay and the upstream sees no connection at all. The answer (e.g. a
streamed, chunked chat completion) is passed back byte for byte.

The model key lives only here: the sandbox holds a placeholder, the relay drops every credential
header the request carries and adds the real one (``UnixToTcpRelay(api_key=...)``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from pipeline.core.fsutil import bind_unix

_BUF = 65536
# Bounds on what one model call may send: its head (request line and headers) and its body.
MAX_HEAD_BYTES = 32 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
HEAD_TIMEOUT = 30.0  # seconds to send the head and the body (a model's answer may take longer)
_REQUEST_LINE = re.compile(rb"(?P<method>[A-Z]{1,16}) (?P<target>[!-~]{1,8000}) HTTP/1\.[01]\r?\n\Z")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}\Z")
_LOOPBACK_HOST = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?\Z", re.IGNORECASE)
# Hop-by-hop or re-written by the relay: never forwarded as the client sent them.
_NOT_FORWARDED = frozenset({"host", "content-length", "connection", "keep-alive", "proxy-connection", "te",
                            "trailer", "expect", "proxy-authorization", "proxy-authenticate"})
# Credentials are the relay's to add: whatever the sandbox sent (a placeholder) never goes upstream.
_CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    for s in (a, b):
        with contextlib.suppress(OSError):
            s.close()


class _Relay:
    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self._listener = listener
        self._connect = connect
        self._stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, name=type(self).__name__, daemon=True)

    def start(self) -> _Relay:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                break
            self.connections += 1
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            upstream = self._connect()
        except OSError:
            client.close()
            return
        _splice(client, upstream)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


class _Refused(Exception):
    def __init__(self, status: int, rule: str) -> None:
        super().__init__(rule)
        self.status = status
        self.rule = rule


class _BoundedHead(io.RawIOBase):
    """The client's stream while its head is read: more than MAX_HEAD_BYTES is refused, not buffered."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self.used = 0

    def readline(self, size: int | None = -1) -> bytes:
        limit = MAX_HEAD_BYTES - self.used + 1
        line: bytes = self._stream.readline(limit if size is None or size < 0 else min(size, limit))
        self.used += len(line)
        if self.used > MAX_HEAD_BYTES:
            raise _Refused(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        return line


class _Gate(BaseHTTPRequestHandler):
    """Reads ONE request from the runner and forwards it re-serialised, or refuses it (module docstring)."""

    protocol_version = "HTTP/1.1"
    timeout = HEAD_TIMEOUT
    server: Any  # the UnixToTcpRelay (BaseHTTPRequestHandler calls its owner "server")

    def setup(self) -> None:
        super().setup()
        self._body = self.rfile
        self.rfile = _BoundedHead(self.rfile)  # type: ignore[assignment]
        self._error: tuple[int, str] | None = None

    # The standard parser reports what it refuses through send_error: keep it, answer once below.
    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self._error = (code, message or explain or "bad request")

    def handle_expect_100(self) -> bool:
        return True  # "100 Continue" is sent once the head is admitted, not before

    def finish(self) -> None:
        super().finish()
        self._body.close()  # the socket closes only once its last file object is closed

    def log_message(self, format: str, *args: Any) -> None:
        pass  # refusals are kept on the relay (``refused``); nothing of a request is logged

    def handle(self) -> None:
        self.close_connection = True
        try:
            request = self._admit()
        except _Refused as refusal:
            self.server.refused.append(refusal.rule)
            self._answer(refusal.status, refusal.rule)
            return
        except TimeoutError:
            self.server.refused.append("request not received in time")
            self._answer(408, f"the request head and body must arrive within {HEAD_TIMEOUT:g} s")
            return
        except (OSError, ValueError):
            return  # the client went away
        if request is not None:
            self.server.forward(self.connection, request)

    def _admit(self) -> bytes | None:
        line = self.rfile.readline(8192 + 1)
        if not line:
            return None  # connected and closed: nothing to forward
        match = _REQUEST_LINE.match(line)
        if match is None:
            raise _Refused(400, "not an HTTP/1.0 or HTTP/1.1 request line (METHOD SP TARGET SP HTTP/1.x)")
        self.raw_requestline = line
        if not self.parse_request():
            code, message = self._error or (400, "bad request")
            raise _Refused(code if 400 <= code < 500 else 400, message)
        method, target = match["method"].decode(), match["target"].decode()
        if method != "POST":
            raise _Refused(405, f"method {method} is not forwarded (only POST {self.server.model_target})")
        if not target.startswith("/"):
            raise _Refused(400, "only an origin-form target (/path) is forwarded, not an absolute URI or authority")
        if target != self.server.model_target:
            raise _Refused(404, f"only POST {self.server.model_target} is forwarded")
        headers = self._checked_headers()
        length = headers.get("content-length")
        if length is None:
            raise _Refused(411, "a Content-Length is required")
        if not re.fullmatch(r"[0-9]{1,10}", length):
            raise _Refused(400, "Content-Length must be a decimal number")
        size = int(length)
        if size > MAX_BODY_BYTES:
            raise _Refused(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        if headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self._body.read(size)
        if len(body) != size:
            return None  # the client closed before its body was complete
        if self._more_bytes():
            raise _Refused(400, "one request per connection: bytes after the request body are not forwarded")
        head = [f"POST {target} HTTP/1.1", f"Host: {self.server.authority}"]
        head += [f"{name}: {value}" for name, value in self.headers.items()
                 if name.lower() not in _NOT_FORWARDED and name.lower() not in _CREDENTIAL_HEADERS]
        if self.server.api_key is not None:
            head.append(f"Authorization: Bearer {self.server.api_key}")
        head += [f"Content-Length: {size}", "Connection: close"]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    def _checked_headers(self) -> dict[str, str]:
        if self.headers.defects or self.headers.get_payload():
            raise _Refused(400, "malformed header section")
        seen: dict[str, str] = {}
        for name, value in self.headers.items():
            lower = name.lower()
            if not _TOKEN.match(name):
                raise _Refused(400, f"header name {name[:40]!r} is not an HTTP token")
            if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
                raise _Refused(400, f"header {name}: control characters (or a folded line) are not allowed")
            if lower in seen:
                raise _Refused(400, f"header {name} given twice")
            seen[lower] = value.strip()
        if "upgrade" in seen or "http2-settings" in seen:
            raise _Refused(400, "Upgrade is not forwarded (one HTTP/1.1 request per connection)")
        options = {token.strip().lower() for token in seen.get("connection", "").split(",") if token.strip()}
        if options - {"close", "keep-alive"}:
            raise _Refused(400, "Connection may name only close or keep-alive")
        if "transfer-encoding" in seen:
            raise _Refused(411, "Transfer-Encoding is not forwarded: send a Content-Length body")
        expect = seen.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            raise _Refused(417, "Expect may only be 100-continue")
        host = seen.get("host")
        if host is None:
            raise _Refused(400, "a Host header is required")
        if not (_LOOPBACK_HOST.match(host) or host.lower() == self.server.authority.lower()):
            raise _Refused(400, f"Host {host[:80]!r} is not the model endpoint (loopback or {self.server.authority})")
        return seen

    def _more_bytes(self) -> bool:
        """Whether the client already sent more than its one request (a pipelined or smuggled second one)."""
        self.connection.settimeout(0)
        try:
            return bool(self._body.peek(1))  # type: ignore[attr-defined]  # a BufferedReader
        except OSError:
            return False
        finally:
            self.connection.settimeout(HEAD_TIMEOUT)

    def _answer(self, status: int, rule: str) -> None:
        body = json.dumps({"error": {"message": f"benchseal model relay: {rule}", "type": "invalid_request_error",
                                     "code": "relay_refused"}}).encode()
        reason = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
                  411: "Length Required", 413: "Content Too Large", 414: "URI Too Long", 417: "Expectation Failed",
                  431: "Request Header Fields Too Large"}.get(status, "Bad Request")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        with contextlib.suppress(OSError):
            self.wfile.write(head.encode() + body)


class UnixToTcpRelay(_Relay):
    """Host side: ``socket_path`` -> ``host:port`` (TLS to ``host`` when ``tls``), one admitted model call
    (``POST <model_path>/chat/completions``) per connection.

    ``api_key``: the model key, held here only. The sandbox sends a placeholder (or nothing); every
    credential header it sends is dropped and ``Authorization: Bearer <api_key>`` is added on the way
    out, so the real key is never inside the runner or a task container.
    """

    def __init__(self, socket_path: Path, host: str, port: int, *, model_path: str, tls: bool = False,
                 timeout: float = 30.0, api_key: str | None = None) -> None:
        if api_key is not None and (not api_key or any(ord(c) < 0x21 or ord(c) > 0x7E for c in api_key)):
            raise ValueError("the model key must be printable ASCII without spaces")
        self.api_key = api_key
        self.model_target = model_path.rstrip("/") + "/chat/completions"
        self.authority = host if port == (443 if tls else 80) else f"{host}:{port}"
        self.refused: list[str] = []  # the rule each refused request broke, in order
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bind_unix(listener, socket_path)  # a deep temp dir: through /proc/self/fd
        # The runner connects as its own root; nobody else on the host needs to.
        os.chmod(socket_path, 0o600)
        listener.listen(64)
        context = ssl.create_default_context() if tls else None

        def connect() -> socket.socket:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(None)
            if context is not None:
                return context.wrap_socket(sock, server_hostname=host)
            return sock

        self.socket_path = socket_path
        super().__init__(listener, connect)

    def _handle(self, client: socket.socket) -> None:
        try:
            _Gate(client, ("runner", 0), self)  # type: ignore[arg-type]  # the relay is the gate's "server"
        except Exception:  # noqa: S110 -- one connection's failure never stops the relay
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def forward(self, client: socket.socket, request: bytes) -> None:
        """Send the admitted ``request`` upstream and pass its answer back byte for byte until it closes."""
        client.settimeout(None)
        try:
            upstream = self._connect()
        except OSError:
            return
        try:
            upstream.sendall(request)
            _pump(upstream, client)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.close()


class TcpToUnixRelay(_Relay):
    """Runner (or trial gateway) side: ``127.0.0.1:<port>`` (ephemeral unless given) -> ``socket_path``."""

    def __init__(self, socket_path: Path, port: int = 0) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)

        def connect() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(socket_path))
            return sock

        self.port: int = listener.getsockname()[1]
        super().__init__(listener, connect)


GATEWAY_PORT = 47813  # the model's loopback port inside a trial container (gateway namespace)


def gateway_main(argv: Sequence[str]) -> int:
    """``python3 -m pipeline.infra.sandbox.relay SOCKET [PORT]``: serve 127.0.0.1:PORT -> SOCKET until killed."""
    if not 1 <= len(argv) <= 2 or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python3 -m pipeline.infra.sandbox.relay SOCKET [PORT]", file=sys.stderr)
        return 2
    relay = TcpToUnixRelay(Path(argv[0]), int(argv[1]) if len(argv) == 2 else GATEWAY_PORT)
    relay.start()
    threading.Event().wait()
    return 0  # pragma: no cover - the gateway is removed with its trial container


if __name__ == "__main__":
    raise SystemExit(gateway_main(sys.argv[1:]))
