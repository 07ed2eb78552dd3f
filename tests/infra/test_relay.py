"""The host side of the model relay forwards one admitted model call per connection, nothing else.

Real sockets end to end: the runner's side of the relay socket (a plain AF_UNIX client, as anything
in the runner can be), the relay, and an upstream that counts every connection and keeps every byte
it receives. Each refused class gets a 4xx JSON answer from the relay and the upstream is never
connected to; a streamed (SSE, chunked) chat completion passes through byte for byte.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.project import PLACEHOLDER_KEY
from pipeline.infra.sandbox import relay as relay_module
from pipeline.infra.sandbox.relay import MAX_BODY_BYTES, TcpToUnixRelay, UnixToTcpRelay
from pipeline.local.model_server import ModelServer

BODY = json.dumps({"model": "openai/benchseal-scripted", "stream": True,
                   "messages": [{"role": "user", "content": "hello"}]}).encode()
SSE = b"".join(f"data: {json.dumps({'choices': [{'delta': {'content': w}}]})}\n\n".encode()
               for w in ("Hel", "lo", " world")) + b"data: [DONE]\n\n"
# A streamed answer as a provider sends it: chunked, one chunk per event, then the last chunk.
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
          b"Connection: close\r\n\r\n"
          + b"".join(b"%x\r\n%s\r\n" % (len(event) + 2, event + b"\n\n") for event in SSE.split(b"\n\n") if event)
          + b"0\r\n\r\n")


class Upstream:
    """The model endpoint: counts connections, keeps what each one sent, answers ANSWER in pieces."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        data = b""
        with conn:
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self.received.append(head + b"\r\n\r\n" + body)
                for start in range(0, len(ANSWER), 37):  # streamed in small pieces
                    conn.sendall(ANSWER[start:start + 37])
                    time.sleep(0.001)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


class Handled:
    """Counts the connections a relay has finished handling (its upstream call, if any, is then made)."""

    def __init__(self, relay: UnixToTcpRelay) -> None:
        self.count = 0
        self._cond = threading.Condition()
        handle = relay._handle

        def counted(client: socket.socket) -> None:
            try:
                handle(client)
            finally:
                with self._cond:
                    self.count += 1
                    self._cond.notify_all()

        relay._handle = counted  # type: ignore[method-assign]  # the accept loop looks it up per connection

    def wait(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.count >= count, timeout=20), (self.count, count)


def _start(relay: UnixToTcpRelay) -> UnixToTcpRelay:
    relay.handled = Handled(relay)  # type: ignore[attr-defined]
    return relay.start()  # type: ignore[return-value]


