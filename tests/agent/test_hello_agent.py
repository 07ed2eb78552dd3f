"""examples/hello-agent: the example agent runs for real against a local OpenAI-compatible endpoint.

The endpoint is a tiny standard-library HTTP server answering with scripted chat completions; the
agent's own code (HTTP, tool loop, usage accounting) runs unchanged. The ONLY double is Harbor's
environment (``FakeEnvironment``): its ``exec`` runs the command with bash in a temporary directory
instead of a task container.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from harbor.environments.base import ExecResult
from harbor.models.agent.context import AgentContext

from pipeline.agent.wheel import build_wheel
from pipeline.core.project import PLACEHOLDER_KEY, PythonAgent, load_project

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello-agent"
SHELL_COMMAND = "echo hello from the task > greeting.txt && cat greeting.txt && echo to-stderr >&2"


class ScriptedModel:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 answering from a script; records each request."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model.requests.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                       "headers": dict(self.headers), "body": body})
                status, answer = model.answers.pop(0)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def completion(message: dict[str, Any], finish_reason: str, prompt: int, completion_tokens: int,
               cached: int = 0) -> tuple[int, dict[str, Any]]:
    return 200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "benchseal-scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                  "total_tokens": prompt + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}},
    }


class FakeEnvironment:
    """The one double: Harbor's environment, whose exec runs bash in a directory instead of a container."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.calls: list[tuple[str, int | None]] = []

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        self.calls.append((command, timeout_sec))
        proc = await asyncio.create_subprocess_exec("bash", "-c", command, cwd=self.workdir,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_sec)
        return ExecResult(stdout=stdout.decode(), stderr=stderr.decode(), return_code=proc.returncode or 0)


@pytest.fixture(autouse=True)
def _runner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # As in the runner image (images/runner/image.toml): LiteLLM, which Harbor's BaseAgent imports to
    # parse the model name, would otherwise fetch a price list from the internet on import.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _forget_hello_agent() -> None:
    for name in [n for n in sys.modules if n == "hello_agent" or n.startswith("hello_agent.")]:
        del sys.modules[name]


@pytest.fixture
def agent_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """hello_agent.agent imported from the example's source directory."""
    _forget_hello_agent()
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield importlib.import_module("hello_agent.agent")
    _forget_hello_agent()


def test_the_agent_runs_a_tool_call_and_stops_on_a_plain_answer(agent_module: ModuleType, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-real-key-must-not-travel")
    tool_call = {"id": "call_abc123", "type": "function", "function": {
        "name": "run_shell_command",
        "arguments": json.dumps({"command": SHELL_COMMAND, "description": "greet", "is_background": False})}}
    script = [
        completion({"role": "assistant", "content": None, "tool_calls": [tool_call]}, "tool_calls", 100, 20, cached=40),
        completion({"role": "assistant", "content": "Done: greeting.txt written."}, "stop", 150, 10),
    ]
    workdir = tmp_path / "container"
    workdir.mkdir()
    environment = FakeEnvironment(workdir)
    context = AgentContext()
    with ScriptedModel(script) as model:
        agent = agent_module.HelloAgent(logs_dir=tmp_path / "logs", model_name="openai/benchseal-scripted",
                                        api_base=model.api_base)
        asyncio.run(agent.setup(environment))
        asyncio.run(agent.run("Write a greeting to greeting.txt.", environment, context))

    # The command ran (in the "container"), once, with a time limit.
    assert (workdir / "greeting.txt").read_text() == "hello from the task\n"
    assert len(environment.calls) == 1 and SHELL_COMMAND in environment.calls[0][0]
    assert environment.calls[0][1] is not None
    # Two non-streamed completions, each with the placeholder key and the one tool.
    assert len(model.requests) == 2 and model.answers == []
    for request in model.requests:
        assert request["path"] == "/v1/chat/completions"
        assert request["authorization"] == f"Bearer {PLACEHOLDER_KEY}"
        assert "sk-the-real-key" not in json.dumps(request)
        body = request["body"]
        assert body["model"] == "benchseal-scripted" and body["stream"] is False
        (tool,) = body["tools"]
        assert tool["function"]["name"] == "run_shell_command"
        assert set(tool["function"]["parameters"]["properties"]) == {"command", "description", "is_background"}
    first, second = (r["body"]["messages"] for r in model.requests)
    assert first[-1] == {"role": "user", "content": "Write a greeting to greeting.txt."}
    # The tool result went back with the call's id: stdout, stderr and the exit code.
    assert second[-2]["tool_calls"][0]["id"] == "call_abc123"
    result = second[-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_abc123"
    assert "hello from the task" in result["content"] and "to-stderr" in result["content"]
    assert "exit code 0" in result["content"]
    # Token usage of both responses landed in Harbor's context.
    assert (context.n_input_tokens, context.n_output_tokens, context.n_cache_tokens) == (250, 30, 40)


def test_an_endpoint_error_raises(agent_module: ModuleType, tmp_path: Path) -> None:
    environment = FakeEnvironment(tmp_path)
    with ScriptedModel([(503, {"error": {"message": "upstream unavailable"}})]) as model:
        agent = agent_module.HelloAgent(logs_dir=tmp_path, model_name="openai/m", api_base=model.api_base)
        with pytest.raises(RuntimeError, match=r"HTTP 503.*upstream unavailable"):
            asyncio.run(agent.run("anything", environment, AgentContext()))
    assert environment.calls == []


def test_the_agent_needs_its_endpoint(agent_module: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="api_base"):
        agent_module.HelloAgent(logs_dir=tmp_path, model_name="openai/m")


def test_the_project_file_names_the_class(agent_module: ModuleType) -> None:
    spec = load_project(EXAMPLE / "benchseal.toml").agent
    assert isinstance(spec, PythonAgent)
    assert (spec.name, spec.path) == ("hello-agent", ".")
    assert spec.import_path == agent_module.HelloAgent.import_path() == "hello_agent.agent:HelloAgent"
    assert agent_module.HelloAgent.name() == spec.name
    assert agent_module.PLACEHOLDER_KEY == PLACEHOLDER_KEY


def test_version_is_the_installed_distributions(agent_module: ModuleType, tmp_path: Path) -> None:
    """From a source checkout the distribution is not installed: version() is None (Harbor records
    "unknown"); from the release's wheel it is the wheel's METADATA version."""
    agent = agent_module.HelloAgent(logs_dir=tmp_path, model_name="openai/m", api_base="http://127.0.0.1:9/v1")
    try:
        installed: str | None = importlib.metadata.version("hello-agent")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    assert agent.version() == installed


def test_version_from_the_built_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wheel build_wheel makes, imported straight from the .whl (zipimport finds the package and
    # importlib.metadata its dist-info), the way the runner sees it installed.
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "release"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                        "-c", "commit.gpgsign=false", *args], check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                            capture_output=True, text=True).stdout.strip()
    wheel = build_wheel(repo, commit, ".", "0.1.0", tmp_path / "out")
    _forget_hello_agent()
    monkeypatch.syspath_prepend(str(wheel.path))
    try:
        module = importlib.import_module("hello_agent.agent")
        assert module.__file__ is not None and module.__file__.startswith(str(wheel.path))
        agent = module.HelloAgent(logs_dir=tmp_path, model_name="openai/m", api_base="http://127.0.0.1:9/v1")
        assert agent.version() == importlib.metadata.version("hello-agent") == wheel.version == "0.1.0"
    finally:
        _forget_hello_agent()
