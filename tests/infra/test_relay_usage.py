"""A trial's model usage is counted by the worker's relay from the model's own answers (issue 37: summary.json's
``model_usage`` was None for hello-agent releases, and what counts existed came from the agent's report of
itself). Real sockets and the real scripted model server: whatever the request claims, the count is the usage
the server answered with (and logged); a call the relay refuses or the model fails counts nothing; each
gateway's socket counts under its trial container's compose project, which ``trial_usage`` gives to its trial.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from pipeline.infra.sandbox.agents import GatewayRelays, trial_usage
from pipeline.infra.sandbox.relay import CallUsage, UnixToTcpRelay, UsageTally, answer_usage
from pipeline.local.model_server import ModelServer

KEY = "sk-relay-usage-test"
FORGED = {"prompt_tokens": 10**9, "completion_tokens": 10**9, "total_tokens": 2 * 10**9}


def _chat(text: str, **extra: Any) -> bytes:
    # A request that also claims a usage of its own: nothing the agent sends is counted.
    return json.dumps({"model": "benchseal-scripted", "messages": [{"role": "user", "content": text}],
                       "usage": FORGED, **extra}).encode()


def _call(path: Path, body: bytes, target: str = "/v1/chat/completions") -> bytes:
    """One request through a relay socket, as anything in the sandbox can send it; the whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nAuthorization: Bearer placeholder\r\n\r\n".encode() + body)
        answer = bytearray()
        while chunk := sock.recv(65536):
            answer += chunk
    return bytes(answer)


def _logged(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_relay_counts_the_usage_the_model_answered_never_the_request_s(tmp_path: Path) -> None:
    log, tally = tmp_path / "model.jsonl", UsageTally()
    with ModelServer(key=KEY, log_path=log) as server:
        relay = UnixToTcpRelay(tmp_path / "m.sock", "127.0.0.1", server.port, model_path="/v1", api_key=KEY,
                               usage=tally, usage_key="t1__abc")
        wrong_key = UnixToTcpRelay(tmp_path / "w.sock", "127.0.0.1", server.port, model_path="/v1",
                                   api_key=KEY + "x", usage=tally, usage_key="t1__abc")
        relay.start()
        wrong_key.start()
        try:
            answers = [_call(relay.socket_path, _chat("Write the answer")),
                       _call(relay.socket_path, _chat("Write the answer, longer this time please")),
                       _call(relay.socket_path, _chat("Stream it", stream=True, stream_options={"include_usage": True}))]
            streamed_without_usage = _call(relay.socket_path, _chat("Stream it", stream=True))
            refused = _call(relay.socket_path, _chat("x"), target="/v1/embeddings")  # the relay's 404: no upstream
            failed = _call(wrong_key.socket_path, _chat("x"))  # the model's 401
        finally:
            relay.stop()
            wrong_key.stop()
    assert all(a.startswith(b"HTTP/1.0 200") or a.startswith(b"HTTP/1.1 200") for a in answers), answers
    assert b" 200 " in streamed_without_usage.split(b"\r\n", 1)[0]
    assert b" 404 " in refused.split(b"\r\n", 1)[0] and b" 401 " in failed.split(b"\r\n", 1)[0]
    served = [r for r in _logged(log) if r["status"] == 200]
    assert len(served) == 4 and [r["status"] for r in _logged(log)].count(401) == 1
    # Four successful calls; the tokens of the three whose answer reported them (a stream reports usage only when
    # asked to: stream_options.include_usage), exactly as the server counted them and not the request's claim.
    reported = served[:3]
    assert tally.snapshot() == {"t1__abc": CallUsage(calls=4, input_tokens=sum(r["prompt_tokens"] for r in reported),
                                                     output_tokens=sum(r["completion_tokens"] for r in reported))}
    assert 0 < tally.snapshot()["t1__abc"].input_tokens < 10**6  # type: ignore[operator]


CHUNKED_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (
                   b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n',
                   b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}\n\n',
                   b"data: [DONE]\n\n"))
               + b"0\r\n\r\n")


def _http(status: str, body: bytes) -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


@pytest.mark.parametrize(("answer", "expected"), [
    (CHUNKED_SSE, CallUsage(1, 12, 3)),
    (_http("200 OK", b'{"usage": {"input_tokens": 7, "output_tokens": 2}}'), CallUsage(1, 7, 2)),
    (b'HTTP/1.0 200 OK\r\n\r\n{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}', CallUsage(1, 5, 1)),
    (_http("200 OK", b"{}"), CallUsage(1)),  # a call, its tokens unknown
    (_http("200 OK", b'{"usage": {"prompt_tokens": -1, "completion_tokens": 1}}'), CallUsage(1)),
    (_http("200 OK", b'{"usage": {"prompt_tokens": true, "completion_tokens": 1}}'), CallUsage(1)),
    (_http("200 OK", b'{"usage": {"prompt_tokens": 4, "completion_tokens": 1}}')[:-3], CallUsage(1)),  # cut short
    (_http("500 Internal Server Error", b'{"usage": {"prompt_tokens": 9, "completion_tokens": 9}}'), None),
    (_http("429 Too Many Requests", b""), None),
    (b"not http at all", None),
    (b"", None),
], ids=["chunked-sse", "input-output-names", "http10-close", "no-usage", "negative", "boolean", "truncated", "5xx",
        "429", "garbage", "nothing"])
def test_answer_usage_reads_the_answer_as_the_client_does(answer: bytes, expected: CallUsage | None) -> None:
    assert answer_usage(answer) == expected


def test_each_gateway_counts_under_its_container_s_project_and_trial_usage_gives_it_to_its_trial(
        tmp_path: Path) -> None:
    """Three gateways (the agent box of one trial, the task containers of two trials whose names share a prefix):
    each has a socket of its own; a trial's usage is its box's and its environment's, never its neighbour's."""
    log, tally = tmp_path / "model.jsonl", UsageTally()
    tally.counting = True
    trials = ["ta__r1", "ta-b__r1"]
    with ModelServer(key=KEY, log_path=log) as server:
        gateways = GatewayRelays(tmp_path, "127.0.0.1", server.port, tls=False, model_path="/v1", api_key=KEY,
                                 usage=tally, owner=(os.getuid(), os.getgid()))
        try:
            box, env, other = (gateways(project) for project in ("ta__r1", "ta__r1__env", "TA-B__r1__env"))
            assert len({box, env, other}) == 3 and all((tmp_path / name).is_socket() for name in (box, env, other))
            for name, times in ((box, 2), (env, 1), (other, 1)):
                for _ in range(times):
                    assert b" 200 " in _call(tmp_path / name, _chat("Write the answer")).split(b"\r\n", 1)[0]
        finally:
            gateways.stop()
    tokens = [r["prompt_tokens"] for r in _logged(log)]
    assert trial_usage(tally, "ta__r1", trials) == CallUsage(3, sum(tokens[:3]),
                                                             sum(r["completion_tokens"] for r in _logged(log)[:3]))
    assert trial_usage(tally, "ta-b__r1", trials) == CallUsage(1, tokens[3], _logged(log)[3]["completion_tokens"])
    # A trial none of whose containers called the model: zero calls, which a model-backed agent's count can be.
    assert trial_usage(tally, "tc__r1", [*trials, "tc__r1"]) == CallUsage()
    # No relay counted (an agent without a model): unknown, not zero.
    assert trial_usage(UsageTally(), "ta__r1", trials) is None
