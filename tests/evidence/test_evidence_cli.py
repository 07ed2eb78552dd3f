"""`benchseal evidence RUN_DIR` end to end (own BENCHSEAL_HOME, own Sigstore instance)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.infra.intake.policy import load_policy
from pipeline.local import sigstore as sigstore_local
from pipeline.verify.release import verify_release
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.trials import evidence_for, graded_export, harbor_result, policy_file, write_comparison

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]


def test_cli_writes_verifiable_evidence(tmp_path: Path, handmade_image: object, handmade_api_image: object) -> None:
    grading, payload = make_inputs({"runner": handmade_image.ref, "api": handmade_api_image.ref})  # type: ignore[attr-defined]
    run_dir = tmp_path / "runs" / grading.run_id
    run_dir.mkdir(parents=True)
    evidence_for(grading, run_dir / "artifacts" / "evidence")
    (run_dir / "grading.json").write_text(grading.model_dump_json())
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": grading.run_id, "correlation_id": payload.correlation_id, "state": "SUCCEEDED", "attempts": 1,
        "suite": payload.suite, "agent": payload.agent, "source": payload.source.model_dump(mode="json"),
        "runner": payload.runner, "api": payload.api, "created_at": grading.started_at, "updated_at": grading.finished_at,
        "counts": grading.counts.model_dump(), "score": grading.score,
    }))
    # The infra policy the seal checks the run against: it admits the hand-made images for acme/widget.
    policy = policy_file(tmp_path / "infra.yaml", {payload.source.repository: {"runner": payload.runner,
                                                                               "api": payload.api}})
    write_comparison(run_dir, grading, load_policy(policy))  # the first scored release of acme/widget
    home = tmp_path / "home"
    env = {**os.environ, "BENCHSEAL_HOME": str(home)}
    command = [sys.executable, "-m", "pipeline", "evidence", str(run_dir), "--signer", "local", "--policy", str(policy)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
        assert done.returncode == 0, done.stderr
        assert "7 bundles" in done.stdout  # test-result.intoto.json's among them
        verify_release(run_dir / "artifacts", repository=payload.source.repository, tag=payload.source.tag, trusted_root=home / "sigstore" / "trusted_root.json")
        # bad input is a usage error naming the file
        (run_dir / "grading.json").write_text("{}")
        bad = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
        assert bad.returncode == 2 and "grading.json" in bad.stderr
    finally:
        sigstore_local.stop(home / "sigstore")


def test_a_real_export_seals_and_its_flat_release_verifies(tmp_path: Path, handmade_image: object,
                                                           handmade_api_image: object) -> None:
    """The accepted side of issue 22.5 from a real export (queue, the worker's grader, the export writer):
    resolved, unresolved, an agent timeout and one infrastructure error (within the policy's 34%). The
    release as published (flat: no trial dirs) carries trial-results.json, and verify re-grades it."""
    runner, api = handmade_image.ref, handmade_api_image.ref  # type: ignore[attr-defined]
    policy = policy_file(tmp_path / "infra.yaml", {"acme/widget": {"runner": runner, "api": api}})
    payload = {"schema": "benchseal.dispatch/v1", "correlation_id": "seal-cli-0001",
               "source": {"repository": "acme/widget", "commit": "d" * 40, "tag": "v2.0.0"},
               "runner": runner, "api": api, "suite": "smoke", "agent": "oracle"}
    results = {"alpha": harbor_result("x", 1.0), "beta": harbor_result("x", 0.0),
               "gamma": harbor_result("x", None, exception="AgentTimeoutError"),
               "delta": harbor_result("x", None, exception="EnvironmentStartTimeoutError")}
    run_id, export = graded_export(tmp_path, payload, load_policy(policy), results)
    (tmp_path / "export.tar").write_bytes(export)
    home, dest = tmp_path / "home", tmp_path / "sealed" / run_id
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(dest), "--from-export",
                               str(tmp_path / "export.tar"), "--run-id", run_id, "--signer", "local", "--policy",
                               str(policy), "--json"], capture_output=True, text=True, check=False, timeout=300,
                              cwd=REPO, env={**os.environ, "BENCHSEAL_HOME": str(home)})
        assert done.returncode == 0, done.stderr
        summary = json.loads((dest / "artifacts" / "summary.json").read_text())
        assert (summary["status"], summary["score"]) == ("SUCCEEDED", 0.333333)
        assert summary["counts"] == {"total": 4, "completed": 3, "resolved": 1, "unresolved": 2, "infra_errors": 1}
        flat = tmp_path / "release"
        flat.mkdir()
        for path in (dest / "artifacts").iterdir():
            if path.is_file():
                shutil.copy2(path, flat / path.name)
        assert (flat / "trial-results.json").is_file()
        verify_release(flat, repository="acme/widget", tag="v2.0.0", trusted_root=home / "sigstore" / "trusted_root.json")
    finally:
        sigstore_local.stop(home / "sigstore")
