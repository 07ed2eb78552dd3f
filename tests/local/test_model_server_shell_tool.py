"""The scripted model finds the agent's shell tool by its schema (issue 38.5): the real server over
HTTP on 127.0.0.1, tool schemas under other names (``bash``, ``shell``, ``execute`` with ``cmd``), Qwen
Code 0.24.4's own 14 tools, and the refusals (several shell tools, none, a forced call of a missing
tool): HTTP 400 with an OpenAI error object the agent's client raises, one line on the server's error
stream, the request's log line with the code. No Docker, well under a second.
"""

from __future__ import annotations

import http.client
import io
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from pipeline.local.model_server import COMMAND_PROPERTIES, ModelServer, find_shell_tools, load_script, shell_command
from tests.fixtures.smoke_tasks import SMOKE

KEY = "sk-test-" + "s" * 24
TASK = "fix-mean"  # three steps: two with commands (one a heredoc), then task_complete


def _tool(name: str, properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": parameters}}


S = {"type": "string"}
BASH = _tool("bash", {"command": S}, ["command"])
SHELL = _tool("shell", {"cmd": S, "timeout": {"type": "integer", "default": 120}, "login": {"type": "boolean"}},
              ["cmd", "timeout", "login"])
EXECUTE = _tool("execute", {"cmd": {"type": ["string", "null"]}, "cwd": S}, ["cmd"])
TERMINAL = _tool("send_keys", {"keystrokes": S, "wait": {"type": "number"}}, ["keystrokes"])
READ = _tool("read_file", {"path": S}, ["path"])
WRITE = _tool("write_file", {"path": S, "content": S}, ["path", "content"])
TWO_STRINGS = _tool("run", {"command": S, "cwd": S}, ["command", "cwd"])  # which directory? not guessed
PYTHON = _tool("python", {"code": S}, ["code"])
OPTIONAL = _tool("maybe_shell", {"command": S})  # nothing required

# Qwen Code 0.24.4's tools as it sends them with --yolo (captured from a real run: names, property
# types, required lists; descriptions left out). Only run_shell_command qualifies.
QWEN_SPECS: list[tuple[str, dict[str, Any], list[str] | None]] = [
    ("agent", {"description": S, "prompt": S, "subagent_type": S, "fork_turns": {}, "fork_tools": {"type": "array"},
               "fork_profile": S, "run_in_background": {"type": "boolean"}, "isolation": S, "working_dir": S},
     ["description", "prompt"]),
    ("edit", {"file_path": S, "old_string": S, "new_string": S, "replace_all": {"type": "boolean"}},
     ["file_path", "old_string", "new_string"]),
    ("get_goal", {}, None),
    ("glob", {"pattern": S, "path": S}, ["pattern"]),
    ("grep_search", {"pattern": S, "glob": S, "path": S, "limit": {"type": "integer"}}, ["pattern"]),
    ("list_agents", {}, None),
    ("notebook_edit", {"notebook_path": S, "cell_id": S, "new_source": S, "cell_type": S, "edit_mode": S},
     ["notebook_path"]),
    ("read_file", {"file_path": S, "offset": {"type": ["integer", "null"]}, "limit": {"type": ["integer", "null"]},
                   "pages": {"type": ["string", "null"]}}, ["file_path"]),
    ("run_shell_command", {"command": S, "is_background": {"type": "boolean"}, "timeout": {"type": "integer"},
                           "description": S, "directory": S}, ["command"]),
    ("skill", {"skill": S, "args": S}, ["skill"]),
    ("tool_call", {"name": S, "arguments": {"type": "object"}}, ["name", "arguments"]),
    ("tool_search", {"query": S, "max_results": {"type": "integer"}}, ["query"]),
    ("update_goal", {"status": S, "reason": S, "blockerKind": S}, ["status", "reason"]),
    ("write_file", {"file_path": S, "content": S, "record_as_artifact": {"type": "boolean"}}, ["file_path", "content"]),
]
QWEN = [_tool(name, props, req) for name, props, req in QWEN_SPECS]


def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    if response.getheader("Content-Type") == "text/event-stream":  # the streamed call, put together
        events = [json.loads(b[6:]) for b in raw.decode().split("\n\n") if b.startswith("data: {")]
        calls = [c for e in events if e["choices"] for c in e["choices"][0]["delta"].get("tool_calls", [])]
        call = {"id": calls[0]["id"], "type": "function", "function": {
            "name": calls[0]["function"]["name"], "arguments": "".join(c["function"]["arguments"] for c in calls)}}
        return response.status, {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]},
                                              "finish_reason": events[-1]["choices"][0]["finish_reason"]}]}
    return response.status, json.loads(raw)


