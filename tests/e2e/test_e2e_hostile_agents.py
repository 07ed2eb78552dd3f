"""Hostile Python agents released for real (``benchseal release --local --project``) achieve nothing.

Each agent in ``tests/fixtures/hostile_agents/`` is built into the runner image from a commit as an
adopter's would be and runs where an adopter's runs: in a container of its own per trial
(``pipeline.runner.agent_box``), never in the runner process. Each scores 0 on every task (it
solves none honestly) and its own ``findings.json`` (copied back from its box into the trial's
agent dir) shows it ran and reached nothing:

* ``harness-reader``: sees no run dir, no task's ``solution/`` or ``tests/``, no trial dir; the
  reward files and markers it wrote landed nowhere outside its box (the run dir is searched);
* ``harness-patcher``: its monkeypatches of Harbor's verifier and benchseal's grader changed only
  its own process; no engine socket (nor any other socket but its channel) answers it.

The honest example agent still scoring 1.0 through the same path is
``tests/e2e/test_e2e_release_agent.py::test_hello_agent_release_scores_one``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile
from pipeline.core.paths import REPO_ROOT
from pipeline.runner.agent_box import IMAGE_SUITES
from tests.fixtures.homes import shared_home

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
HOSTILE = REPO_ROOT / "tests" / "fixtures" / "hostile_agents"
TAG = "v0.0.1"
AGENTS = ("harness-reader", "harness-patcher")
READER_MARKER = "hostile-harness-reader"
IMAGE_PACKAGES = "/usr/local/lib/python3.13/dist-packages/"  # the runner image's (images/runner/image.toml)


def _fresh_home(root: Path) -> Path:
    assert not root.exists(), root
    return shared_home(root)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    """BENCHSEAL_HOME of every release here (``built_images``: the bases and layer caches are warm)."""
    from pipeline.local import sigstore as sigstore_local

    home = _fresh_home(tmp_path_factory.mktemp("hostile") / "home")
    yield home
    sigstore_local.stop(home / "sigstore")


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """policies/infra.yaml admitting each hostile agent (no model) for its own example repository."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    template = next(s for s in data["sources"] if s["repository"] == "benchseal-examples/hello-agent")
    for name in AGENTS:
        data["sources"].append({**template, "repository": f"benchseal-examples/{name}"})
        data["agents"].append({"name": name, "kind": "python", "package": name,
                               "repositories": [f"benchseal-examples/{name}"], "model": False})
    path = tmp_path_factory.mktemp("policy") / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _release(home: Path, policy: Path, name: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Release the agent ``name`` (its directory copied out of any git checkout: its own repository)."""
    project = tmp_path / "src" / name
    shutil.copytree(HOSTILE / name, project, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("BENCHSEAL_AGENT_API_KEY", "BENCHSEAL_PROJECT_DIR")}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    done = subprocess.run([BENCHSEAL, "release", TAG, "--local", "--project", str(project / "benchseal.toml"),
                           "--dist", str(tmp_path / "dist"), "--policy", str(policy), "--json"],
                          capture_output=True, text=True, env=env, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    summary = json.loads((Path(report["release_dir"]) / "summary.json").read_text())
    return report, home / "infra" / "runs" / summary["run_id"]


def _findings(run_dir: Path) -> list[dict[str, Any]]:
    trials = [p for p in (run_dir / "harbor").iterdir() if p.is_dir()]  # the scored ones and the suite's canaries
    found = [json.loads(p.read_text()) for p in sorted((run_dir / "harbor").glob("*/agent/findings.json"))]
    assert len(found) == len(trials) >= 3 and all(f["ran"] for f in found), "every trial's agent ran and reported"
    return found


def _scored_zero(report: dict[str, Any]) -> None:
    assert report["status"] == "SUCCEEDED" and report["score"] == 0.0, report
    assert report["counts"] == {"total": 3, "completed": 3, "resolved": 0, "unresolved": 3, "infra_errors": 0}


def test_an_agent_reading_and_writing_the_run_dir_reaches_nothing(home: Path, policy: Path, tmp_path: Path) -> None:
    report, run_dir = _release(home, policy, "harness-reader", tmp_path)
    _scored_zero(report)
    for finding in _findings(run_dir):
        # Its logs dir is its box's, and nothing it saw is a task's, a trial's or a run's.
        assert finding["logs_dir"] == "/box/logs"
        assert not finding["cheated"]
        # Harbor's own task templates in the image's site-packages are public; nothing else was found
        # (before the box hid them, the suites in the runner image were: /opt/benchseal/suites).
        assert finding["files"], "the walk saw the image (Harbor's templates): it did run"
        for path in finding["files"] + finding["dirs"]:
            assert path.startswith(IMAGE_PACKAGES) or path == IMAGE_SUITES, path  # that one empty, read-only
        # What it wrote stayed in its own (removed) box or its container's tmpfs.
        assert all(p.startswith(("/box/", "/tmp/")) or p == "/box" for p in finding["written"]), finding["written"]
    leaked = [p for p in run_dir.rglob("*") if READER_MARKER in p.name or
              (p.is_file() and p.name in ("reward.txt", "reward.json") and p.read_text().strip() in ("1", '{"reward": 1.0}'))]
    assert leaked == []
    assert not list(run_dir.rglob("agent-box")), "every box dir is removed when its trial's agent phase ends"


def test_an_agent_patching_the_grader_and_opening_sockets_changes_nothing(home: Path, policy: Path,
                                                                         tmp_path: Path) -> None:
    report, run_dir = _release(home, policy, "harness-patcher", tmp_path)
    _scored_zero(report)
    for finding in _findings(run_dir):
        # The patches applied (in the agent's own process: it imported Harbor's verifier there)...
        assert any(p.startswith("harbor.verifier.verifier.") for p in finding["patched"]), finding["patched"]
        # ...and no socket but its channel answered: no engine, no model relay.
        assert finding["sockets"] and all(a.startswith("refused") for a in finding["sockets"].values()), finding
