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
connection, parsed and re-serialised by ``h11`` as the engine proxy's are (no hand-written parser),
admitted only as ``POST <the policy's model path>/chat/completions`` (origin-form target, a
loopback or the upstream's own ``Host``, a ``Content-Length`` body of bounded size, no
``Upgrade``, no ``Transfer-Encoding``, nothing already sent after the body, a head of bounded size, head
and body read within one deadline) and sent to the one upstream the policy names. Anything else gets a
4xx JSON answer from the relay and the upstream sees no connection at all. The answer (e.g. a
streamed, chunked chat completion) is passed back byte for byte.

The model key lives only here: the sandbox holds a placeholder, the relay drops every credential
header the request carries and adds the real one (``UnixToTcpRelay(api_key=...)``).

Model usage is counted here too, on the side the agent cannot reach: each answer the upstream sends
back is also read (``answer_usage``: h11 parses the response, the body's ``usage``, or a stream's last
event that carries one), and a successful call is added to a ``UsageTally`` under the key its listener
was made for (a trial container's gateway: its compose project, ``pipeline.infra.sandbox.agents``).
Whatever the agent says about its own tokens is never read.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11

from pipeline.core.fsutil import bind_unix

_BUF = 65536
# Bounds on what one model call may send: its head (request line and headers) and its body.
MAX_HEAD_BYTES = 32 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
HEAD_TIMEOUT = 30.0  # seconds to send the head and the body (a model's answer may take longer)
MAX_HEADERS = 100  # header fields in one head (what the standard library's parser allowed before h11)
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
# Hop-by-hop or re-written by the relay: never forwarded as the client sent them.
_NOT_FORWARDED = frozenset({"host", "content-length", "connection", "keep-alive", "proxy-connection", "te",
                            "trailer", "expect", "proxy-authorization", "proxy-authenticate"})
# Credentials are the relay's to add: whatever the sandbox sent (a placeholder) never goes upstream.
_CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


# What of one answer is kept to count its usage (the answer itself is passed on whole, whatever its size).
MAX_COUNTED_ANSWER = 32 * 1024 * 1024


@dataclass(frozen=True)
class CallUsage:
    """Model usage: successful calls, and the tokens of those whose answer reported them (None: none did)."""

    calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None

    def plus(self, other: CallUsage) -> CallUsage:
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)
        return CallUsage(self.calls + other.calls, add(self.input_tokens, other.input_tokens),
                         add(self.output_tokens, other.output_tokens))


