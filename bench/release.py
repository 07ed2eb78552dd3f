"""Benchmark ``benchseal release vX.Y.Z --local``: cold and warm wall time, split by stage.

Cold: a fresh BENCHSEAL_HOME (no layer or wheel caches, no Sigstore instance, an
empty queue); the registry and the engine's image store are the machine's (shared),
so "cold" means benchseal's own caches are cold. Warm: the same home again, nothing
changed (images must be reused: same digests).

Prints one row per stage and the pipeline overhead as a fraction of the whole:
overhead = wall time - the worker's benchmark work (image pulls, the runner
container, Harbor trials, grading). Goal: at most 10% when warm.

It runs a clone of HEAD (``--working-tree`` to run the working tree itself): other work in
the tree between the two runs would otherwise change the images and so the "warm" run.

Usage: .venv/bin/python bench/release.py [--tag v0.0.0-bench] [--keep] [--working-tree]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STAGES = ["setup", "build", "push", "attest", "dispatch", "queue_wait", "worker", "evidence", "signing", "publication",
          "verification"]


def snapshot(scratch: Path) -> Path:
    """A clone of HEAD: "nothing changed" between cold and warm even while the working tree
    moves (the source commit and every file are part of the images' digests)."""
    tree = scratch / "tree"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(tree)], check=True)
    (tree / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    return tree


def run_release(tag: str, home: Path, dist: Path, tree: Path) -> tuple[dict[str, Any], float]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost",
               PYTHONPATH=str(tree))
    started = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "release", tag, "--local",
                           "--json", "--dist", str(dist)], capture_output=True, text=True, env=env, check=False,
                          cwd=tree)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"benchseal release failed ({done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report, wall


def runner_start_to_first_trial(home: Path, run_id: str) -> float | None:
    """The runner container's StartedAt (engine clock) to the earliest Harbor trial start."""
    import re
    from datetime import datetime

    def ts(value: str) -> datetime:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value.replace("Z", "+00:00")))

    run_dir = home / "infra" / "runs" / run_id
    # The first batch's runner container (each batch of trials runs in its own).
    state_files = sorted(run_dir.glob("batches/*/logs/runner-state.json"))
    starts = [ts(json.loads(p.read_text())["started_at"]) for p in (run_dir / "harbor").glob("*/result.json")]
    if not state_files or not starts:
        return None
    state_file = state_files[0]
    if not state_file.is_file():
        return None
    started = json.loads(state_file.read_text()).get("StartedAt")
    return (min(starts) - ts(started)).total_seconds() if started else None


def print_issue_table(warm: dict[str, Any], warm_wall: float, runner_start: float | None) -> None:
    """The figures of issue 16 for the warm release, each with its target."""
    trials = warm["trials"]
    n = max(1, int(warm["counts"].get("total", 0)))
    overhead = trials.get("harbor_overhead", 0.0)
    rows = [
        ("warm release wall time (s)", warm_wall, 6.0, "{:.2f}"),
        ("Harbor overhead per trial (s)", overhead / n, 1.0, "{:.2f}"),
        ("harness overhead share of trial wall", overhead / trials["total"] if trials.get("total") else float("nan"),
         0.15, "{:.0%}"),
        ("runner start to first trial (s)", runner_start if runner_start is not None else float("nan"), 1.0, "{:.2f}"),
        ("pipeline overhead outside the worker (s)", warm_wall - warm["stages"].get("worker", 0.0), 0.5, "{:.2f}"),
    ]
    print()
    print("issue 16 figures (warm run):")
    print(f"{'figure':<42}{'measured':>10}{'target':>10}  met")
    for label, value, target, fmt in rows:
        print(f"{label:<42}{fmt.format(value):>10}{'<= ' + fmt.format(target):>10}  {'yes' if value <= target else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="v0.0.0-bench")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary home and dist.")
    parser.add_argument("--working-tree", action="store_true",
                        help="Run the working tree itself instead of a clone of HEAD.")
    args = parser.parse_args()

    from pipeline.core import paths

    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-release-"))
    home, dist = scratch / "home", scratch / "dist"
    home.mkdir()
    # Tools (cosign) are installed by `make setup` into the default home: share them, not the caches.
    tools = paths.home() / "tools"
    if tools.is_dir():
        (home / "tools").symlink_to(tools, target_is_directory=True)
    tree = REPO
    try:
        tree = REPO if args.working_tree else snapshot(scratch)
        cold, cold_wall = run_release(args.tag, home, dist, tree)
        warm, warm_wall = run_release(args.tag, home, dist, tree)
        warm_runner_start = runner_start_to_first_trial(home, warm["run_id"])
    finally:
        # The instance this benchmark started, by its recorded pid; stopped by the code that
        # started it (the snapshot's), which recognises its own server process.
        subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "sigstore", "stop"],
                       env=dict(os.environ, BENCHSEAL_HOME=str(home), PYTHONPATH=str(tree)), cwd=tree,
                       check=False, capture_output=True)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"benchseal release {args.tag} --local: cold vs warm (seconds)")
    print(f"{'stage':<16}{'cold':>10}{'warm':>10}")
    for stage in STAGES:
        print(f"{stage:<16}{cold['stages'].get(stage, 0.0):>10.2f}{warm['stages'].get(stage, 0.0):>10.2f}")
    print(f"{'wall (process)':<16}{cold_wall:>10.2f}{warm_wall:>10.2f}")
    print()
    print("trials (summed over the suite's trials, which run concurrently inside the worker stage):")
    for key in ("agent", "verifier", "harbor_overhead", "total"):
        print(f"  {key:<16}{cold['trials'].get(key, 0.0):>10.2f}{warm['trials'].get(key, 0.0):>10.2f}")
    print()
    for name, report, wall in (("cold", cold, cold_wall), ("warm", warm, warm_wall)):
        work = report["stages"].get("worker", 0.0)
        overhead = max(0.0, wall - work)
        print(f"{name}: pipeline overhead {overhead:.1f}s of {wall:.1f}s = {overhead / wall:.1%} "
              f"(benchmark work = worker stage {work:.1f}s); images reused: {report['images_reused']}; "
              f"bytes pushed: {report.get('bytes_pushed', 0)}")
    print(f"warm/cold wall ratio: {warm_wall / cold_wall:.2f}")
    same = cold["images"] == warm["images"]
    print(f"same digests cold and warm: {same}")
    print("goal: warm overhead <= 10%:", "met" if max(0.0, warm_wall - warm["stages"].get("worker", 0.0))
          / warm_wall <= 0.10 else "NOT met")
    print_issue_table(warm, warm_wall, warm_runner_start)


if __name__ == "__main__":
    main()