@pytest.fixture
def gate(tmp_path: Path, upstream: Upstream) -> Iterator[UnixToTcpRelay]:
    relay = _start(UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", upstream.port, model_path="/v1/"))
    yield relay
    relay.stop()


def _assert_nothing_went_upstream(relay: UnixToTcpRelay, upstream: Upstream, connections: int = 0) -> None:
    """A positive observation, not a sleep: once the relay has finished every connection so far, one admitted
    call goes through and is answered; the upstream accepts in order, so it has then seen every connection the
    relay ever made, and the admitted call must be the only new one."""
    handled: Handled = relay.handled  # type: ignore[attr-defined]
    handled.wait(relay.connections)
    received = len(upstream.received)
    assert upstream.connections == connections and received == connections
    assert _exchange(relay.socket_path, _with(), half_close=False) == ANSWER
    assert upstream.connections == connections + 1, "a refused request reached the upstream"
    assert len(upstream.received) == received + 1
    assert upstream.received[-1].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")


def _exchange(path: Path, data: bytes, *, half_close: bool = True, timeout: float = 20) -> bytes:
    """Send ``data`` on the relay socket as the runner would, return everything answered until close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _request(method: str = "POST", target: str = "/v1/chat/completions", *, headers: list[str] | None = None,
             body: bytes = BODY, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} {target} {version}"]
    lines += headers if headers is not None else [
        "Host: 127.0.0.1:47813", "Content-Type: application/json", "Authorization: Bearer sk-test",
        f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _with(*extra: str, body: bytes = BODY, drop: tuple[str, ...] = ()) -> bytes:
    base = ["Host: 127.0.0.1:47813", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    return _request(headers=[h for h in base if not h.lower().startswith(drop)] + list(extra), body=body)


TLS_HELLO = bytes.fromhex("16030100a5010000a10303") + bytes(32) + b"\x00\x00\x02\x13\x01\x01\x00"

# class -> (bytes the runner sends, the status the relay answers, a word of its rule)
REFUSED: dict[str, tuple[bytes, int, str]] = {
    "CONNECT tunnel": (b"CONNECT 127.0.0.1:5055 HTTP/1.1\r\nHost: 127.0.0.1:5055\r\n\r\n", 405, "CONNECT"),
    "CONNECT to the model's own port": (b"CONNECT 127.0.0.1:47813 HTTP/1.1\r\nHost: 127.0.0.1:47813\r\n\r\n", 405,
                                        "CONNECT"),
    "absolute-URI target (proxy request)": (_request(target="http://127.0.0.1:5055/v1/chat/completions"), 400,
                                            "origin-form"),
    "absolute-URI to the model path": (_request(target="http://127.0.0.1:47813/v1/chat/completions"), 400,
                                       "origin-form"),
    "asterisk target": (b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405, "OPTIONS"),
    "foreign Host": (_with("Host: registry.example:5055", drop=("host",)), 400, "Host"),
    "metadata Host": (_with("Host: 169.254.169.254", drop=("host",)), 400, "Host"),
    "lookalike Host": (_with("Host: 127.0.0.1.nip.io:47813", drop=("host",)), 400, "Host"),
    "userinfo Host": (_with("Host: 127.0.0.1@evil.example", drop=("host",)), 400, "Host"),
    "two Hosts": (_with("Host: evil.example"), 400, "twice"),
    "no Host": (_with(drop=("host",)), 400, "Host header is required"),
    "HTTP/1.0 without Host": (_request(headers=[f"Content-Length: {len(BODY)}"], version="HTTP/1.0"), 400, "Host"),
    "websocket Upgrade": (_with("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13"), 400,
                          "Upgrade"),
    "h2c Upgrade": (_with("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQAAP__"),
                    400, "Upgrade"),
    "Upgrade without Connection": (_with("Upgrade: websocket"), 400, "Upgrade"),
    "Connection naming a header to strip": (_with("Connection: close, Authorization"), 400, "Connection"),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "request line"),
    "TLS ClientHello": (TLS_HELLO, 400, "request line"),
    "SSH banner": (b"SSH-2.0-OpenSSH_9.2\r\n", 400, "request line"),
    "raw bytes without a newline": (bytes(range(256)), 400, "request line"),
    "HTTP/0.9": (b"GET /v1/chat/completions\r\n", 400, "request line"),
    "lower-case method": (_request(method="post"), 400, "request line"),
    "two spaces in the request line": (b"POST  /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400,
                                       "request line"),
    "pipelined second request": (_with() + b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1:5055\r\n\r\n", 400,
                                 "one request per connection"),
    "smuggled request after a short body (CL)": (
        _request(headers=["Host: 127.0.0.1", "Content-Length: 2"], body=b"{}GET /v2/ HTTP/1.1\r\nHost: x\r\n\r\n"),
        400, "one request per connection"),
    "Transfer-Encoding chunked (TE)": (_with("Transfer-Encoding: chunked", drop=("content-length",),
                                             body=b"2\r\n{}\r\n0\r\n\r\n"), 411, "Transfer-Encoding"),
    "Content-Length and Transfer-Encoding (CL.TE)": (_with("Transfer-Encoding: chunked"), 411, "Transfer-Encoding"),
    "obfuscated Transfer-Encoding": (_with("Transfer-Encoding: xchunked"), 411, "Transfer-Encoding"),
    "two Content-Lengths": (_with(f"Content-Length: {len(BODY) + 1}"), 400, "twice"),
    "signed Content-Length": (_with(f"Content-Length: +{len(BODY)}", drop=("content-length",)), 400, "decimal"),
    "no Content-Length": (_with(drop=("content-length",), body=b""), 411, "Content-Length"),
    "body over the bound": (_with(f"Content-Length: {MAX_BODY_BYTES + 1}", drop=("content-length",), body=b""),
                            413, "larger than"),
    "head over the bound": (_with("X-Pad: " + "a" * 40_000), 431, "larger than"),
    "many headers": (_with(*[f"X-H{i}: v" for i in range(150)]), 431, ""),
    "folded header (obs-fold)": (_with("X-Folded: a", " Host: evil.example"), 400, "folded"),
    "NUL in a header value": (_with("X-Nul: a\x00b"), 400, "control"),
    "header name with a space": (_with("Bad Name: x"), 400, ""),
    "Expect other than 100-continue": (_with("Expect: 200-ok"), 417, "Expect"),
    "GET of the model list": (_request("GET", "/v1/models", headers=["Host: 127.0.0.1"], body=b""), 405, "GET"),
    "GET of the chat path": (_request("GET", headers=["Host: 127.0.0.1"], body=b""), 405, "GET"),
    "another path": (_request(target="/v2/"), 404, "only POST /v1/chat/completions"),
    "another model API": (_request(target="/v1/embeddings"), 404, "only POST"),
    "query string": (_request(target="/v1/chat/completions?api-version=x"), 404, "only POST"),
    "dot segments": (_request(target="/v1/chat/completions/../../../v2/"), 404, "only POST"),
    "percent-encoded path": (_request(target="/v1/chat%2Fcompletions"), 404, "only POST"),
    "double slash path": (_request(target="//127.0.0.1:5055/v1/chat/completions"), 404, "only POST"),
    "trailing slash": (_request(target="/v1/chat/completions/"), 404, "only POST"),
    "HTTP/2 version": (_request(version="HTTP/2.0"), 400, "request line"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_classes_reach_no_upstream(gate: UnixToTcpRelay, upstream: Upstream, case: str) -> None:
    data, status, rule = REFUSED[case]
    answer = _exchange(gate.socket_path, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), (case, answer[:300])
    message = json.loads(body)["error"]["message"]
    assert message.startswith("benchseal model relay: ") and rule in message, (case, message)
    assert b"Connection: close" in head
    assert gate.refused and rule in gate.refused[-1]
    _assert_nothing_went_upstream(gate, upstream)


def test_a_slow_head_is_refused_and_reaches_no_upstream(gate: UnixToTcpRelay, upstream: Upstream,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module._Gate, "timeout", 0.5)
    answer = _exchange(gate.socket_path, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                       half_close=False)
    assert answer.startswith(b"HTTP/1.1 408 ")
    _assert_nothing_went_upstream(gate, upstream)


def test_a_head_trickled_byte_by_byte_is_cut_off_at_the_deadline(gate: UnixToTcpRelay, upstream: Upstream,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline covers the whole head, not each read: a byte every 0.1 s never lets a read time out."""
    monkeypatch.setattr(relay_module._Gate, "timeout", 0.5)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(gate.socket_path))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
        sent = 0
        # Waiting for the relay's answer is the pace: a byte whenever 0.1 s passes without one.
        while not select.select([sock], [], [], 0.1)[0]:
            sent += 1
            assert sent < 100, "the relay kept reading a head that trickled in for 10 s"
            sock.sendall(b"a")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and sent >= 1, (sent, answer[:200])
    _assert_nothing_went_upstream(gate, upstream)


