"""``benchseal release --local --suite humaneval`` (what ``make demo SUITE=humaneval`` runs) over a subset of
HumanEval's tasks, through the real path: the shipped policy's suite pinned by digest, suites/humaneval as
``make setup`` imported it, staged and re-hashed by the worker, the oracle in the runner's Harbor, graded, sealed,
signed, published and verified. The 164-task run is a measured figure (docs/performance.md), not a test.

The suite's ``trial_batch`` is larger than its ``trial_concurrency`` (issue 36.5): the subset's trials run in ONE
runner container, never more than trial_concurrency of them at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.infra.intake.policy import load_policy
from tests.fixtures.homes import fresh_home

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
TAG = "v0.0.4-e2e-humaneval"
# Floats, a helper of the prompt, the function called by name, dicts, the last problem; the 6th fills a 5th slot.
TASKS = ("humaneval-0", "humaneval-32", "humaneval-33", "humaneval-38", "humaneval-95", "humaneval-163")


@pytest.fixture(scope="module")
def local_home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    with fresh_home(tmp_path_factory, "humaneval-home") as home:
        yield home


def _overlap(results: list[dict[str, Any]]) -> int:
    """The most trials running at one instant (Harbor's started_at / finished_at of each)."""
    events = sorted([(datetime.fromisoformat(r["started_at"]), 1) for r in results]
                    + [(datetime.fromisoformat(r["finished_at"]), -1) for r in results], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_a_humaneval_subset_is_released_with_the_oracle_in_one_runner_container(local_home: Path,
                                                                                tmp_path: Path) -> None:
    policy = load_policy()
    suite = policy.suites["humaneval"]
    assert policy.trial_batch("humaneval") > suite.trial_concurrency < len(TASKS)
    dist = tmp_path / "dist"
    env = dict(os.environ, BENCHSEAL_HOME=str(local_home), HARBOR_TELEMETRY="0")
    done = subprocess.run([BENCHSEAL, "release", TAG, "--local", "--dist", str(dist), "--suite", "humaneval",
                           "--agent", "oracle", "--tasks", ",".join(TASKS), "--json"],
                          capture_output=True, text=True, env=env, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # released, published and verified (benchseal verify, cosign, gh)
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    assert report["counts"] == {"total": 6, "completed": 6, "resolved": 6, "unresolved": 0, "infra_errors": 0}
    summary = json.loads((dist / TAG / "summary.json").read_text())
    assert summary["dataset"]["digest"] == suite.dataset.digest
    assert sorted(summary["tasks"]) == sorted(TASKS)

    run_dir = local_home / "infra" / "runs" / report["run_id"]
    batches = sorted((run_dir / "batches").iterdir())
    assert len(batches) == 1, batches  # one runner container took every trial of the run
    results = [json.loads(p.read_text()) for p in sorted((run_dir / "harbor").glob("*/result.json"))]
    assert len(results) == len(TASKS)
    assert _overlap(results) <= suite.trial_concurrency  # Harbor's own limit held inside the container
