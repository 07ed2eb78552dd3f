"""The dispatch's wait says what it waits for and how long of how long (issue 38.4): finding the run,
then the run until it completes, against the GitHub emulator on fake time (the seconds in the lines
are the fake clock's, so they are exact). The run is completed from the reporter once it has been
reported in progress: an event, not a sleep.
"""

from __future__ import annotations

import io
import re
from datetime import timedelta
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.core.waiting import WaitLines, reporting
from pipeline.dispatch.correlate import PollConfig
from pipeline.dispatch.dispatch import build_payload, dispatch_and_wait
from tests.doubles.github import DispatchEvent, GitHubEmulator, RunHandle
from tests.fixtures.github import INFRA_REPO, SyncedClock, digests_data

CID = "bench-infra-4242-1-0a1b2c3d4e5f"
POLL = PollConfig(attempts=30, interval_s=5.0, skew_s=120.0)
FINDING = (rf"waiting for the run of \.github/workflows/benchmark\.yml in {re.escape(INFRA_REPO)} titled "
           rf"'\.\.\. {CID}' \(([0-9]+) s of 150 s\)")


def _payload() -> Any:
    from pipeline.core.contracts import DigestsFile, load_model

    return build_payload(load_model(DigestsFile, digests_data(), "digests"), correlation_id=CID)


class _CompleteWhenReported:
    """Passes every report on; completes the run once it was reported ``n`` times in progress."""

    def __init__(self, inner: WaitLines, n: int) -> None:
        self.inner, self.n, self.in_progress = inner, n, 0
        self.handle_ref: list[RunHandle] = []

    def update(self, what: str, elapsed: float, limit: float) -> None:
        self.inner.update(what, elapsed, limit)
        if "in_progress)" in what:
            self.in_progress += 1
            if self.in_progress == self.n:
                self.handle_ref[0].complete("success")

    def done(self, what: str, elapsed: float, found: bool) -> None:
        self.inner.done(what, elapsed, found)


@pytest.mark.parametrize("tty", [False, True])
def test_finding_then_following_the_run_is_said(github_emulator: GitHubEmulator, github_client: Any, infra_repo: str,
                                                 synced_clock: SyncedClock, tty: bool) -> None:
    assert infra_repo == INFRA_REPO
    github_emulator.run_appearance_delay = timedelta(seconds=12)  # visible from the poll at t=15 s
    out = io.StringIO()
    reporter = _CompleteWhenReported(WaitLines(out, tty=tty, every=10), n=4)

    def started(handle: RunHandle, event: DispatchEvent) -> None:
        reporter.handle_ref.append(handle)
        handle.start()

    github_emulator.on_dispatch(started)
    result = dispatch_and_wait(github_client, infra_repo, _payload(), event_type="benchseal-benchmark",
                               timeout_s=600, poll=POLL, clock=synced_clock, progress=reporter)
    assert result.conclusion == "success"
    url = re.escape(result.html_url)
    following = rf"waiting for workflow run {result.run_id} to complete \({url}, in_progress\) \(([0-9]+) s of 600 s\)"
    done = rf"waited ([0-9]+) s for workflow run {result.run_id} to complete \({url}, completed\): done"
    text = out.getvalue()
    if not tty:
        lines = text.splitlines()
        # Finding: polls at 0, 5, 10 s missed (a line at 0 and at 10 s); found at 15 s, then followed every
        # 5 s, a line when the what changed (15 s) and 10 s later (25 s); completed, confirmed at 35 s.
        assert [re.fullmatch(FINDING, line)[1] for line in lines[:2]] == ["0", "10"]  # type: ignore[index]
        assert [re.fullmatch(following, line)[1] for line in lines[2:4]] == ["15", "25"]  # type: ignore[index]
        assert re.fullmatch(done, lines[4]) and len(lines) == 5, lines
        assert all(line.isprintable() for line in lines)
    else:
        assert text.count("\n") == 1 and text.endswith("\n")
        updates = text[:-1].split("\r\x1b[K")[1:]
        assert [int(re.fullmatch(FINDING, u)[1]) for u in updates[:3]] == [0, 5, 10]  # type: ignore[index]
        assert [int(re.fullmatch(following, u)[1]) for u in updates[3:7]] == [15, 20, 25, 30]  # type: ignore[index]
        assert re.fullmatch(done, updates[7]) and len(updates) == 8, updates


def test_a_run_that_never_completes_closes_its_line_with_gave_up(github_emulator: GitHubEmulator,
                                                                 github_client: Any, infra_repo: str,
                                                                 synced_clock: SyncedClock) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.start())
    out = io.StringIO()
    with reporting(WaitLines(out, tty=True)), pytest.raises(CheckFailed, match="did not complete"):
        # no progress given: the one the caller installed (current_reporter)
        dispatch_and_wait(github_client, infra_repo, _payload(), event_type="benchseal-benchmark", timeout_s=20,
                          poll=POLL, clock=synced_clock)
    text = out.getvalue()
    assert text.endswith(": gave up\n") and text.count("\n") == 1  # the error line starts on a line of its own
    assert "in_progress" in text.rsplit("\r\x1b[K", 1)[1]


def test_a_run_found_at_once_and_confirmed_says_one_following_line(github_emulator: GitHubEmulator,
                                                                   github_client: Any, infra_repo: str,
                                                                   synced_clock: SyncedClock) -> None:
    github_emulator.on_dispatch(lambda handle, event: handle.complete("success"))
    out = io.StringIO()
    dispatch_and_wait(github_client, infra_repo, _payload(), event_type="benchseal-benchmark", timeout_s=600,
                      poll=POLL, clock=synced_clock, progress=WaitLines(out, tty=False))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and ", completed) (0 s of 600 s)" in lines[0] and lines[1].endswith(": done"), lines
