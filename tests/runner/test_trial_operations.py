"""What one real trial asks of the sandbox engine (issue 36.6): a HumanEval task (as ``benchseal dataset import``
wrote it into suites/humaneval) run with Harbor's oracle by ``run_suite``, through the engine proxy as the runner
reaches it, its agent and its separate verifier each in a container of their own. The operations each environment
recorded in the trial's ``env-timings.jsonl``, and the requests the proxy forwarded, are pinned: an operation more
per trial is a regression the figures in docs/performance.md would show only later. On this 2-core machine every
exec, archive upload or download costs the engine 50-60 ms (a helper process each); a stat 3 ms."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.infra.sandbox.engine_proxy import EngineProxy
from pipeline.runner import envshared
from pipeline.runner.trial import run_suite
from tests.runner import test_engine_env as engine_env_tests

pytestmark = [pytest.mark.docker]
proxied = engine_env_tests.proxied
base_in_sandbox = engine_env_tests.base_in_sandbox

REPO = Path(__file__).resolve().parents[2]
TASK = "humaneval-0"
# Per environment, by operation (start and stop are the container's create + start and its removal).
AGENT_OPS = {"start": 1, "stop": 1,
             "exec": 2,  # the oracle's chmod and solve.sh
             "upload": 1,  # the oracle's solution, the log dirs riding in its archive (no /logs in the image)
             "download": 2,  # /logs (for the oracle's log), then the artifact /app
             "snapshot": 3,  # /logs/agent, the artifact /logs/artifacts and its is_dir: from that /logs, no request
             "stat": 2}  # /logs missing (setup), so the log dirs ride; is_dir of /app
VERIFIER_OPS = {"start": 1, "stop": 1,
                "exec": 2,  # the log dirs with Harbor's three empty_dirs; the test command
                "upload": 2,  # /app; /tests with the verifier dir (owners and modes in the archive)
                "stat": 1}  # /tests absent, so nothing to remove
# Engine requests through the proxy: an exec is 3 (create, start, inspect), a start 2 (create, start), the oracle's
# /solution upload 2 (into a missing dir: a 404, then its parent), any other operation 1.
ENGINE_REQUESTS = 27


def test_a_humaneval_oracle_trial_makes_the_pinned_engine_operations(tmp_path: Path, proxied: EngineProxy,
                                                                     base_in_sandbox: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(REPO / "suites" / "humaneval" / TASK, suite / TASK)
    toml = suite / TASK / "task.toml"  # the task's image is the base and a WORKDIR: the base itself here
    toml.write_text(toml.read_text().replace("[environment]\n", f'[environment]\ndocker_image = "{base_in_sandbox}"\n'))
    requests: list[str] = []
    forward = proxied._forward

    def counted(peer: Any, request: Any, *args: Any) -> None:
        requests.append(f"{request.method} {request.path}")
        forward(peer, request, *args)

    monkeypatch.setattr(proxied, "_forward", counted)
    out = tmp_path / "out"
    [spec] = run_suite(suite, out, run_id="run-" + os.urandom(10).hex(), agent="oracle", concurrency=1)

    trial = out / "harbor" / spec.trial_name
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"]["reward"] == 1
    lines = [json.loads(line) for line in (trial / envshared.TIMINGS_FILE).read_text().splitlines()]
    sessions = list(dict.fromkeys(line["session"] for line in lines))
    assert len(sessions) == 2 and sessions[1].endswith("verifier__trial"), sessions
    agent, verifier = (Counter(line["op"] for line in lines if line["session"] == s) for s in sessions)
    assert (dict(agent), dict(verifier)) == (AGENT_OPS, VERIFIER_OPS)
    # An exec's inspect is repeated while the engine has not recorded its exit yet (a load-dependent moment): once.
    # The client's version negotiation is once a process, not a trial.
    once = [r for i, r in enumerate(requests) if not (re.fullmatch(r"GET /exec/\w+/json", r) and r in requests[:i])
            and r != "GET /version"]
    assert len(once) == ENGINE_REQUESTS, Counter(re.sub(r"/[0-9a-f]{64}", "/ID", r) for r in once)
    assert proxied.refused == []