def test_bytes_after_an_admitted_request_never_reach_the_upstream(tmp_path: Path) -> None:
    """The relay reads nothing from the runner once a request is admitted: a second request sent while the
    answer is under way is not forwarded (the upstream reads to its EOF, which comes after anything forwarded).
    (The runner may then see a reset instead of the answer: the relay closes on the bytes it never read.)"""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(20)
        relay = UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", listener.getsockname()[1], model_path="/v1")
        relay.start()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(20)
                client.connect(str(relay.socket_path))
                client.sendall(_with())
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(20)
                    first = b""
                    while not first.endswith(BODY):
                        first += conn.recv(65536)
                    client.sendall(_with())  # the upstream has the first request: the relay is forwarding
                    client.shutdown(socket.SHUT_WR)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    conn.shutdown(socket.SHUT_WR)
                    after = b""
                    while chunk := conn.recv(65536):
                        after += chunk
        finally:
            relay.stop()
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and first.count(b"POST ") == 1
    assert after == b"", after[:200]


def test_a_streamed_chat_completion_passes_through_intact(gate: UnixToTcpRelay, upstream: Upstream) -> None:
    answer = _exchange(gate.socket_path, _with("Authorization: Bearer sk-test", "Accept: text/event-stream",
                                               "Connection: keep-alive", "X-Stainless-Lang: python"),
                       half_close=False)
    assert answer == ANSWER  # byte for byte: status, headers, every chunk, the last chunk
    assert upstream.connections == 1
    (sent,) = upstream.received
    head, _, body = sent.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    # Re-serialised for the one upstream: its own Host, one Content-Length, Connection: close.
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert lines[1] == f"Host: 127.0.0.1:{upstream.port}"
    assert body == BODY and f"Content-Length: {len(BODY)}" in lines and "Connection: close" in lines
    assert "X-Stainless-Lang: python" in lines
    # The sandbox's credential is never forwarded (a relay without a key adds none: see below).
    assert not any(line.lower().startswith("authorization:") for line in lines) and b"sk-test" not in sent
    assert not any(line.lower().startswith(("connection: keep", "host: 127.0.0.1:47813")) for line in lines)