def _messages(step: int) -> list[dict[str, Any]]:
    """The conversation of a tool-calling agent at ``step`` (earlier calls answered)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": (SMOKE / TASK / "instruction.md").read_text()}]
    for i in range(step):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "x", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"}]
    return messages


@pytest.fixture
def served(tmp_path: Path) -> Any:
    errors = io.StringIO()
    with ModelServer(key=KEY, log_path=tmp_path / "log.jsonl", errors=errors) as server:
        yield server, errors, tmp_path / "log.jsonl"


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- found by schema ---------------------------------------------------------------------------


@pytest.mark.parametrize(("tools", "name", "extra"), [
    ([READ, BASH, WRITE], "bash", {}),
    ([SHELL, READ], "shell", {"timeout": 120, "login": False}),  # required non-strings: default, else false/0
    ([EXECUTE, PYTHON, TWO_STRINGS, OPTIONAL], "execute", {}),  # "string or null" is a string; cwd not required
    ([TERMINAL], "send_keys", {}),
], ids=["bash", "shell-cmd", "execute-cmd", "keystrokes"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_shell_tool_is_found_by_its_schema_under_any_name(served: Any, tools: list[dict[str, Any]], name: str,
                                                              extra: dict[str, Any], stream: bool) -> None:
    server, errors, log = served
    steps = next(s for s in load_script("smoke", "right") if s.name == TASK).steps
    command_property = next(s.command for s in find_shell_tools(tools))
    for step, expected in enumerate(steps[:2]):
        status, body = _post(server.port, {"model": "m", "messages": _messages(step), "tools": tools, "stream": stream})
        assert status == 200
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == name
        # Only what the schema declares: no description, no is_background for these tools.
        assert json.loads(call["function"]["arguments"]) == {command_property: shell_command(expected), **extra}
    status, body = _post(server.port, {"model": "m", "messages": _messages(2), "tools": tools})
    assert status == 200 and body["choices"][0]["message"] == {"role": "assistant", "content": steps[2]["analysis"]}
    assert errors.getvalue() == ""
    assert [e["status"] for e in _log(log)] == [200, 200, 200]


def test_qwen_codes_tools_pick_run_shell_command_with_its_arguments_unchanged(served: Any) -> None:
    server, errors, _ = served
    assert [s.name for s in find_shell_tools(QWEN)] == ["run_shell_command"]
    step = next(s for s in load_script("smoke", "right") if s.name == TASK).steps[0]
    status, body = _post(server.port, {"model": "m", "messages": _messages(0), "tools": QWEN, "stream": True})
    assert status == 200
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "run_shell_command"
    assert json.loads(call["function"]["arguments"]) == {"command": shell_command(step), "description": step["plan"],
                                                         "is_background": False}
    assert errors.getvalue() == ""


def test_the_rule_in_isolation() -> None:
    assert COMMAND_PROPERTIES == ("command", "cmd", "script", "keystrokes", "shell_command", "bash_command")
    for prop in COMMAND_PROPERTIES:
        assert [s.command for s in find_shell_tools([_tool("t", {prop.upper(): S}, [prop.upper()])])] == [prop.upper()]
    not_shells = [READ, WRITE, TWO_STRINGS, PYTHON, OPTIONAL, _tool("n", {"command": {"type": "array"}}, ["command"]),
                  _tool("m", {}, ["command"]), {"type": "function", "function": {"name": "p"}},
                  {"type": "web_search"}, "bash", {"type": "function", "function": {"name": 7, "parameters": {}}}]
    assert find_shell_tools(not_shells) == []


# --- refused: several, none, a forced call of a missing tool ----------------------------------


def _refused(served: Any, tools: list[dict[str, Any]], code: str, *,
             tool_choice: Any = None, stream: bool = False) -> str:
    server, errors, log = served
    body: dict[str, Any] = {"model": "m", "messages": _messages(0), "tools": tools, "stream": stream}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    status, answer = _post(server.port, body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["code"] == code
    message = str(answer["error"]["message"])
    assert errors.getvalue() == " ".join(message.split()) + "\n"  # exactly one line
    (entry,) = _log(log)
    assert entry["status"] == 400 and entry["error"] == code and entry["task"] == TASK
    assert "EOF" not in log.read_text()  # no bodies in the log
    return message


@pytest.mark.parametrize("stream", [False, True])
def test_several_shell_tools_are_refused_naming_them(served: Any, stream: bool) -> None:
    message = _refused(served, [BASH, READ, SHELL], "ambiguous_shell_tool", stream=stream)
    assert "several" in message and "(bash, shell)" in message and "read_file" not in message
    assert "command, cmd, script, keystrokes, shell_command, bash_command" in message
    assert _log(served[2])[0]["shell_tools"] == ["bash", "shell"]


def test_a_forced_call_picks_one_of_several(served: Any) -> None:
    server, errors, _ = served
    status, body = _post(server.port, {"model": "m", "messages": _messages(0), "tools": [BASH, SHELL],
                                       "tool_choice": {"type": "function", "function": {"name": "shell"}}})
    assert status == 200 and body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "shell"
    assert errors.getvalue() == ""


def test_no_shell_tool_is_refused_naming_the_offered_tools(served: Any) -> None:
    message = _refused(served, [READ, WRITE, TWO_STRINGS, PYTHON], "no_shell_tool")
    assert "no offered tool qualifies" in message and "(offered: read_file, write_file, run, python)" in message
    assert "exactly one string property" in message


def test_a_forced_call_of_a_tool_not_offered_is_refused(served: Any) -> None:
    message = _refused(served, [READ], "unknown_tool_choice",
                       tool_choice={"type": "function", "function": {"name": "bash"}})
    assert "'bash'" in message and "offered: read_file" in message


def test_the_agents_openai_client_raises_the_message(served: Any) -> None:
    """What an agent built on the OpenAI SDK logs: a BadRequestError carrying the rule (400: not retried)."""
    server, errors, log = served
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=2)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=_messages(0),  # type: ignore[arg-type]
                                       tools=[READ, WRITE])  # type: ignore[list-item]
    assert "no offered tool qualifies as the shell tool" in str(caught.value)
    assert caught.value.code == "no_shell_tool"
    assert len(_log(log)) == 1 and errors.getvalue().count("\n") == 1  # no retry


def test_names_in_the_refusal_are_cut(served: Any) -> None:
    tools = [_tool("x" * 500 + str(i), {"path": S}, ["path"]) for i in range(25)]
    message = _refused(served, tools, "no_shell_tool")
    assert "x" * 65 not in message and "and 5 more" in message
