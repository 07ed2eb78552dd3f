"""Harbor's copy of the trial's agent logs back into the agent's environment (one archive upload a trial) is skipped
only where nothing reads them there: a single-step trial with a separate verifier, no collect hook and no artifact
at, under or above /logs/agent (pipeline.runner.trial.agent_logs_unread). No engine is needed: the trial is only
created."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig

from pipeline.runner.grader import IMPORT_PATH as GRADER_IMPORT_PATH
from pipeline.runner.trial import ENGINE_IMPORT_PATH, create_trial

SEPARATE = '[verifier]\nenvironment_mode = "separate"\n'
COLLECT = '[[verifier.collect]]\ncommand = "cat /logs/agent/x > /app/x"\n'


def _trial(tmp_path: Path, toml: str) -> Any:
    task = tmp_path / "task"
    for part in ("environment", "tests", "solution"):
        (task / part).mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM benchseal-base\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (task / "instruction.md").write_text("Probe.\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n' + toml)
    config = TrialConfig(task=TaskConfig(path=task), trial_name="probe__1", trials_dir=tmp_path / "trials",
                         agent=AgentConfig(name="oracle"),
                         environment=EnvironmentConfig(import_path=ENGINE_IMPORT_PATH, delete=True),
                         verifier=VerifierConfig(import_path=GRADER_IMPORT_PATH))
    return asyncio.run(create_trial(config))


@pytest.mark.parametrize(("toml", "skipped"), [
    ('artifacts = ["/app"]\n' + SEPARATE, True),
    (SEPARATE, True),
    ('artifacts = ["/app"]\n', False),  # a shared verifier runs in the agent's environment
    ('artifacts = ["/app"]\n[verifier]\nenvironment_mode = "shared"\n', False),
    ('artifacts = ["/logs/agent/trajectory.json"]\n' + SEPARATE, False),
    ('artifacts = ["/logs"]\n' + SEPARATE, False),
    ('artifacts = ["/app"]\n' + SEPARATE + COLLECT, False),
])
def test_agent_logs_are_copied_back_only_where_something_reads_them(tmp_path: Path, toml: str, skipped: bool) -> None:
    trial = _trial(tmp_path, toml)
    assert (trial._upload_agent_logs.__name__ == "_nothing") is skipped


def test_the_agent_environment_makes_its_log_dirs_in_its_setup(tmp_path: Path) -> None:
    """Where Harbor's own environments make them (EngineEnvironment.eager_dirs): the exec is counted in the trial's
    environment setup, not in the agent's phase (the benchmark compares the two with plain Harbor)."""
    trial = _trial(tmp_path, SEPARATE)
    assert trial.agent_environment.eager_dirs is True
