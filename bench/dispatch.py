"""Dispatch benchmark: API requests per dispatch and per poll, and time from a
run's appearance to its discovery, against a simulated busy repository
(30 unrelated runs inside the correlation window), on the emulator.

Goal: at most one list request per poll, discovery within one poll interval.
Prints figures; asserts nothing (no timed assertions anywhere).

    .venv/bin/python bench/dispatch.py
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from pipeline.contracts import DigestsFile, load_model
from pipeline.dispatch import PollConfig, build_payload, dispatch_and_wait, make_client
from pipeline.testing.github import FakeClock, GitHubEmulator

ROOT = Path(__file__).resolve().parents[1]
INFRA = "acme/bench-infra"
LIST_OP = "actions/list-workflow-runs-for-repo"
INTERVAL = 5.0
BUSY_RUNS = 30


def digests() -> DigestsFile:
    def entry(role: str, hex_digit: str) -> dict[str, object]:
        name, digest = f"127.0.0.1:5055/benchseal/{role}", "sha256:" + hex_digit * 64
        return {"name": name, "digest": digest, "ref": f"{name}@{digest}"}

    return load_model(DigestsFile, {
        "schema": "benchseal.digests/v1",
        "source": {"commit": "c" * 40, "ref": "refs/tags/v1.2.3", "repository": "acme/widget"},
        "images": {"runner": entry("runner", "1"), "api": entry("api", "2")},
    }, "bench digests")


def one(appear_after: float, per_page: int, serial: int) -> dict[str, float]:
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
        for i in range(BUSY_RUNS):  # a busy repository: other releases' runs in the same window
            emulator.create_run(INFRA, display_title=f"Benchmark v0.{i} widget-{i}-1-{i:012x}",
                                status="completed", conclusion="success",
                                created_at=clock.now() - timedelta(seconds=i))
        emulator.run_appearance_delay = timedelta(seconds=appear_after)
        emulator.on_dispatch(lambda handle, event: handle.complete("success"))
        gh = make_client(base_url=emulator.base_url, token=emulator.token, per_page=per_page, backoff_factor=0)
        cid = f"bench-{serial:04d}-1-0123456789ab"
        payload = build_payload(digests(), correlation_id=cid)
        start = clock.now()
        wall = time.perf_counter()
        dispatch_and_wait(gh, INFRA, payload, workflow=None, event_type="benchseal-benchmark", timeout_s=600,
                          poll=PollConfig(attempts=30, interval_s=INTERVAL), clock=Synced())
        wall = time.perf_counter() - wall
        lists = [r for r in emulator.requests if r.operation == LIST_OP]
        first_list = lists[0].at
        setup = [r for r in emulator.requests if r.at <= first_list and r.operation != LIST_OP]
        polls = len({r.at for r in lists})
        [run] = [r for r in emulator.runs(INFRA) if r.display_title.endswith(" " + cid)]
        visible = run.visible_at or run.created_at
        return {
            "setup_requests": len(setup),
            "polls": polls,
            "list_requests_per_poll": len(lists) / polls,
            "discovery_s": (lists[-1].at - visible).total_seconds(),
            "elapsed_fake_s": (lists[-1].at - start).total_seconds(),
            "wall_ms_per_request": 1000 * wall / len(emulator.requests),
        }


def main() -> None:
    delays = [0.0, 1.0, 4.9, 5.0, 7.5, 12.0, 17.2, 29.9, 44.0]
    for per_page in (100, 30):
        rows = [one(d, per_page, i) for i, d in enumerate(delays)]
        print(f"busy repository ({BUSY_RUNS} other runs in the window), per_page={per_page}, poll interval {INTERVAL:g} s")
        print(f"  {'appears after':>13} {'polls':>5} {'lists/poll':>10} {'discovery':>9} {'setup reqs':>10}")
        for delay, row in zip(delays, rows, strict=True):
            print(f"  {delay:>12.1f}s {row['polls']:>5.0f} {row['list_requests_per_poll']:>10.2f} "
                  f"{row['discovery_s']:>8.1f}s {row['setup_requests']:>10.0f}")
        worst = max(r["discovery_s"] for r in rows)
        print(f"  requests per dispatch (before polling): {rows[0]['setup_requests']:.0f} "
              "(GET repo, POST dispatches)")
        print(f"  list requests per poll: max {max(r['list_requests_per_poll'] for r in rows):.2f}")
        print(f"  discovery after appearance: worst {worst:.1f} s = {worst / INTERVAL:.2f} poll intervals")
        print(f"  wall time per API request (emulator + validation): "
              f"median {statistics.median(r['wall_ms_per_request'] for r in rows):.1f} ms")
        print()


if __name__ == "__main__":
    main()
