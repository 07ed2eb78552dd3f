"""The scripted model server for agents that call tools (Qwen Code, examples/hello-agent): the smoke
trajectories as OpenAI ``run_shell_command`` calls, streamed (Server-Sent Events) and not.

No Docker: the translated commands run with bash on the host, in a temporary directory that stands
in for the task's ``/app`` (the path is substituted in the commands and in the task's tests).
"""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.infra.sandbox.relay import TcpToUnixRelay, UnixToTcpRelay
from pipeline.local.model_server import SHELL_TOOL, ModelServer, count_tokens, load_script, shell_command
from tests.fixtures.smoke_tasks import SMOKE, is_canary, stage_task, task_resolved

KEY = "sk-test-" + "t" * 24
PLACEHOLDER = "benchseal-placeholder-key"
TASKS = sorted(p.name for p in SMOKE.iterdir() if (p / "task.toml").is_file())
SHELL = {"type": "function", "function": {"name": SHELL_TOOL, "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                                     "is_background": {"type": "boolean"}}, "required": ["command"]}}}
OTHER = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}


def _instruction(task: str) -> str:
    return (SMOKE / task / "instruction.md").read_text()


def _script(task: str, mode: str) -> Any:
    return next(s for s in load_script("smoke", mode) if s.name == task)  # type: ignore[arg-type]


def _post(port: int, body: dict[str, Any], key: str = KEY) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def _events(raw: bytes) -> list[Any]:
    """The SSE body as a list of parsed ``data:`` payloads ("[DONE]" kept as a string); asserts the framing."""
    text = raw.decode()
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(block.startswith("data: ") and "\n" not in block for block in blocks)
    return [block[6:] if block == "data: [DONE]" else json.loads(block[6:]) for block in blocks]


def _conversation(task: str, mode: str, port: int, *, stream: bool) -> list[dict[str, Any]]:
    """Drive a whole trajectory as a tool-calling agent would (without running anything); the answers."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": _instruction(task)}]
    answers = []
    for _ in range(10):
        response, raw = _post(port, {"model": "m", "messages": messages, "tools": [OTHER, SHELL], "stream": stream})
        assert response.status == 200
        if stream:
            events = _events(raw)
            message: dict[str, Any] = {"role": "assistant", "content": "".join(
                e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]) or None}
            calls = [c for e in events[:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])]
            if calls:
                message["tool_calls"] = [{"id": calls[0]["id"], "type": "function", "function": {
                    "name": calls[0]["function"]["name"],
                    "arguments": "".join(c["function"]["arguments"] for c in calls)}}]
            finish = next(e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"])
        else:
            choice = json.loads(raw)["choices"][0]
            message, finish = choice["message"], choice["finish_reason"]
        answers.append({"message": message, "finish_reason": finish})
        messages.append(message)
        if finish == "stop":
            return answers
        messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "[exit code 0]"})
    raise AssertionError("the trajectory did not end")


# --- the translation: one tool call per step, its command the step's keystrokes -------------------


def test_each_step_becomes_one_shell_call_of_its_joined_keystrokes() -> None:
    for mode in ("right", "wrong"):
        for script in load_script("smoke", mode):
            for step in script.steps:
                keystrokes = [c["keystrokes"] for c in step.get("commands", [])]
                # Each keystroke is whole shell lines (a heredoc included): joined, they are one bash script.
                assert all(k.endswith("\n") for k in keystrokes)
                assert shell_command(step) == "".join(keystrokes)
    with ModelServer(key=KEY) as server:
        for task in TASKS:
            expected = [s for s in _script(task, "right").steps if not s.get("task_complete")]
            for stream in (False, True):
                answers = _conversation(task, "right", server.port, stream=stream)
                assert [a["finish_reason"] for a in answers] == ["tool_calls"] * len(expected) + ["stop"]
                for answer, step in zip(answers, expected, strict=False):
                    (call,) = answer["message"]["tool_calls"]
                    assert call["type"] == "function" and call["function"]["name"] == SHELL_TOOL
                    assert json.loads(call["function"]["arguments"]) == {
                        "command": shell_command(step), "description": step["plan"], "is_background": False}
                    assert answer["message"]["content"] is None
                assert answers[-1]["message"] == {"role": "assistant",
                                                  "content": _script(task, "right").steps[-1]["analysis"]}


def _bash_env() -> dict[str, str]:
    # python3 in the commands is this interpreter (a 3.13 like the task images'), wherever pytest runs from.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("mode", ["right", "wrong"])
@pytest.mark.parametrize("task", TASKS)
def test_translated_commands_resolve_right_and_not_wrong(task: str, mode: str, tmp_path: Path) -> None:
    app = stage_task(task, tmp_path)
    assert not task_resolved(task, app)  # the task starts unresolved
    for step in _script(task, mode).steps:
        command = shell_command(step)
        if command:
            run = subprocess.run(["bash", "-c", command.replace("/app", str(app))], cwd=app, env=_bash_env(),
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
    assert task_resolved(task, app) is (mode == "right" and not is_canary(task))  # a canary: never


# --- the example agent (non-streaming) through both relays ------------------------------------------


@dataclass
class _Result:
    stdout: str
    stderr: str
    return_code: int


class _HostEnvironment:
    """Stands in for Harbor's task environment: runs the agent's commands with bash, /app being ``app``."""

    def __init__(self, app: Path) -> None:
        self.app = app
        self.commands: list[str] = []

    async def exec(self, command: str, timeout_sec: int | None = None, **_: Any) -> _Result:
        self.commands.append(command)
        run = subprocess.run(["bash", "-c", command.replace("/app", str(self.app))], cwd=self.app, env=_bash_env(),
                             capture_output=True, text=True, timeout=timeout_sec)
        return _Result(run.stdout, run.stderr, run.returncode)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for the relay socket (a Unix socket path is at most 107 bytes; tmp_path can be longer)."""
    with tempfile.TemporaryDirectory(prefix="bs-tools-") as short:
        yield Path(short)


def _with_relays(server: ModelServer, sock_dir: Path) -> tuple[UnixToTcpRelay, TcpToUnixRelay]:
    """The worker's two relays in front of ``server``: the agent holds the placeholder, the host side adds KEY."""
    host_side = UnixToTcpRelay(sock_dir / "model.sock", "127.0.0.1", server.port, model_path="/v1", api_key=KEY)
    host_side.start()
    runner_side = TcpToUnixRelay(sock_dir / "model.sock")
    runner_side.start()
    return host_side, runner_side


@pytest.mark.parametrize("mode", ["right", "wrong"])
def test_hello_agent_solves_with_right_and_fails_with_wrong(mode: str, tmp_path: Path, short_dir: Path) -> None:
    from harbor.models.agent.context import AgentContext

    sys.path.insert(0, str(REPO_ROOT / "examples" / "hello-agent"))
    try:
        hello = importlib.import_module("hello_agent.agent")
    finally:
        sys.path.remove(str(REPO_ROOT / "examples" / "hello-agent"))
    assert hello.PLACEHOLDER_KEY == PLACEHOLDER
    log = tmp_path / "log.jsonl"
    with ModelServer(key=KEY, mode=mode, log_path=log) as server:  # type: ignore[arg-type]
        host_side, runner_side = _with_relays(server, short_dir)
        try:
            for task in TASKS:
                (tmp_path / task).mkdir()
                app = stage_task(task, tmp_path / task)
                agent = hello.HelloAgent(logs_dir=tmp_path / task, model_name="openai/benchseal-scripted",
                                   api_base=f"http://127.0.0.1:{runner_side.port}/v1")
                context = AgentContext()
                environment = _HostEnvironment(app)
                asyncio.run(agent.run(_instruction(task), environment, context))
                assert task_resolved(task, app) is (mode == "right" and not is_canary(task)), task
                steps = [s for s in _script(task, mode).steps if shell_command(s)]
                assert len(environment.commands) == len(steps)
                entries = [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["task"] == task]
                assert [e["finish_reason"] for e in entries] == ["tool_calls"] * len(steps) + ["stop"]
                assert all(e["stream"] is False and e["tools"] == 1 and e["status"] == 200 for e in entries)
                assert context.n_input_tokens == sum(e["prompt_tokens"] for e in entries)
                assert context.n_output_tokens == sum(e["completion_tokens"] for e in entries)
        finally:
            runner_side.stop()
            host_side.stop()
    assert host_side.refused == []
    text = log.read_text()
    assert KEY not in text and "numbers.txt" not in text and "EOF" not in text  # no key, no bodies


# --- the streamed form --------------------------------------------------------------------------


def test_streamed_tool_call_chunks_usage_and_done() -> None:
    task = "fix-mean"
    step = _script(task, "right").steps[1]  # a heredoc: its arguments come in several pieces
    messages: list[dict[str, Any]] = [{"role": "user", "content": _instruction(task)},
                                      {"role": "assistant", "content": None, "tool_calls": [
                                          {"id": "call_benchseal_0", "type": "function",
                                           "function": {"name": SHELL_TOOL, "arguments": "{}"}}]},
                                      {"role": "tool", "tool_call_id": "call_benchseal_0", "content": "..."}]
    body = {"model": "m", "messages": messages, "tools": [SHELL], "stream": True,
            "stream_options": {"include_usage": True}}
    with ModelServer(key=KEY) as server:
        response, raw = _post(server.port, body)
        plain_response, plain_raw = _post(server.port, {**body, "stream": False})
        _, no_usage = _post(server.port, {**body, "stream_options": {"include_usage": False}})
    assert response.status == 200 and response.version == 10  # HTTP/1.0: the body ends when the connection closes
    assert response.getheader("Content-Type") == "text/event-stream"
    assert response.getheader("Connection") == "close" and response.getheader("Content-Length") is None
    assert response.getheader("Transfer-Encoding") is None
    events = _events(raw)
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    assert {e["object"] for e in [*chunks, usage_chunk]} == {"chat.completion.chunk"}
    assert len({e["id"] for e in [*chunks, usage_chunk]}) == 1
    first, *pieces, last = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_benchseal_1", "type": "function", "function": {"name": SHELL_TOOL, "arguments": ""}}]}
    assert len(pieces) > 1 and all(p["choices"][0]["finish_reason"] is None for p in [first, *pieces])
    arguments = "".join(p["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for p in pieces)
    assert all(set(p["choices"][0]["delta"]["tool_calls"][0]) == {"index", "function"} for p in pieces)
    assert json.loads(arguments)["command"] == shell_command(step)
    assert last["choices"] == [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]
    assert all(e["usage"] is None for e in chunks)
    assert usage_chunk["choices"] == []
    plain = json.loads(plain_raw)
    assert plain_response.getheader("Content-Type") == "application/json"
    assert plain["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments
    assert usage_chunk["usage"] == plain["usage"]
    assert plain["usage"]["completion_tokens"] == count_tokens(SHELL_TOOL + " " + arguments)
    assert plain["usage"]["prompt_tokens"] == count_tokens(_instruction(task)) + 4 + 0 + 4 + count_tokens("...") + 4
    # Without include_usage: no usage chunk, no usage key.
    plain_events = _events(no_usage)
    assert plain_events[-1] == "[DONE]" and all("usage" not in e and e["choices"] for e in plain_events[:-1])


def test_a_stream_passes_the_relays_unchanged(short_dir: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": _instruction("cli-flag")}], "tools": [SHELL],
            "stream": True, "stream_options": {"include_usage": True}}
    with ModelServer(key=KEY) as server:
        _, direct = _post(server.port, body)
        host_side, runner_side = _with_relays(server, short_dir)
        try:
            response, relayed_raw = _post(runner_side.port, body, key=PLACEHOLDER)
        finally:
            runner_side.stop()
            host_side.stop()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"

    def normal(raw: bytes) -> bytes:  # the request number and the second differ between the two answers
        return re.sub(rb'"created": [0-9]+', b"", re.sub(rb"chatcmpl-benchseal-[0-9]+", b"", raw))

    assert normal(relayed_raw) == normal(direct) and _events(relayed_raw)[-1] == "[DONE]"


# --- plain messages, unknown tasks, side queries ------------------------------------------------


def test_complete_step_unknown_task_and_no_shell_tool() -> None:
    with ModelServer(key=KEY, mode="wrong") as server:
        # Past the end the task_complete step repeats as a plain message.
        messages = [{"role": "user", "content": _instruction("write-answer")}] + [
            {"role": "assistant", "content": None}] * 5
        _, raw = _post(server.port, {"messages": messages, "tools": [SHELL]})
        assert json.loads(raw)["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "Written."},
                                                 "finish_reason": "stop"}
        # An unscripted task: refused (HTTP 400 the agent's log shows), never a silent plain answer.
        response, raw = _post(server.port, {"messages": [{"role": "user", "content": "an unscripted task"}],
                                            "tools": [SHELL], "stream": True})
        assert response.status == 400 and json.loads(raw)["error"]["code"] == "no_script"
        # Tools without a shell tool and no required call: refused, naming the tools (issue 38.5; terminus-2
        # offers no tools and still gets its JSON step).
        response, raw = _post(server.port, {"messages": [{"role": "user", "content": _instruction("write-answer")}],
                                            "tools": [OTHER]})
        assert response.status == 400 and json.loads(raw)["error"]["code"] == "no_shell_tool"
        _, raw = _post(server.port, {"messages": [{"role": "user", "content": _instruction("write-answer")}]})
        assert "wc -l" in json.loads(json.loads(raw)["choices"][0]["message"]["content"])["commands"][0]["keystrokes"]


def test_a_required_call_of_another_tool_is_answered_from_its_schema(tmp_path: Path) -> None:
    """Qwen Code's JSON side queries (e.g. its next-speaker check) force a call of ``respond_in_schema``."""
    schema = {"type": "object", "properties": {
        "reasoning": {"type": "string"}, "next_speaker": {"type": "string", "enum": ["model", "user"]},
        "extra": {"type": "integer"}}, "required": ["reasoning", "next_speaker"]}
    side = {"type": "function", "function": {"name": "respond_in_schema", "parameters": schema}}
    messages = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Who speaks next?"}]
    log = tmp_path / "log.jsonl"
    with ModelServer(key=KEY, log_path=log) as server:
        _, raw = _post(server.port, {"messages": messages, "tools": [side], "tool_choice": "required", "stream": False})
        choice = json.loads(raw)["choices"][0]
        named = {"type": "function", "function": {"name": "respond_in_schema"}}
        _, streamed = _post(server.port, {"messages": messages, "tools": [OTHER, side], "tool_choice": named,
                                          "stream": True})
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "respond_in_schema"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments["next_speaker"] == "user" and isinstance(arguments["reasoning"], str) and "extra" not in arguments
    events = _events(streamed)
    assert events[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "respond_in_schema"
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["task"], e["tools"], e["stream"], e["finish_reason"]) for e in entries] == [
        (None, 1, False, "tool_calls"), (None, 2, True, "tool_calls")]
