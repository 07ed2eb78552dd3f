"""A batch's heartbeat renews what the batch holds, and says "lease lost" only when something was lost.

Under load (15-23) several runs logged "trial lease lost" although every trial was recorded and the run scored:
the trial lease covers the batch's trials not recorded yet, and the runner's teardown after its last trial
outlasted a beat's period, so the next beat found no trial to renew. Then nothing renewed the run that batch had
been handed to grade until the grader's own heartbeat started after the teardown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DispatchPayload
from pipeline.core.polling import poll_until
from pipeline.infra.queue.sql import PlannedTrial, SqliteQueue
from pipeline.infra.worker.grading import RunnerInfo
from pipeline.infra.worker.loop import _BatchRecorder, _TrialHeartbeat

DIGEST = "sha256:" + "0" * 64
RUNNER = RunnerInfo(image_id=None, digest=DIGEST)


def _planned(q: SqliteQueue, make_payload: Callable[..., dict[str, Any]], n: int) -> str:
    payload = DispatchPayload.model_validate(make_payload(correlation_id="heartbeat-corr-000001"))
    run_id, _ = q.enqueue(payload, max_attempts=2)
    claim = q.claim("planner", 60)
    assert claim is not None and claim.lease_token
    q.start(run_id, claim.lease_token)
    trials = [PlannedTrial(task=f"task-{i}", trial_name=f"task-{i}__{run_id[-12:]}") for i in range(n)]
    assert q.plan_trials(run_id, claim.lease_token, trials, max_attempts=2) is None
    return run_id


def _beats_until_done(beat: _TrialHeartbeat) -> None:
    beat.start()
    beat.join(timeout=30)
    assert not beat.is_alive(), "the heartbeat kept beating with nothing left to renew"


def test_a_batch_whose_trials_are_recorded_loses_nothing_and_keeps_the_handed_run(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    with SqliteQueue(tmp_path / "q.sqlite3") as q:
        run_id = _planned(q, make_payload, 3)
        first, last = q.claim_trials("host-a", 60, 2), q.claim_trials("host-b", 60, 1)
        assert first is not None and last is not None
        recorder = _BatchRecorder(q, first, tmp_path / "a", 60, expected_digest=DIGEST)
        beat = _TrialHeartbeat(q, run_id, first.lease_token, 60, 0.01, recorder)
        assert beat._beat()  # its trials are held: renewed
        recorder.record(RUNNER, final=True)  # every trial of the batch recorded (no result: an infra error each)
        with caplog.at_level(logging.WARNING, logger="benchseal.worker"):
            _beats_until_done(beat)  # what the runner's teardown after its last trial saw
        assert not beat.lost and not beat.failures and "lease lost" not in caplog.text, caplog.text

        # The batch that ends the run's last trial is handed the run: its lease is renewed until the batch is over.
        handed = _BatchRecorder(q, last, tmp_path / "b", 60, expected_digest=DIGEST)
        beat = _TrialHeartbeat(q, run_id, last.lease_token, 600, 0.01, handed)
        handed.record(RUNNER, final=True)
        run = handed.handed_run()
        assert run is not None and run.lease_token and run.lease_expires_at is not None
        assert beat._beat()  # the run's lease, under the token it was handed with
        renewed = q.get_run(run_id).lease_expires_at
        assert renewed is not None and renewed > run.lease_expires_at + timedelta(seconds=500), (run, renewed)


def test_a_batch_whose_trials_were_taken_back_says_its_lease_was_lost(
        tmp_path: Path, make_payload: Callable[..., dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    with SqliteQueue(tmp_path / "q.sqlite3") as q:
        run_id = _planned(q, make_payload, 2)
        batch = q.claim_trials("host-a", 60, 2)
        assert batch is not None
        recorder = _BatchRecorder(q, batch, tmp_path / "a", 60, expected_digest=DIGEST)
        beat = _TrialHeartbeat(q, run_id, batch.lease_token, 60, 0.01, recorder)
        # Its lease ran out and another worker's pass requeued its trials: that is a loss, and it is said.
        q.requeue_expired(now=datetime.now(UTC) + timedelta(seconds=120))
        assert beat._beat() is False
        with caplog.at_level(logging.ERROR, logger="benchseal.worker"):
            beat.start()
            try:
                assert poll_until(lambda: beat.lost or None, timeout=30, interval=0.01)
            finally:
                beat.done.set()
                beat.join(timeout=30)
        assert f"run {run_id}: trial lease lost" in caplog.text
