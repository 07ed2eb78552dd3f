"""A release's own agent is the adopter's code (a Python one runs in the runner process): the worker hands
it no secret at all, and the model key stays with the relay, which adds it upstream."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload
from pipeline.core.project import PLACEHOLDER_KEY
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.sandbox.agents import prepare_runner_agent
from pipeline.local.model_server import ModelServer

KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
CANARY = "bs-canary-" + "7" * 24
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _payload(make_payload: Any) -> DispatchPayload:
    artifact = {"name": "hello-agent", "kind": "python", "package": "hello-agent", "version": "1.2.3",
                "integrity": "sha256-" + "A" * 43 + "=", "source_commit": COMMIT}
    return DispatchPayload.model_validate(make_payload(agent="hello-agent", agent_artifact=artifact))


def test_a_release_agent_gets_no_secret_and_the_relay_holds_the_key(make_payload: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    policy = load_policy()
    monkeypatch.setenv(KEY_ENV, CANARY)
    setup = prepare_runner_agent(policy, _payload(make_payload))
    try:
        assert setup.secrets_dir is None and "--secret-env" not in setup.args and "--secret-dir" not in setup.args
        assert CANARY not in json.dumps(setup.args) and CANARY not in json.dumps(setup.volumes)
        expected = json.loads(setup.args[setup.args.index("--expect-agent") + 1])
        assert expected["name"] == "hello-agent" and expected["source_commit"] == COMMIT
        assert setup.relay is not None and setup.relay.api_key == CANARY
        for directory in setup.dirs:
            for path in directory.rglob("*"):
                assert not path.is_file() or CANARY.encode() not in path.read_bytes()
        # What the sandbox sends (the placeholder) is replaced by the key: the scripted model accepts only that.
        server = ModelServer(key=CANARY, port=int(policy.suites["smoke"].model.host_port[1]))  # type: ignore[union-attr]
        with server:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
            request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {PLACEHOLDER_KEY}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(setup.relay.socket_path))
                client.sendall(request)
                answer = b""
                while chunk := client.recv(65536):
                    answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        setup.close()
