"""What issue 35's isolation costs per trial, beside the commit the issue was filed against (a6aee64).

The same warm release on both sides, in one invocation: ``make demo``'s, the example Python agent
(examples/hello-agent, released as its own repository) against the scripted model. The baseline imports
the agent into the runner process and grades with Harbor's reward-file verifier; this checkout runs the
agent in a container of its own per trial (pipeline.runner.agent_box) and grades by the test command's
exit status in a root-only /tests (pipeline.runner.grader), with the kernel's limits on every container.

Each side: a snapshot clone at its commit (bench/release.py's ``snapshot``), a fresh BENCHSEAL_HOME,
one cold release to warm the caches, then the warm release that is measured. Printed, per side:

* the warm release's wall time and worker stage (the warm ``make demo`` figures of docs/performance.md);
* per trial (medians over the suite's trials, from Harbor's result.json phases): the agent phase and the
  verifier phase; and, on this side, the agent box's own start and stop (env-timings.jsonl);
* the trials counted: this side's smoke suite has a fourth, never-scored tamper canary, whose trial the
  worker runs too (its cost is part of the warm wall).

It needs the machine to itself: the two sides' sandbox engines live at one place, so it stops the running
one (``benchseal sandbox stop``) before each side; nothing else may use the sandbox engine meanwhile.

Usage: .venv/bin/python bench/isolation.py [--baseline COMMIT] [--keep]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BASELINE = "a6aee64"  # issue 35 was found against it
PROJECT = "examples/hello-agent/benchseal.toml"
TAG = "v0.1.0"  # the example's version


def _release_module() -> Any:
    """bench/release.py (its snapshot helper), loaded by path: bench/ is not a package."""
    spec = importlib.util.spec_from_file_location("bench_release", REPO / "bench" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _release(label: str, tree: Path, home: Path, dist: Path) -> tuple[dict[str, Any], float]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost",
               PYTHONPATH=str(tree))
    print(f"[{label}] benchseal release {TAG} --local --project {PROJECT} --scripted-model right ...", flush=True)
    started = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "release", TAG, "--local", "--json",
                           "--dist", str(dist), "--agent", "hello-agent", "--project", PROJECT,
                           "--scripted-model", "right"], capture_output=True, text=True, env=env, check=False, cwd=tree)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"[{label}] release failed ({done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report, wall


def _seconds(phase: Any) -> float | None:
    if not isinstance(phase, dict) or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    return (datetime.fromisoformat(phase["finished_at"]) - datetime.fromisoformat(phase["started_at"])).total_seconds()


def _per_trial(home: Path, run_id: str) -> dict[str, float]:
    """Medians over the run's trials: agent and verifier phases; the agent box's start and stop where it has one."""
    phases: dict[str, list[float]] = {"agent": [], "verifier": [], "box-start": [], "box-stop": []}
    for result in sorted((home / "infra" / "runs" / run_id / "harbor").glob("*/result.json")):
        data = json.loads(result.read_text())
        for key, phase in (("agent", "agent_execution"), ("verifier", "verifier")):
            value = _seconds(data.get(phase))
            if value is not None:
                phases[key].append(value)
        timings = result.parent / "env-timings.jsonl"
        for line in timings.read_text().splitlines() if timings.is_file() else ():
            entry = json.loads(line)
            if entry.get("op") in ("box-start", "box-stop"):
                phases[entry["op"]].append(float(entry["seconds"]))
    medians = {key: statistics.median(values) for key, values in phases.items() if values}
    medians["trials"] = float(len(phases["agent"]))
    return medians


def _stop_sandbox(tree: Path) -> None:
    """``benchseal sandbox stop`` of the checkout at ``tree`` (the engine that checkout's code started)."""
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "sandbox", "stop"],
                   env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree, check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--keep", action="store_true", help="keep the scratch homes and clones")
    args = parser.parse_args()
    snapshot = _release_module().snapshot
    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-isolation-"))
    rows: dict[str, dict[str, float]] = {}
    try:
        sides = {"baseline": snapshot(args.baseline, scratch / "tree-baseline"),
                 "current": snapshot("HEAD", scratch / "tree-current", own_commit=True)}
        # The two sides run different sandbox engines at the same place (a6aee64: rootless dockerd; now:
        # dockerd in a rootlesskit user namespace with delegated cgroups): each side gets its own, started by
        # its first release, the other side's stopped first (by the code that started it).
        previous = sides["current"]
        for label, tree in sides.items():
            _stop_sandbox(previous)
            previous = tree
            home, dist = scratch / label / "home", scratch / label / "dist"
            home.mkdir(parents=True)
            _release(f"{label} cold", tree, home, dist)
            report, wall = _release(f"{label} warm", tree, home, dist)
            if report["status"] != "SUCCEEDED" or report["score"] != 1.0:
                sys.exit(f"[{label}] the honest example agent did not score 1.0: {report['status']} {report['score']}")
            rows[label] = {"wall": wall, "worker": float(report["stages"].get("worker", 0.0)),
                           **_per_trial(home, report["run_id"])}
            subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "sigstore", "stop"],
                           env=dict(os.environ, BENCHSEAL_HOME=str(home), PYTHONPATH=str(tree)), cwd=tree,
                           check=False, capture_output=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nwarm release of {PROJECT} ({TAG}, scripted model), seconds; ratio = current / baseline")
    print(f"{'figure':<44}{'baseline':>10}{'current':>10}{'ratio':>8}")
    labels = [("wall", "warm release wall (make demo's release)"), ("worker", "worker stage"),
              ("trials", "trials run (current: + the tamper canary)"), ("agent", "agent phase per trial (median)"),
              ("verifier", "verifier phase per trial (median)"), ("box-start", "agent box start per trial (median)"),
              ("box-stop", "agent box stop per trial (median)")]
    for key, label in labels:
        base, cur = rows["baseline"].get(key), rows["current"].get(key)
        ratio = f"{cur / base:.2f}" if base and cur is not None else ""
        shown = [("" if v is None else f"{v:.2f}") for v in (base, cur)]
        print(f"{label:<44}{shown[0]:>10}{shown[1]:>10}{ratio:>8}")
    print(f"baseline: {args.baseline}; load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