class UsageTally:
    """Model usage per key (a trial container's compose project; ``""`` for the runner's own socket), added to by
    every relay listener that shares it, read by the worker when it records a trial."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, CallUsage] = {}
        self.counting = False  # a relay counts into it (the agent is model-backed): no call is then zero calls

    def add(self, key: str, usage: CallUsage) -> None:
        with self._lock:
            self._by_key[key] = self._by_key.get(key, CallUsage()).plus(usage)

    def snapshot(self) -> dict[str, CallUsage]:
        with self._lock:
            return dict(self._by_key)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage_of(document: object) -> tuple[int, int] | None:
    """(input, output) tokens of a chat completion (or a stream's chunk) that carries ``usage``."""
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None
    inp = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    out = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    return (inp, out) if inp is not None and out is not None else None


def answer_usage(answer: bytes) -> CallUsage | None:
    """The usage of one upstream answer (HTTP/1.x, any framing h11 reads: Content-Length, chunked or up to the
    close): None unless its status is 2xx; a successful call whose tokens are unknown when its body (a JSON
    completion, or Server-Sent Events whose last event with a ``usage`` counts) reports none."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "model"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(answer)
    conn.receive_data(b"")
    status, body = None, bytearray()
    try:
        while not isinstance(event := conn.next_event(), (h11.EndOfMessage, h11.ConnectionClosed)):
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
    except h11.RemoteProtocolError:
        pass  # a truncated or malformed answer: what was read so far counts
    if status is None or not 200 <= status < 300:
        return None
    found: tuple[int, int] | None = None
    try:
        found = _usage_of(json.loads(body))
    except ValueError:
        for line in bytes(body).splitlines():
            data = line.removeprefix(b"data:").strip() if line.startswith(b"data:") else b""
            if not data or data == b"[DONE]":
                continue
            try:
                found = _usage_of(json.loads(data)) or found
            except ValueError:
                continue
    return CallUsage(1, *found) if found is not None else CallUsage(1)


def _pump(src: socket.socket, dst: socket.socket, keep: bytearray | None = None) -> None:
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            if keep is not None and len(keep) < MAX_COUNTED_ANSWER:
                keep += data[:MAX_COUNTED_ANSWER - len(keep)]
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


_REQUEST_LINE_RULE = "not an HTTP/1.0 or HTTP/1.1 request line (METHOD SP TARGET SP HTTP/1.x)"
# What h11 refuses, as the relay words it (h11 is pinned; an unknown refusal is still a 400 with h11's words).
_H11_REFUSALS: tuple[tuple[str, int, str], ...] = (
    ("illegal request line", 400, _REQUEST_LINE_RULE),
    ("peer unexpectedly closed", 400, "the connection ended inside the request head (request line and headers)"),
    ("illegal header line", 400, "malformed header line (a name that is not an HTTP token, or control characters)"),
    ("Found multiple Host", 400, "header Host given twice"),
    ("Missing mandatory Host", 400, "a Host header is required"),
    ("conflicting Content-Length", 400, "header Content-Length given twice"),
    ("bad Content-Length", 400, "Content-Length must be a decimal number"),
    ("Only Transfer-Encoding", 411, "Transfer-Encoding is not forwarded: send a Content-Length body"),
    ("Receive buffer too long", 431, f"request head larger than {MAX_HEAD_BYTES} bytes"),
)


def _model_host(host: str, authority: str) -> bool:
    """``Host`` names the model endpoint: the upstream's own authority, or a loopback name with a port or none."""
    if host.lower() == authority.lower():
        return True
    name, colon, port = host.rpartition(":")
    if not colon or host.endswith("]"):  # no port (an IPv6 literal's colons are inside [])
        name, port = host, "0"
    return name.lower() in _LOOPBACK and port.isascii() and port.isdigit() and len(port) <= 5


def _h11_refusal(exc: h11.RemoteProtocolError) -> _Refused:
    text = str(exc)
    for prefix, status, rule in _H11_REFUSALS:
        if text.startswith(prefix):
            return _Refused(status, rule)
    return _Refused(400, f"malformed request ({text[:120]})")


class _Gate:
    """Reads ONE request from the runner with h11 and forwards it re-serialised, or refuses it (module docstring)."""

    timeout = HEAD_TIMEOUT  # the whole head and body, not each read

    def __init__(self, sock: socket.socket, relay: UnixToTcpRelay) -> None:
        self.sock = sock
        self.relay = relay
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.received = bytearray()  # what h11 was given before the head was parsed (its size, folded lines)
        self.deadline = time.monotonic() + self.timeout

    def handle(self) -> None:
        try:
            request = self._admit()
        except _Refused as refusal:
            self.relay.refused.append(refusal.rule)
            self._answer(refusal.status, refusal.rule)
            return
        except TimeoutError:
            self.relay.refused.append("request not received in time")
            self._answer(408, f"the request head and body must arrive within {self.timeout:g} s")
            return
        except OSError:
            return  # the client went away
        if request is not None:
            self.relay.forward(self.sock, request)

    def _next(self) -> Any:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _h11_refusal(exc) from None
            if event is not h11.NEED_DATA:
                return event
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            data = self.sock.recv(_BUF)
            if self.conn.their_state is h11.IDLE:
                self.received += data
            self.conn.receive_data(data)

    def _admit(self) -> bytes | None:
        event = self._next()
        if isinstance(event, h11.ConnectionClosed):
            return None  # connected and closed: nothing to forward
        if not isinstance(event, h11.Request):
            raise _Refused(400, _REQUEST_LINE_RULE)
        head = bytes(self.received[:len(self.received) - len(self.conn.trailing_data[0])])
        if len(head) > MAX_HEAD_BYTES:
            raise _Refused(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        method, target = event.method.decode("latin-1"), event.target.decode("latin-1")
        # h11 takes any token as a method and any HTTP/x.y: the relay speaks HTTP/1.x with an upper-case method.
        if not (method.isalpha() and method.isupper()) or event.http_version not in (b"1.0", b"1.1"):
            raise _Refused(400, _REQUEST_LINE_RULE)
        if method != "POST":
            raise _Refused(405, f"method {method} is not forwarded (only POST {self.relay.model_target})")
        if not target.startswith("/"):
            raise _Refused(400, "only an origin-form target (/path) is forwarded, not an absolute URI or authority")
        if target != self.relay.model_target:
            raise _Refused(404, f"only POST {self.relay.model_target} is forwarded")
        # h11 unfolds an obsolete folded line into the header before it; RFC 9112 lets a server refuse it.
        if b"\n " in head or b"\n\t" in head:
            raise _Refused(400, "a folded header line (obs-fold) is not allowed")
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers.raw_items()]
        seen = self._checked_headers(headers)
        length = seen.get("content-length")
        if length is None:
            raise _Refused(411, "a Content-Length is required")
        size = int(length)  # h11 admitted it as decimal digits, and only one value
        if size > MAX_BODY_BYTES:
            raise _Refused(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        if self.conn.they_are_waiting_for_100_continue:  # sent once the head is admitted, not before
            self.sock.sendall(self.conn.send(h11.InformationalResponse(status_code=100, headers=[],
                                                                       reason=b"Continue")) or b"")
        body = bytearray()
        while not isinstance(event := self._next_or_none(), h11.EndOfMessage):
            if event is None:
                return None  # the client closed before its body was complete
            body += event.data
        # Bytes already here after the body: a pipelined or smuggled second request. Whatever comes later is
        # never read (``forward`` only passes the upstream's answer back), so never forwarded either.
        if self.conn.trailing_data[0]:
            raise _Refused(400, "one request per connection: bytes after the request body are not forwarded")
        out = [("Host", self.relay.authority)]
        out += [(name, value) for name, value in headers
                if name.lower() not in _NOT_FORWARDED and name.lower() not in _CREDENTIAL_HEADERS]
        if self.relay.api_key is not None:
            out.append(("Authorization", f"Bearer {self.relay.api_key}"))
        out += [("Content-Length", str(size)), ("Connection", "close")]
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in out]  # h11 encodes str as ASCII
        upstream = h11.Connection(h11.CLIENT)  # re-serialised by h11 too: nothing of the client's framing stays
        return b"".join(upstream.send(part) or b"" for part in (
            h11.Request(method="POST", target=target, headers=raw), h11.Data(data=bytes(body)), h11.EndOfMessage()))

    def _next_or_none(self) -> h11.Data | h11.EndOfMessage | None:
        try:
            event = self._next()
        except _Refused:
            return None  # h11: the peer closed inside the body
        return event if isinstance(event, (h11.Data, h11.EndOfMessage)) else None

    def _checked_headers(self, headers: list[tuple[str, str]]) -> dict[str, str]:
        """The relay's rules over what h11 parsed (names are tokens and values free of controls already)."""
        if len(headers) > MAX_HEADERS:
            raise _Refused(431, f"more than {MAX_HEADERS} header fields")
        seen: dict[str, str] = {}
        for name, value in headers:
            lower = name.lower()
            if lower in seen:
                raise _Refused(400, f"header {name} given twice")
            seen[lower] = value
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
        if not _model_host(host, self.relay.authority):
            raise _Refused(400, f"Host {host[:80]!r} is not the model endpoint (loopback or {self.relay.authority})")
        return seen

    def _answer(self, status: int, rule: str) -> None:
        body = json.dumps({"error": {"message": f"benchseal model relay: {rule}", "type": "invalid_request_error",
                                     "code": "relay_refused"}}).encode()
        reason = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
                  411: "Length Required", 413: "Content Too Large", 417: "Expectation Failed",
                  431: "Request Header Fields Too Large"}.get(status, "Bad Request")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        with contextlib.suppress(OSError):
            self.sock.sendall(head.encode() + body)
            # Drop what the client is still sending, briefly: closing on unread bytes would reset the
            # connection and could lose the answer. Nothing read here is parsed or forwarded.
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(0.5)
            drained, until = 0, time.monotonic() + 2
            while drained < MAX_BODY_BYTES and time.monotonic() < until and (chunk := self.sock.recv(_BUF)):
                drained += len(chunk)


