"""The worker records a release's own agent's model usage as its relays counted it (``pipeline.infra.sandbox.agents.
trial_usage``), whatever the agent wrote into Harbor's result about itself; Harbor's own agents (terminus-2, in the
runner process) keep Harbor's accounting. A real SQLite queue, the worker's batch recorder and Harbor result files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core.contracts import MODEL_CALLS_KEY, DispatchPayload
from pipeline.infra.queue.sql import PlannedTrial, SqliteQueue
from pipeline.infra.sandbox.relay import CallUsage
from pipeline.infra.worker.grading import RunnerInfo
from pipeline.infra.worker.loop import _BatchRecorder

DIGEST = "sha256:" + "0" * 64
RESULT = Path(__file__).with_name("data") / "harbor-result.json"
ARTIFACT = {"name": "hello-agent", "kind": "python", "package": "hello-agent", "version": "1.2.3",
            "integrity": "sha256-" + "A" * 43 + "=", "source_commit": "0123456789abcdef0123456789abcdef01234567"}
# What an agent can put into Harbor's context about itself: any number at all.
FORGED = {"n_input_tokens": 10**12, "n_output_tokens": 7, "metadata": {MODEL_CALLS_KEY: 1000}}


def _recorded(tmp_path: Path, make_payload: Callable[..., dict[str, Any]], counts: dict[str, CallUsage],
              **payload: Any) -> dict[str, dict[str, Any]]:
    """Two trials recorded by one batch whose relays counted ``counts`` (by compose project): each trial as the
    queue holds it."""
    with SqliteQueue(tmp_path / "q.sqlite3") as q:
        run_id, _ = q.enqueue(DispatchPayload.model_validate(make_payload(**payload)), max_attempts=2)
        claim = q.claim("planner", 60)
        assert claim is not None and claim.lease_token
        q.start(run_id, claim.lease_token)
        names = [f"t{i}__{run_id[-12:]}" for i in range(2)]
        assert q.plan_trials(run_id, claim.lease_token, [PlannedTrial(task=f"t{i}", trial_name=n)
                                                         for i, n in enumerate(names)], max_attempts=2) is None
        batch = q.claim_trials("host-a", 60, 2)
        assert batch is not None
        out = tmp_path / "batch"
        for name in names:
            result = json.loads(RESULT.read_text())
            result.update(trial_name=name, agent_result=FORGED)
            (out / "harbor" / name).mkdir(parents=True)
            (out / "harbor" / name / "result.json").write_text(json.dumps(result))
        recorder = _BatchRecorder(q, batch, out, 60, expected_digest=DIGEST)
        recorder.usage.counting = bool(counts)
        for key, usage in counts.items():
            recorder.usage.add(key.replace("RUN", run_id[-12:]), usage)
        recorder.record(RunnerInfo(image_id=None, digest=DIGEST), final=True)
        return {row.trial_name.split("__")[0]: json.loads(row.result or "{}")["trial"] for row in q.trials(run_id)}


def test_a_release_agent_s_usage_is_the_relays_count_never_its_own_report(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]]) -> None:
    trials = _recorded(tmp_path, make_payload, {"t0__RUN": CallUsage(2, 300, 40), "t0__RUN__env": CallUsage(1),
                                                "t1__RUN__env": CallUsage(1, 50, 5)},
                       agent="hello-agent", agent_artifact=ARTIFACT)
    usage = {task: (t["model_calls"], t["input_tokens"], t["output_tokens"]) for task, t in trials.items()}
    assert usage == {"t0": (3, 300, 40), "t1": (1, 50, 5)}


def test_a_release_agent_without_a_model_reports_no_usage(tmp_path: Path,
                                                          make_payload: Callable[..., dict[str, Any]]) -> None:
    trials = _recorded(tmp_path, make_payload, {}, agent="hello-agent", agent_artifact=ARTIFACT)
    assert {(t["model_calls"], t["input_tokens"], t["output_tokens"]) for t in trials.values()} == {(None, None, None)}


def test_harbor_s_own_agent_keeps_harbor_s_accounting(tmp_path: Path,
                                                      make_payload: Callable[..., dict[str, Any]]) -> None:
    trials = _recorded(tmp_path, make_payload, {"t0__RUN__env": CallUsage(5, 1, 1)}, agent="terminus-2")
    assert {(t["model_calls"], t["input_tokens"]) for t in trials.values()} == {(1000, 10**12)}
