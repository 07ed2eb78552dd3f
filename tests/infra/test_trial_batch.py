"""A suite's ``trial_batch`` (issue 36.5): how many trials one runner container takes under one lease, Harbor
running them ``trial_concurrency`` at a time. The policy rule and the worker's choice of batch size; the
behaviour on the real engines is tests/e2e/test_e2e_humaneval.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.worker.config import WorkerConfig
from pipeline.infra.worker.loop import _batch_size


def _policy(tmp_path: Path, **smoke: Any) -> InfraPolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["suites"] = {"smoke": {**data["suites"]["smoke"], **smoke}}
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


def test_a_suite_without_trial_batch_takes_one_wave_per_runner_container(tmp_path: Path) -> None:
    policy = _policy(tmp_path, trial_concurrency=4)
    assert policy.trial_batch("smoke") == 4
    assert _batch_size(WorkerConfig(policy=policy), policy, "smoke") == 4


def test_a_suites_trial_batch_is_what_the_worker_claims(tmp_path: Path) -> None:
    policy = _policy(tmp_path, trial_concurrency=4, trial_batch=40)
    assert _batch_size(WorkerConfig(policy=policy), policy, "smoke") == 40
    assert _batch_size(WorkerConfig(policy=policy), policy, None) == 40  # a claim before the run is known: the largest
    # The worker's own options still come first (bench ablations, an operator's host).
    assert _batch_size(WorkerConfig(policy=policy, trial_batch=3), policy, "smoke") == 3
    assert _batch_size(WorkerConfig(policy=policy, trial_concurrency=2), policy, "smoke") == 2


@pytest.mark.parametrize(("value", "needle"), [
    (0, "greater than or equal to 1"),
    (1001, "less than or equal to 1000"),
    ("8", "valid integer"),
    (2.5, "valid integer"),
])
def test_a_bad_trial_batch_is_refused_naming_the_field(tmp_path: Path, value: object, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        _policy(tmp_path, trial_batch=value)
    line = info.value.diagnostics()
    assert "suites.smoke.trial_batch" in line and needle in line and "\n" not in line, line


def test_the_shipped_humaneval_suite_runs_in_one_runner_container() -> None:
    policy = load_policy()
    assert policy.trial_batch("humaneval") >= 164 > policy.trial_concurrency("humaneval")
