"""`benchseal evidence RUN_DIR` end to end (own BENCHSEAL_HOME, own Sigstore instance)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.evidence import sigstore_local
from pipeline.verify import verify_release
from tests.fixtures.sigstore import make_inputs

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]


def test_cli_writes_verifiable_evidence(tmp_path: Path, handmade_image: object, handmade_api_image: object) -> None:
    grading, payload = make_inputs({"runner": handmade_image.ref, "api": handmade_api_image.ref})  # type: ignore[attr-defined]
    run_dir = tmp_path / "runs" / grading.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "grading.json").write_text(grading.model_dump_json())
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": grading.run_id, "correlation_id": payload.correlation_id, "state": "SUCCEEDED", "attempts": 1,
        "suite": payload.suite, "agent": payload.agent, "source": payload.source.model_dump(mode="json"),
        "runner": payload.runner, "api": payload.api, "created_at": grading.started_at, "updated_at": grading.finished_at,
    }))
    home = tmp_path / "home"
    env = {**os.environ, "BENCHSEAL_HOME": str(home)}
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(run_dir), "--signer", "local"],
                              capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
        assert done.returncode == 0, done.stderr
        assert "6 bundles" in done.stdout
        verify_release(run_dir / "artifacts", repository=payload.source.repository, tag=payload.source.tag, trusted_root=home / "sigstore" / "trusted_root.json")
        # bad input is a usage error naming the file
        (run_dir / "grading.json").write_text("{}")
        bad = subprocess.run([sys.executable, "-m", "pipeline", "evidence", str(run_dir), "--signer", "local"],
                             capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
        assert bad.returncode == 2 and "grading.json" in bad.stderr
    finally:
        sigstore_local.stop(home / "sigstore")
