"""Run the agent's code in a process of its own, as an unprivileged user, never in the test process.

A test process that imports the code under test can be made by it to exit 0 or to report a pass;
this one only reads what the child prints. benchseal's grader leaves /tests to root alone (0700), so
the child (uid 65534, no groups, no new privileges, a minimal environment) cannot read the expected
answers, write the verifier's files or trace this process.
"""

import json
import subprocess

CANDIDATE = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"]
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
TIMEOUT_SEC = 20
_CALL = """
import importlib, json, sys
sys.path.insert(0, "/app")
module, function, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    out = {"value": getattr(importlib.import_module(module), function)(*args)}
except Exception as exc:
    out = {"raises": [c.__name__ for c in type(exc).__mro__]}
print()
print(json.dumps(out))
"""


def run(argv, cwd="/tmp"):
    """``argv`` as the candidate user (a CompletedProcess; text output)."""
    return subprocess.run([*CANDIDATE, *argv], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=TIMEOUT_SEC, check=False, stdin=subprocess.DEVNULL)


def call(module, function, *args):
    """``module.function(*args)`` with the agent's /app on the path, in a child: ("value", result),
    ("raises", [exception class names, most derived first]) or ("broken", what the child printed)."""
    done = run(["python3", "-I", "-c", _CALL, module, function, json.dumps(list(args))])
    lines = done.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict) or len(out) != 1:
        return ("broken", (done.stdout + done.stderr)[-2000:])
    (kind, value), = out.items()
    return (kind, value)
