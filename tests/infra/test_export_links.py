"""The export's listing of a run's evidence (pipeline.infra.worker.export._evidence_files): regular files only, in
one sorted order, and never anything reached through a link: a linked directory is not entered, a linked file
not listed (Harbor's trial dirs may hold links; a runner could plant one pointing outside the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.infra.worker.export import EVIDENCE, _evidence_files


def test_the_listing_holds_the_regular_files_and_nothing_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret").write_text("not evidence")
    (outside / "deep" / "key").write_text("not evidence")
    run_dir = tmp_path / "run"
    evidence = run_dir / EVIDENCE
    trial = evidence / "harbor" / "humaneval-10__abc"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text("{}")
    (trial / "agent" / "log.txt").write_text("ran")
    (evidence / "harbor" / "humaneval-2__abc").mkdir()
    (evidence / "harbor" / "humaneval-2__abc" / "result.json").write_text("{}")
    (evidence / "trials.json").write_text("{}")
    (trial / "linked-dir").symlink_to(outside)  # a directory link: never entered
    (trial / "agent" / "linked-file").symlink_to(outside / "secret")
    (trial / "dangling").symlink_to(tmp_path / "gone")
    names = [name for name, _ in _evidence_files(run_dir)]
    assert names == [f"{EVIDENCE}/harbor/humaneval-10__abc/agent/log.txt",
                     f"{EVIDENCE}/harbor/humaneval-10__abc/result.json",
                     f"{EVIDENCE}/harbor/humaneval-2__abc/result.json",
                     f"{EVIDENCE}/trials.json"]


def test_a_linked_evidence_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run" / "artifacts").mkdir(parents=True)
    (tmp_path / "run" / EVIDENCE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckFailed, match="is a symlink"):
        list(_evidence_files(tmp_path / "run"))
