"""A scripted OpenAI-compatible model server for tests and the demo (127.0.0.1 only).

It answers ``POST /v1/chat/completions`` and ``GET /v1/models`` the way a real
provider does, so Harbor's ``terminus-2`` agent runs its real loop against it:
each answer is the next step of a deterministic trajectory (JSON with
``commands`` and ``task_complete``) for the task recognised in the first user
message (``pipeline/infra/scripts/<suite>.json``). The commands really run in
the task container through the agent's tmux session and the verifier grades
the result; the ``wrong`` script makes a plausible but incorrect change.

Every request must carry ``Authorization: Bearer <key>``; the key is read from a
file (never argv). Each request is logged as one JSON line (task, step, token
counts, status) without the key or message bodies. Token counts are a
deterministic word/punctuation count per message, reported in ``usage``.
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import CheckFailed, UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_json

SCRIPTS_DIR = Path(__file__).with_name("scripts")
DEFAULT_MODEL = "benchseal-scripted"
Mode = Literal["right", "wrong"]
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_MAX_BODY = 4 * 1024 * 1024


def count_tokens(text: str) -> int:
    """Deterministic token count: words and punctuation marks."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class TaskScript:
    name: str
    match: str
    steps: tuple[dict[str, Any], ...]


def load_script(suite: str, mode: Mode) -> tuple[TaskScript, ...]:
    path = SCRIPTS_DIR / f"{suite}.json"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", suite) or not path.is_file():
        raise ValidationError("suite", "has no model script (pipeline/infra/scripts/<suite>.json)", suite)
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
    model: str
    log_path: Path | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0


def _message_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


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
            messages = list(body["messages"])
        except (ValueError, KeyError, TypeError):
            self._log({"status": 400})
            self._send(400, {"error": {"message": "messages: a JSON list is required", "type": "invalid_request_error"}})
            return
        first_user = next((_message_text(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"), "")
        step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        script = next((s for s in self.state.scripts if s.match in first_user), None)
        if script is None:
            answer: dict[str, Any] = {"analysis": "No script covers this task.", "plan": "Stop.", "commands": [],
                                      "task_complete": True}
        else:
            # Past the end the last (task_complete) step repeats: terminus-2 asks to confirm completion.
            answer = script.steps[min(step, len(script.steps) - 1)]
        content = json.dumps(answer, indent=2)
        prompt_tokens = sum(count_tokens(_message_text(m)) + 4 for m in messages if isinstance(m, dict))
        completion_tokens = count_tokens(content)
        self._log({"status": 200, "task": script.name if script else None, "step": step,
                   "model": str(body.get("model", "")), "prompt_tokens": prompt_tokens,
                   "completion_tokens": completion_tokens})
        self._send(200, {
            "id": f"chatcmpl-benchseal-{self.state.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.state.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })


class ModelServer:
    """The scripted server in a background thread (tests), or in the foreground (``serve``)."""

    def __init__(self, *, key: str, suite: str = "smoke", mode: Mode = "right", model: str = DEFAULT_MODEL,
                 host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None) -> None:
        if host != "127.0.0.1":
            raise ValidationError("host", "the scripted model server binds 127.0.0.1 only", host)
        state = _State(key=key, scripts=load_script(suite, mode), model=model, log_path=log_path)
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
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="model-server", daemon=True)
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
