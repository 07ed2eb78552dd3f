"""The release's verification commands: run side by side, first failure (in body order) reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import CheckFailed
from pipeline.release.local import run_commands


def test_all_commands_pass(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert run_commands(["test -f f", "true"], tmp_path) == ["test -f f", "true"]


def test_first_failure_in_body_order_is_reported(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed) as caught:
        run_commands(["true", "test -f missing-one", "sh -c 'exit 3'"], tmp_path)
    assert "test -f missing-one" in caught.value.diagnostics()
    assert "exit 3" not in caught.value.diagnostics()