def test_a_header_value_with_bytes_beyond_ascii_is_forwarded_as_sent(gate: UnixToTcpRelay, upstream: Upstream) -> None:
    """obs-text (0x80-0xFF) is legal in a field value: forwarded byte for byte, not dropped or re-encoded."""
    title = "X-Title: caf\u00e9 \u00fc\u00ff"
    assert _exchange(gate.socket_path, _with(title), half_close=False) == ANSWER
    (sent,) = upstream.received
    assert title.encode("latin-1") in sent.split(b"\r\n")


def test_expect_100_continue_is_answered_by_the_relay_after_the_head_is_admitted(
        gate: UnixToTcpRelay, upstream: Upstream) -> None:
    head = _with("Expect: 100-continue").partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(gate.socket_path))
        sock.sendall(head)
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert upstream.connections == 0  # nothing goes upstream before the body is complete
        sock.sendall(BODY)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer == ANSWER and upstream.connections == 1
    assert b"expect" not in upstream.received[0].lower()


def test_a_real_client_through_both_relays_streams_and_is_refused_elsewhere(tmp_path: Path, gate: UnixToTcpRelay,
                                                                             upstream: Upstream) -> None:
    """http.client (what LiteLLM's transport speaks) through the runner's loopback relay and the host gate."""
    runner_side = TcpToUnixRelay(gate.socket_path)
    runner_side.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", runner_side.port, timeout=20)
        conn.request("POST", "/v1/chat/completions", body=BODY,
                     headers={"Content-Type": "application/json", "Authorization": "Bearer sk-test"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
        assert response.read() == SSE  # every event, in order, de-chunked by the client
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", runner_side.port, timeout=20)
        conn.request("GET", "/v1/models", headers={"Host": "127.0.0.1:5055"})
        refused = conn.getresponse()
        assert refused.status == 405 and json.loads(refused.read())["error"]["code"] == "relay_refused"
        conn.close()
    finally:
        runner_side.stop()
    assert upstream.connections == 1


def test_the_gate_keeps_serving_after_refusals(gate: UnixToTcpRelay, upstream: Upstream) -> None:
    for data, _, _ in list(REFUSED.values())[:10]:
        _exchange(gate.socket_path, data)
    assert _exchange(gate.socket_path, _with(), half_close=False) == ANSWER
    assert upstream.connections == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=2048),
                      st.tuples(st.integers(0, len(_with())), st.binary(min_size=1, max_size=16)).map(
                          lambda cut: _with()[:cut[0]] + cut[1] + _with()[cut[0]:])))
def test_random_bytes_are_refused_or_forwarded_as_one_admitted_request(gate: UnixToTcpRelay, upstream: Upstream,
                                                                      data: bytes) -> None:
    """Random bytes, and a valid call with random bytes inserted: a 4xx, or the one admitted call upstream."""
    before = upstream.connections
    answer = _exchange(gate.socket_path, data)
    if answer == ANSWER:
        # Admitted (the upstream answered it, so it has its request): a re-serialised POST of the model path.
        assert upstream.connections == before + 1
        assert upstream.received[-1].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    else:
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
        _assert_nothing_went_upstream(gate, upstream, before)


