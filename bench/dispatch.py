"""Dispatch benchmark: list requests per poll while waiting for the infra run, and
time from a run's appearance to its discovery, on the emulator (fake time).

The repository is busy: other releases' runs of the infra workflow and another
workflow's runs inside the correlation window. Side by side in one run:

* new: what ``dispatch_and_wait`` sends (the workflow's own runs, 100 per page,
  filtered by event and ``created``; more pages only when ``total_count`` says so);
* old: what the former strategy (the repository's runs listing at the client's
  page size, every page read) needed for the same state, counted by replaying
  that listing against the emulator after each dispatch.

Target: 1 list request per poll. Prints figures; asserts nothing.

    .venv/bin/python bench/dispatch.py
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from pipeline.core.contracts import DigestsFile, load_model
from pipeline.dispatch.client import make_client
from pipeline.dispatch.correlate import PollConfig, created_filter
from pipeline.dispatch.dispatch import build_payload, dispatch_and_wait
from tests.doubles.github import FakeClock, GitHubEmulator

ROOT = Path(__file__).resolve().parents[1]
INFRA = "acme/bench-infra"
LIST_OP = "actions/list-workflow-runs"
OLD_LIST_OP = "actions/list-workflow-runs-for-repo"
INTERVAL = 5.0
TARGET = 1.0


@dataclass(frozen=True)
class Row:
    appear_after: float
    polls: int
    lists_per_poll_max: int
    lists_per_poll_mean: float
    old_lists_per_poll: int
    discovery_s: float
    setup_requests: int
    wall_ms_per_request: float


def digests() -> DigestsFile:
    def entry(role: str, hex_digit: str) -> dict[str, object]:
        name, digest = f"127.0.0.1:5055/benchseal/{role}", "sha256:" + hex_digit * 64
        return {"name": name, "digest": digest, "ref": f"{name}@{digest}"}

    return load_model(DigestsFile, {
        "schema": "benchseal.digests/v1",
        "source": {"commit": "c" * 40, "ref": "refs/tags/v1.2.3", "repository": "acme/widget"},
        "images": {"runner": entry("runner", "1"), "api": entry("api", "2")},
    }, "bench digests")


def one(appear_after: float, per_page: int, serial: int, same_workflow: int, other_workflow: int) -> Row:
    clock = FakeClock()

    class Synced:
        def now(self):  # type: ignore[no-untyped-def]
            return clock.now()

        def sleep(self, seconds: float) -> None:
            emulator.wait_callbacks()
            clock.sleep(seconds)

    with GitHubEmulator(clock=clock) as emulator:
        emulator.add_repo(INFRA)
        emulator.add_workflow(INFRA, ".github/workflows/benchmark.yml",
                              (ROOT / ".github/workflows/benchmark.yml").read_text())
        emulator.add_workflow(INFRA, ".github/workflows/ci.yml", name="CI")
        for i in range(same_workflow):  # other releases' runs in the same window
            emulator.create_run(INFRA, display_title=f"Benchmark v0.{i} widget-{i}-1-{i:012x}",
                                workflow="benchmark.yml", status="completed", conclusion="success",
                                created_at=clock.now() - timedelta(seconds=i % 60))
        for i in range(other_workflow):  # another workflow reacting to repository_dispatch events
            emulator.create_run(INFRA, display_title=f"CI {i}", workflow="ci.yml", status="completed",
                                conclusion="success", created_at=clock.now() - timedelta(seconds=i % 60))
        emulator.run_appearance_delay = timedelta(seconds=appear_after)
        emulator.on_dispatch(lambda handle, event: handle.complete("success"))
        gh = make_client(base_url=emulator.base_url, token=emulator.token, per_page=per_page, backoff_factor=0)
        cid = f"bench-{serial:04d}-1-0123456789ab"
        payload = build_payload(digests(), correlation_id=cid)
        poll = PollConfig(attempts=30, interval_s=INTERVAL)
        start = clock.now()
        wall = time.perf_counter()
        dispatch_and_wait(gh, INFRA, payload, event_type="benchseal-benchmark", timeout_s=600, poll=poll,
                          clock=Synced())
        wall = time.perf_counter() - wall
        requests = list(emulator.requests)
        lists = [r for r in requests if r.operation == LIST_OP]
        per_poll: dict[object, int] = {}
        for r in lists:  # a poll's requests share one fake instant
            per_poll[r.at] = per_poll.get(r.at, 0) + 1
        setup = [r for r in requests if r.at <= lists[0].at and r.operation != LIST_OP]
        [run] = [r for r in emulator.runs(INFRA) if r.display_title.endswith(" " + cid)]
        visible = run.visible_at or run.created_at
        first_seen = next(at for at in per_poll if at >= visible)
        # The former strategy, replayed on the final state: the repository's runs, every page.
        before = emulator.count(OLD_LIST_OP)
        since = start - timedelta(seconds=poll.skew_s)
        for _ in gh.get_repo(INFRA).get_workflow_runs(event="repository_dispatch", created=created_filter(since)):
            pass
        old = emulator.count(OLD_LIST_OP) - before
        return Row(appear_after, len(per_poll), max(per_poll.values()), statistics.mean(per_poll.values()), old,
                   (first_seen - visible).total_seconds(), len(setup), 1000 * wall / len(requests))


def table(title: str, rows: list[Row], per_page: int) -> None:
    print(title)
    print(f"  {'appears after':>13} {'polls':>5} {'lists/poll new':>14} {'old':>5} {'discovery':>9} {'setup reqs':>10}")
    for row in rows:
        print(f"  {row.appear_after:>12.1f}s {row.polls:>5} {row.lists_per_poll_max:>14} {row.old_lists_per_poll:>5} "
              f"{row.discovery_s:>8.1f}s {row.setup_requests:>10}")
    new_max = max(r.lists_per_poll_max for r in rows)
    new_mean = statistics.mean(r.lists_per_poll_mean for r in rows)
    old_max = max(r.old_lists_per_poll for r in rows)
    old_mean = statistics.mean(r.old_lists_per_poll for r in rows)
    worst = max(r.discovery_s for r in rows)
    print(f"  list requests per poll: new max {new_max} mean {new_mean:.2f} | old (repository listing, "
          f"per_page={per_page}) max {old_max} mean {old_mean:.2f} | target {TARGET:g} "
          f"(new/target {new_max / TARGET:.2f})")
    print(f"  requests per dispatch before polling: {rows[0].setup_requests} (GET repo, GET workflow, POST dispatch)")
    print(f"  discovery after appearance: worst {worst:.1f} s = {worst / INTERVAL:.2f} poll intervals; "
          "each match is confirmed by one more poll")
    print(f"  wall time per API request (emulator + validation): "
          f"median {statistics.median(r.wall_ms_per_request for r in rows):.1f} ms")
    print()


def main() -> None:
    delays = [0.0, 1.0, 4.9, 5.0, 7.5, 12.0, 17.2, 29.9, 44.0]
    for per_page in (100, 30):
        rows = [one(d, per_page, i, same_workflow=30, other_workflow=30) for i, d in enumerate(delays)]
        table(f"busy repository (30 other benchmark runs + 30 runs of another workflow in the window), "
              f"client per_page={per_page}, poll interval {INTERVAL:g} s", rows, per_page)
    rows = [one(d, 30, 100 + i, same_workflow=150, other_workflow=0) for i, d in enumerate(delays[:3])]
    table("fallback: 150 other runs of the infra workflow in the window (more than one page of 100: "
          "total_count asks for a second page)", rows, 30)


if __name__ == "__main__":
    main()
