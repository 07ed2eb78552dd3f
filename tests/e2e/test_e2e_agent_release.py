"""``benchseal release vX --local --agent terminus-2 --scripted-model right`` (``make demo AGENT=terminus-2``).

The real agent loop end to end: the scripted model on the policy's 127.0.0.1
endpoint, terminus-2 in the runner, commands in the task containers, the
verifier, evidence, signing, publication and verification; model calls and
tokens in summary.json and the body. State: a fresh BENCHSEAL_HOME sharing only
the build caches and tools (as tests/e2e/test_e2e_local_release.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.publish.body import markdown_cell
from tests.fixtures.homes import fresh_home
from tests.fixtures.parallel import POLICY_MODEL_PORT

# Its release serves the scripted model on the shipped policy's fixed port: one such module at a time.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group(POLICY_MODEL_PORT)]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
TAG = "v0.0.2-agent"
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"


@pytest.fixture(scope="module")
def agent_home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    with fresh_home(tmp_path_factory, "agent-release-home") as home:
        yield home


def _release(home: Path, dist: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    return subprocess.run([BENCHSEAL, "release", TAG, "--local", "--dist", str(dist), "--agent", "terminus-2", *extra],
                          capture_output=True, text=True, env=env, check=False, timeout=900)


def test_model_agent_without_key_or_script_is_refused_before_building(agent_home: Path, tmp_path: Path) -> None:
    done = _release(agent_home, tmp_path / "dist")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"set {KEY_ENV}, or pass --scripted-model" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "dist").exists()


def test_release_with_terminus2_and_the_scripted_model(agent_home: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    done = _release(agent_home, dist, "--scripted-model", "right", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    assert report["counts"]["resolved"] == 3 == report["counts"]["total"]
    release = dist / TAG
    summary = json.loads((release / "summary.json").read_text())
    assert summary["agent"] == {"name": "terminus-2", "version": "2.0.0", "version_pin": "0.26.0",
                                "model": "openai/benchseal-scripted", "release": None}
    usage = summary["model_usage"]
    assert usage["trials"] == 4 and usage["model_calls"] >= 9  # the canary's trial called the model too and usage["input_tokens"] > usage["output_tokens"] > 0
    per_trial = summary["timings"]["trials"]
    assert sum(t["model_calls"] for t in per_trial) == usage["model_calls"]
    assert sum(t["input_tokens"] for t in per_trial) == usage["input_tokens"]
    body = (release / "body.md").read_text()
    # Cells are escaped Markdown (body.markdown_cell): look for the escaped text.
    assert markdown_cell(f"terminus-2 2.0.0 (model openai/benchseal-scripted; {usage['model_calls']} model calls, "
                         f"{usage['input_tokens']} input / {usage['output_tokens']} output tokens)") in body