# --- the model key: held by the relay only, added on the way out --------------------------------

RELAY_KEY = "sk-relay-" + "0123456789abcdef" * 2
CLIENT_SECRET = "sk-sandbox-chose-this-9f8e7d6c"  # what anything inside the sandbox might send


@pytest.fixture
def keyed_gate(tmp_path: Path, upstream: Upstream) -> Iterator[UnixToTcpRelay]:
    relay = _start(UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", upstream.port, model_path="/v1",
                                  api_key=RELAY_KEY))
    yield relay
    relay.stop()


def _head_lines(sent: bytes) -> list[str]:
    return sent.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]


def _credential_lines(sent: bytes) -> list[str]:
    return [line for line in _head_lines(sent)
            if line.split(":", 1)[0].strip().lower() in ("authorization", "api-key", "x-api-key",
                                                         "proxy-authorization")]


@pytest.mark.parametrize("credentials", [
    pytest.param([f"Authorization: Bearer {PLACEHOLDER_KEY}"], id="the placeholder"),
    pytest.param([f"Authorization: Bearer {CLIENT_SECRET}"], id="a bearer of the sandbox's choosing"),
    pytest.param([f"authorization: Basic {CLIENT_SECRET}"], id="lower-case name, another scheme"),
    pytest.param([f"AUTHORIZATION: Bearer {CLIENT_SECRET}"], id="upper-case name"),
    pytest.param([f"X-Api-Key: {CLIENT_SECRET}"], id="X-Api-Key alone"),
    pytest.param([f"api-key: {CLIENT_SECRET}"], id="api-key alone (Azure)"),
    pytest.param([f"Authorization: Bearer {PLACEHOLDER_KEY}", f"X-API-KEY: {CLIENT_SECRET}",
                  f"Api-Key: {CLIENT_SECRET}", f"Proxy-Authorization: Basic {CLIENT_SECRET}"], id="all of them"),
    pytest.param([], id="no credential at all"),
])
def test_upstream_sees_exactly_the_relays_key_once(keyed_gate: UnixToTcpRelay, upstream: Upstream,
                                                     credentials: list[str]) -> None:
    answer = _exchange(keyed_gate.socket_path, _with(*credentials, "X-Stainless-Lang: python"), half_close=False)
    assert answer == ANSWER
    (sent,) = upstream.received
    # Exactly one credential header upstream, the relay's, whatever the sandbox sent (or did not).
    assert _credential_lines(sent) == [f"Authorization: Bearer {RELAY_KEY}"], _head_lines(sent)
    assert CLIENT_SECRET.encode() not in sent and PLACEHOLDER_KEY.encode() not in sent
    assert sent.count(RELAY_KEY.encode()) == 1
    # The rest of the request is forwarded as before: the body intact, other headers kept.
    assert sent.partition(b"\r\n\r\n")[2] == BODY
    assert "X-Stainless-Lang: python" in _head_lines(sent) and "Content-Type: application/json" in _head_lines(sent)
    # Nothing of the key travels back to the sandbox.
    assert RELAY_KEY.encode() not in answer


def test_two_authorization_headers_are_refused_not_merged(keyed_gate: UnixToTcpRelay, upstream: Upstream) -> None:
    answer = _exchange(keyed_gate.socket_path, _with(f"Authorization: Bearer {PLACEHOLDER_KEY}",
                                                     f"Authorization: Bearer {CLIENT_SECRET}"))
    assert answer.startswith(b"HTTP/1.1 400 ") and b"twice" in answer
    assert RELAY_KEY.encode() not in answer
    _assert_nothing_went_upstream(keyed_gate, upstream)


def test_a_refused_request_never_carries_the_key_anywhere(keyed_gate: UnixToTcpRelay, upstream: Upstream) -> None:
    for data, _, _ in REFUSED.values():
        answer = _exchange(keyed_gate.socket_path, data)
        assert RELAY_KEY.encode() not in answer
    assert not any(RELAY_KEY in rule for rule in keyed_gate.refused)
    _assert_nothing_went_upstream(keyed_gate, upstream)


