"""The worker's readiness marks and the runner's wait on them (pipeline.runner.readiness, issue 36.5)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from pipeline.core.errors import ValidationError
from pipeline.runner.readiness import ReadyTasks, make_ready_dir, mark_ready


def test_a_trial_waits_for_its_own_task_only(tmp_path: Path) -> None:
    ready = make_ready_dir(tmp_path)
    assert stat.S_IMODE(ready.stat().st_mode) == 0o755
    gate = ReadyTasks(ready, poll_seconds=0.01)
    order: list[str] = []

    async def trial(task: str) -> None:
        await gate.wait(task)
        order.append(task)

    async def scenario() -> None:
        waiting = [asyncio.create_task(trial(task)) for task in ("built-late", "built-early", "built-late")]
        await asyncio.sleep(0.05)
        assert order == []  # nothing is marked: nothing starts
        mark_ready(ready, ["built-early"])
        while not order:
            await asyncio.sleep(0.01)
        assert order == ["built-early"]
        mark_ready(ready, ["built-late", "built-early"])  # marking twice is a no-op
        await asyncio.gather(*waiting)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert sorted(order) == ["built-early", "built-late", "built-late"]
    assert sorted(os.listdir(ready)) == ["built-early", "built-late"]


def test_a_readiness_dir_that_goes_away_fails_every_waiting_trial_instead_of_hanging(tmp_path: Path) -> None:
    ready = make_ready_dir(tmp_path)
    gate = ReadyTasks(ready, poll_seconds=0.01)

    async def scenario() -> list[object]:
        waiting = [asyncio.create_task(gate.wait(task)) for task in ("a", "b")]
        await asyncio.sleep(0.03)
        ready.rmdir()
        return await asyncio.gather(*waiting, return_exceptions=True)

    results = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert all(isinstance(result, FileNotFoundError) for result in results), results


@pytest.mark.parametrize("name", ["../escape", "Upper", "", "a/b", ".hidden"])
def test_a_mark_names_a_task_directory_and_nothing_else(tmp_path: Path, name: str) -> None:
    ready = make_ready_dir(tmp_path)
    with pytest.raises(ValidationError, match="task"):
        mark_ready(ready, [name])
    assert os.listdir(ready) == []


def test_the_readiness_dir_is_made_once_per_batch(tmp_path: Path) -> None:
    make_ready_dir(tmp_path)
    with pytest.raises(FileExistsError):
        make_ready_dir(tmp_path)  # a leftover (or a planted) dir is never reused: the batch fails


def test_the_runner_refuses_a_readiness_dir_that_is_not_there(tmp_path: Path) -> None:
    from pipeline.runner.trial import run_suite

    suite = tmp_path / "suite"
    (suite / "task-a").mkdir(parents=True)
    (suite / "task-a" / "task.toml").write_text('version = "1.0"\n')
    with pytest.raises(ValidationError, match="--ready-dir"):
        run_suite(suite, tmp_path / "out", run_id="run-0123456789abcdef0123", agent="oracle",
                  ready_dir=tmp_path / "missing")
