"""The scripted OpenAI-compatible model server and the relays (no Docker: real sockets, real HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.sandbox.relay import TcpToUnixRelay, UnixToTcpRelay
from pipeline.local.model_server import ModelServer, count_tokens, load_script, read_state
from tests.registry.helpers import free_port, wait_listening

KEY = "sk-test-" + "k" * 24
PLACEHOLDER = "benchseal-placeholder-key"  # what the agent holds; the host-side relay adds KEY


def _chat(base: str, messages: list[dict[str, Any]], key: str | None = KEY,
          **extra: Any) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{base}/chat/completions", data=json.dumps(
        {"model": "openai/benchseal-scripted", "messages": messages, **extra}).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _instruction(task: str) -> str:
    return (REPO_ROOT / "suites" / "smoke" / task / "instruction.md").read_text()


def test_every_smoke_task_has_a_right_and_a_wrong_script() -> None:
    tasks = sorted(p.name for p in (REPO_ROOT / "suites" / "smoke").iterdir() if (p / "task.toml").is_file())
    for mode in ("right", "wrong"):
        scripts = load_script("smoke", mode)
        assert sorted(s.name for s in scripts) == tasks
        for script in scripts:
            # Recognised from its own instruction, and by no other task's.
            assert [s.name for s in scripts if s.match in _instruction(script.name)] == [script.name]
            assert script.steps[-1]["task_complete"] is True
            assert any(c["keystrokes"] for step in script.steps for c in step.get("commands", []))
    with pytest.raises(ValidationError, match="suite"):
        load_script("../smoke", "right")


def test_key_required_and_never_logged(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with ModelServer(key=KEY, log_path=log) as server:
        status, body = _chat(server.base_url, [{"role": "user", "content": "x"}], key=None)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _ = _chat(server.base_url, [{"role": "user", "content": "x"}], key=KEY[:-1] + "X")
        assert status == 401
        status, _ = _chat(server.base_url, [{"role": "user", "content": "x"}], key=KEY + "extra")
        assert status == 401
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.base_url}/models", timeout=5)
        assert err.value.code == 401
        models = urllib.request.urlopen(urllib.request.Request(
            f"{server.base_url}/models", headers={"Authorization": f"Bearer {KEY}"}), timeout=5)
        assert json.loads(models.read())["data"][0]["id"] == "benchseal-scripted"
        status, _ = _chat(server.base_url, [{"role": "user", "content": _instruction("fix-mean")}])
        assert status == 200
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["status"] for e in entries] == [401, 401, 401, 401, 200, 200]
    assert [e.get("auth") for e in entries[:3]] == ["missing", "wrong", "wrong"]
    assert KEY not in log.read_text() and KEY[:12] not in log.read_text()


def test_trajectory_steps_follow_the_conversation_and_usage_is_counted(tmp_path: Path) -> None:
    with ModelServer(key=KEY, log_path=tmp_path / "log.jsonl") as server:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Task: " + _instruction("write-answer")}]
        answers = []
        for _ in range(4):
            status, body = _chat(server.base_url, messages)
            assert status == 200
            content = body["choices"][0]["message"]["content"]
            answers.append(json.loads(content))
            usage = body["usage"]
            assert usage["completion_tokens"] == count_tokens(content) > 0
            assert usage["prompt_tokens"] == sum(count_tokens(m["content"]) + 4 for m in messages)
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "output"}]
    assert "answer.txt" in answers[0]["commands"][0]["keystrokes"]
    assert not answers[0].get("task_complete")
    # Completion is then repeated (terminus-2 asks for a confirmation).
    assert answers[1]["task_complete"] and answers[2] == answers[1] == answers[3]


def test_wrong_mode_and_unknown_task(tmp_path: Path) -> None:
    with ModelServer(key=KEY, mode="wrong") as server:
        _, body = _chat(server.base_url, [{"role": "user", "content": _instruction("write-answer")}])
        assert "wc -l" in body["choices"][0]["message"]["content"]
        # An unscripted task: a stop whose analysis terminus-2's log shows, never a step that would read as the agent's.
        status, body = _chat(server.base_url, [{"role": "user", "content": "an unscripted task"}])
        reply = json.loads(body["choices"][0]["message"]["content"])
        assert status == 200 and reply["commands"] == [] and reply["task_complete"], body
        assert "no script of suite 'smoke' matches this task" in reply["analysis"]
    with pytest.raises(ValidationError, match=r"127\.0\.0\.1"):
        ModelServer(key=KEY, host="0.0.0.0")


def test_relays_give_one_way_to_the_endpoint(tmp_path: Path) -> None:
    with ModelServer(key=KEY) as server:
        host_side = UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", server.port, model_path="/v1", api_key=KEY)
        host_side.start()
        runner_side = TcpToUnixRelay(tmp_path / "model.sock")
        runner_side.start()
        try:
            assert oct((tmp_path / "model.sock").stat().st_mode & 0o777) == "0o600"
            status, body = _chat(f"http://127.0.0.1:{runner_side.port}/v1",
                                 [{"role": "user", "content": _instruction("cli-flag")}], key=PLACEHOLDER)
            assert status == 200 and "wc.py" in body["choices"][0]["message"]["content"]
            assert host_side.connections >= 1
        finally:
            runner_side.stop()
            host_side.stop()


def test_cli_start_stop_records_pid_and_keeps_key_out_of_argv(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    key_file.chmod(0o400)
    state = tmp_path / "state"
    cli = [sys.executable, "-m", "pipeline", "model-server"]
    started = subprocess.run([*cli, "start", "--key-file", str(key_file), "--state-dir", str(state)],
                             capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert started.returncode == 0, started.stderr
    recorded = read_state(state)
    assert recorded is not None
    try:
        cmdline = Path(f"/proc/{recorded['pid']}/cmdline").read_bytes()
        assert KEY.encode() not in cmdline and b"model-server" in cmdline
        status, _ = _chat(recorded["base_url"], [{"role": "user", "content": _instruction("fix-mean")}])
        assert status == 200
        again = subprocess.run([*cli, "start", "--key-file", str(key_file), "--state-dir", str(state)],
                               capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert again.returncode == 2 and "already running" in again.stderr
    finally:
        stopped = subprocess.run([*cli, "stop", "--state-dir", str(state)], capture_output=True, text=True, timeout=60,
                                 cwd=REPO_ROOT)
    assert stopped.returncode == 0 and str(recorded["pid"]) in stopped.stdout
    assert not Path(f"/proc/{recorded['pid']}").exists() or b"model-server" not in Path(
        f"/proc/{recorded['pid']}/cmdline").read_bytes()
    short = tmp_path / "short"
    short.write_text("too-short")
    bad = subprocess.run([*cli, "start", "--key-file", str(short), "--state-dir", str(tmp_path / "s2")],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "key_file" in bad.stderr


@pytest.mark.parametrize("length", ["abc", "-5", "0", str(5 * 1024 * 1024)])
def test_bad_content_length_is_a_400(length: str) -> None:
    import http.client

    with ModelServer(key=KEY) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Authorization", f"Bearer {KEY}")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 400 and b"body required" in response.read()
        conn.close()


def test_gateway_entry_point_serves_a_fixed_port_and_checks_its_arguments(tmp_path: Path) -> None:

    from pipeline.infra.sandbox.relay import gateway_main

    assert gateway_main([]) == 2 and gateway_main(["a", "port"]) == 2 and gateway_main(["a", "1", "2"]) == 2
    port = free_port()
    with ModelServer(key=KEY) as server:
        host_side = UnixToTcpRelay(tmp_path / "model.sock", "127.0.0.1", server.port, model_path="/v1",
                                   api_key=KEY).start()
        gateway = subprocess.Popen([sys.executable, "-m", "pipeline.infra.sandbox.relay", str(tmp_path / "model.sock"), str(port)])
        try:
            wait_listening(port, "the model gateway", alive=lambda: gateway.poll() is None)
            status, body = _chat(f"http://127.0.0.1:{port}/v1", [{"role": "user", "content": _instruction("cli-flag")}],
                                 key=PLACEHOLDER)
            assert status == 200 and "wc.py" in body["choices"][0]["message"]["content"]
        finally:
            gateway.kill()
            gateway.wait()
            host_side.stop()


def test_terminus_answers_keep_their_form_and_the_log_says_stream_and_tools(tmp_path: Path) -> None:
    """A request without tools (terminus-2) still gets the step's JSON as content, in the same envelope;
    ``stream: true`` streams that same content."""
    import http.client

    log = tmp_path / "log.jsonl"
    step = next(s for s in load_script("smoke", "right") if s.name == "fix-mean").steps[0]
    with ModelServer(key=KEY, log_path=log) as server:
        status, body = _chat(server.base_url, [{"role": "user", "content": _instruction("fix-mean")}])
        assert status == 200 and list(body) == ["id", "object", "created", "model", "choices", "usage"]
        assert body["object"] == "chat.completion"
        assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": json.dumps(step, indent=2)},
                                    "finish_reason": "stop"}]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": _instruction("fix-mean")}]}),
            {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "text/event-stream"
        events = [json.loads(line[6:]) for line in response.read().decode().split("\n\n")
                  if line.startswith("data: {")]
        conn.close()
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == json.dumps(step, indent=2)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["stream"], e["tools"], e["finish_reason"], e["task"]) for e in entries] == [
        (False, 0, "stop", "fix-mean"), (True, 0, "stop", "fix-mean")]
    assert "stats.py" not in log.read_text()  # neither the instruction nor the answer


def test_task_is_found_behind_context_and_in_later_user_messages() -> None:
    """Agents put context before the instruction (content parts) or send it in a later user message."""
    parts = [{"type": "text", "text": "<system-reminder>context</system-reminder>"},
             {"type": "text", "text": _instruction("cli-flag")}]
    with ModelServer(key=KEY) as server:
        _, body = _chat(server.base_url, [{"role": "system", "content": "sys"}, {"role": "user", "content": parts}])
        assert "wc.py" in json.loads(body["choices"][0]["message"]["content"])["commands"][0]["keystrokes"]
        _, body = _chat(server.base_url, [{"role": "user", "content": "hello"},
                                          {"role": "user", "content": _instruction("write-answer")}])
        assert "answer.txt" in body["choices"][0]["message"]["content"]
        # The first user message wins (terminus-2 sends terminal output in later ones).
        _, body = _chat(server.base_url, [{"role": "user", "content": _instruction("fix-mean")},
                                          {"role": "user", "content": "cat /app/wc.py"}])
        assert "stats.py" in body["choices"][0]["message"]["content"]
        status, body = _chat(server.base_url, [{"role": "user", "content": "x"}], tools={"not": "a list"})
        assert status == 400
