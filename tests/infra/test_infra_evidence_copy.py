"""The worker copies a run's trial folders into its evidence as regular files and directories only:
a trial's symlink could name any file of the host, and consumers refuse links (verify)."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.infra.worker.loop import _copy_evidence


def test_links_and_fifos_stay_behind(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    trial = run_dir / "harbor" / "task__1"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text('{"reward": 1}\n')
    (trial / "host-file").symlink_to("/etc/hostname")
    (trial / "dangling").symlink_to(tmp_path / "nowhere")
    (trial / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(trial / "pipe")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "runner.log").write_text("ok\n")
    (run_dir / "logs" / "leak").symlink_to("/etc/passwd")

    _copy_evidence(run_dir)

    evidence = run_dir / "artifacts" / "evidence"
    copied = sorted(p.relative_to(evidence).as_posix() for p in evidence.rglob("*"))
    assert copied == ["harbor", "harbor/task__1", "harbor/task__1/result.json", "logs", "logs/runner.log"]
    assert not any(p.is_symlink() for p in evidence.rglob("*"))