def test_without_a_relay_key_the_client_credential_is_still_dropped(gate: UnixToTcpRelay, upstream: Upstream) -> None:
    """A relay built without ``api_key`` forwards no credential at all: the sandbox can never supply one."""
    assert _exchange(gate.socket_path, _with(f"Authorization: Bearer {CLIENT_SECRET}", f"X-Api-Key: {CLIENT_SECRET}"),
                     half_close=False) == ANSWER
    (sent,) = upstream.received
    assert _credential_lines(sent) == [] and CLIENT_SECRET.encode() not in sent


def test_the_scripted_model_accepts_the_placeholder_only_through_the_keyed_relay(tmp_path: Path) -> None:
    """A real model server that refuses any key but its own: the sandbox's placeholder (the runner's
    OPENAI_API_KEY) gets 200 through a relay holding the key, and 401 through one that holds none."""
    log = tmp_path / "model.jsonl"
    chat = json.dumps({"model": "openai/benchseal-scripted",
                       "messages": [{"role": "user", "content": "Write the answer"}]}).encode()
    with ModelServer(key=RELAY_KEY, log_path=log) as server:
        keyed = UnixToTcpRelay(tmp_path / "keyed.sock", "127.0.0.1", server.port, model_path="/v1",
                               api_key=RELAY_KEY)
        bare = UnixToTcpRelay(tmp_path / "bare.sock", "127.0.0.1", server.port, model_path="/v1")
        wrong = UnixToTcpRelay(tmp_path / "wrong.sock", "127.0.0.1", server.port, model_path="/v1",
                               api_key=RELAY_KEY[:-1] + "X")
        for relay in (keyed, bare, wrong):
            relay.start()
        try:
            answers = {name: _exchange(relay.socket_path, _with(f"Authorization: Bearer {PLACEHOLDER_KEY}", body=chat),
                                       half_close=False)
                       for name, relay in (("keyed", keyed), ("bare", bare), ("wrong", wrong))}
            # The sandbox may even send the real key: it is dropped, the relay's own key decides.
            answers["keyed_with_real"] = _exchange(
                keyed.socket_path, _with(f"Authorization: Bearer {RELAY_KEY}", body=chat), half_close=False)
            answers["bare_with_real"] = _exchange(
                bare.socket_path, _with(f"Authorization: Bearer {RELAY_KEY}", body=chat), half_close=False)
        finally:
            for relay in (keyed, bare, wrong):
                relay.stop()
    statuses = {name: answer.split(b" ", 2)[1] for name, answer in answers.items()}
    assert statuses == {"keyed": b"200", "bare": b"401", "wrong": b"401", "keyed_with_real": b"200",
                        "bare_with_real": b"401"}, statuses
    assert json.loads(answers["keyed"].partition(b"\r\n\r\n")[2])["model"] == "benchseal-scripted"
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["status"], r.get("auth")) for r in logged] == [(200, None), (401, "missing"), (401, "wrong"),
                                                              (200, None), (401, "missing")]
    assert RELAY_KEY not in log.read_text()


@pytest.mark.parametrize("key", ["", " ", "sk-with space", "sk-tab\tkey", "sk-key\r\nX-Injected: 1", "sk-key\n",
                                 "sk-nul\0", "sk-del\x7f", "sk-ключ", "sk-\u00a0nbsp", "\u202esk-bidi"])
def test_a_key_that_could_break_the_header_is_refused_at_construction(tmp_path: Path, key: str) -> None:
    path = tmp_path / "model.sock"
    with pytest.raises(ValueError, match="printable ASCII"):
        UnixToTcpRelay(path, "127.0.0.1", 9, model_path="/v1", api_key=key)
    assert not path.exists()  # refused before it listened


def test_a_printable_key_is_taken_as_is(tmp_path: Path) -> None:
    key = "".join(chr(c) for c in range(0x21, 0x7F))
    relay = UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", 9, model_path="/v1", api_key=key)
    relay.start()
    try:
        assert relay.api_key == key
    finally:
        relay.stop()