class UnixToTcpRelay(_Relay):
    """Host side: ``socket_path`` -> ``host:port`` (TLS to ``host`` when ``tls``), one admitted model call
    (``POST <model_path>/chat/completions``) per connection.

    ``api_key``: the model key, held here only. The sandbox sends a placeholder (or nothing); every
    credential header it sends is dropped and ``Authorization: Bearer <api_key>`` is added on the way
    out, so the real key is never inside the runner or a task container.
    """

    def __init__(self, socket_path: Path, host: str, port: int, *, model_path: str, tls: bool = False,
                 timeout: float = 30.0, api_key: str | None = None, usage: UsageTally | None = None,
                 usage_key: str = "") -> None:
        if api_key is not None and (not api_key or any(ord(c) < 0x21 or ord(c) > 0x7E for c in api_key)):
            raise ValueError("the model key must be printable ASCII without spaces")
        self.api_key = api_key
        # Each answer's usage goes to ``usage`` under ``usage_key`` (the module docstring); a new tally otherwise.
        self.usage = usage if usage is not None else UsageTally()
        self.usage_key = usage_key
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
            _Gate(client, self).handle()
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
        answer = bytearray()
        try:
            upstream.sendall(request)
            _pump(upstream, client, answer)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.close()
        counted = answer_usage(bytes(answer))
        if counted is not None:
            self.usage.add(self.usage_key, counted)


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
