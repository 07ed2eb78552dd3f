"""Imported HumanEval tasks run as the worker runs a batch, on the real sandbox engine: rendered onto the
base (``FROM benchseal-base`` -> the base by id), task images prebuilt, then Harbor trials through the
runner's ``run_suite`` behind the engine proxy, graded by benchseal's verifier (the exit status of
tests/test.sh) and read back with the one grading rule. The oracle resolves every task, nop none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import trial_name
from pipeline.core.datasets import verify_staged
from pipeline.core.scoring import grade_result
from pipeline.datasets import humaneval
from pipeline.infra.sandbox.engine_proxy import EngineProxy
from pipeline.infra.worker.images import prebuild_task_images, render_suite
from pipeline.runner.grader import GRADER_DIR, OUTPUT_FILE
from pipeline.runner.trial import run_suite
from tests.fixtures.infra import sandbox_engine
from tests.runner import test_engine_env as engine_env_tests

pytestmark = [pytest.mark.docker, pytest.mark.slow]
proxied = engine_env_tests.proxied
base_in_sandbox = engine_env_tests.base_in_sandbox

TASKS = "HumanEval/0,HumanEval/32,HumanEval/33"  # floats; a helper of the prompt; the function called by name
RUN = "run-0123456789abcdef0a36"


@pytest.mark.parametrize(("agent", "outcome", "reward", "said"), [
    ("oracle", "resolved", 1.0, "passed"),
    ("nop", "unresolved", 0.0, "FAILED: CandidateError: loading the solution failed: FileNotFoundError"),
])
def test_imported_tasks_score_one_with_the_oracle_and_zero_with_nop(
        tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str, base_refs: Any,
        agent: str, outcome: str, reward: float, said: str) -> None:
    dataset = tmp_path / "dataset"
    count, digest = humaneval.import_humaneval(dataset, TASKS)
    assert count == 3
    verify_staged(dataset, digest)  # what the worker will do before it runs a staged dataset
    suite = tmp_path / "suite"
    render_suite(dataset, suite, base_refs["base"], from_image=base_in_sandbox)
    pinned = prebuild_task_images(sandbox_engine(), suite, records=tmp_path / "records")
    assert sorted(pinned) == ["humaneval-0", "humaneval-32", "humaneval-33"]
    specs = run_suite(suite, tmp_path / "out", run_id=RUN, agent=agent, concurrency=3)
    assert sorted(s.task for s in specs) == ["humaneval-0", "humaneval-32", "humaneval-33"]
    for spec in specs:
        assert spec.trial_name == trial_name(spec.task, RUN)
        result = tmp_path / "out" / "harbor" / spec.trial_name / "result.json"
        grade = grade_result(result.read_bytes() if result.is_file() else None)
        assert (grade.outcome, grade.reward) == (outcome, reward), (spec.task, grade.reason)
        output = (result.parent / GRADER_DIR / OUTPUT_FILE).read_text()  # what tests/verify.py printed
        assert said in output, output
