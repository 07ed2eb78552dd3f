"""Benchmark ``benchseal release vX.Y.Z --local``: cold and warm wall time, split by stage, beside a baseline.

Each side (the baseline commit, then this checkout) runs from its own snapshot (a clone at the
commit; for the current side a clone of HEAD, or ``--working-tree`` for the tree itself: other work
in the tree between the two runs would otherwise change the images and so the "warm" run), with its
own fresh BENCHSEAL_HOME. Cold: no layer or wheel caches, no Sigstore instance, an empty queue (the
registry and the engine's image store are the machine's, shared: "cold" means benchseal's own
caches are cold). Warm: the same home again, nothing changed (images must be reused: same digests).
The sides alternate (baseline cold, current cold, baseline warm, current warm), so both see the
same machine minutes apart.

Prints one row per stage and side, and issue 27's figures for the warm runs with their targets and
the ratio current / baseline:

* warm release wall time against the trials' own work (agent + verifier seconds, summed over the
  suite's trials; target: wall <= 1.15 x that work);
* pipeline overhead outside the worker (wall - the worker stage; target 0.5 s);
* Harbor overhead per trial (trial wall - agent - verifier; target 1 s) and its share;
* runner container start to the first trial.

Baseline: dbf8b71, the commit issue 27 was filed against (bench/build.py says why).

Usage: .venv/bin/python bench/release.py [--tag v0.0.0-bench] [--baseline COMMIT | --no-baseline]
                                         [--keep] [--working-tree]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

print = functools.partial(print, flush=True)
REPO = Path(__file__).resolve().parent.parent
# bench/queue.py would shadow the standard library's queue (urllib3 imports it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
BASELINE = "dbf8b71"

STAGES = ["setup", "build", "push", "attest", "dispatch", "queue_wait", "worker", "evidence", "signing", "publication",
          "verification"]


def snapshot(commit: str, dest: Path, *, own_commit: bool = False) -> Path:
    """A clone at ``commit`` (the node packages linked from this checkout: the same for both sides).

    ``own_commit``: an empty commit on top, so the images (whose labels name the commit) get digests
    of their own: the test suite builds and signs this checkout's HEAD in the same registry, and two
    signers appending to one digest's cosign tags at once can drop each other's attestations."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", "--no-checkout", str(REPO), str(dest)], check=True)
    subprocess.run(["git", "checkout", "-q", "--detach", commit], cwd=dest, check=True)
    if own_commit:
        env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
                   GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "bench snapshot"], cwd=dest, env=env, check=True)
    (dest / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    return dest


def run_release(label: str, tag: str, home: Path, dist: Path, tree: Path) -> tuple[dict[str, Any], float]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost",
               PYTHONPATH=str(tree))
    print(f"[{label}] benchseal release {tag} --local in {tree} ...")
    started = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "release", tag, "--local",
                           "--json", "--dist", str(dist)], capture_output=True, text=True, env=env, check=False,
                          cwd=tree)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"[{label}] benchseal release failed ({done.returncode}):\n{done.stderr[-4000:]}")
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


class Side:
    """One tree's cold and warm release, in a home of its own."""

    def __init__(self, label: str, tree: Path, scratch: Path) -> None:
        from pipeline.core import paths

        self.label, self.tree = label, tree
        self.home, self.dist = scratch / label / "home", scratch / label / "dist"
        self.home.mkdir(parents=True)
        # Tools (cosign) are installed by `make setup` into the default home: share them, not the caches.
        tools = paths.home() / "tools"
        if tools.is_dir():
            (self.home / "tools").symlink_to(tools, target_is_directory=True)
        self.runs: dict[str, tuple[dict[str, Any], float]] = {}

    def release(self, which: str, tag: str) -> None:
        self.runs[which] = run_release(f"{self.label} {which}", tag, self.home, self.dist, self.tree)

    def stop(self) -> None:
        # The instance this side started, by its recorded pid; stopped by the code that started it
        # (the snapshot's), which recognises its own server process.
        subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "sigstore", "stop"],
                       env=dict(os.environ, BENCHSEAL_HOME=str(self.home), PYTHONPATH=str(self.tree)), cwd=self.tree,
                       check=False, capture_output=True)

    def figures(self) -> dict[str, float]:
        """Issue 27's figures of the warm run."""
        warm, wall = self.runs["warm"]
        cold, cold_wall = self.runs["cold"]
        trials = warm["trials"]
        n = max(1, int(warm["counts"].get("total", 0)))
        work = trials.get("agent", 0.0) + trials.get("verifier", 0.0)
        overhead = trials.get("harbor_overhead", 0.0)
        start = runner_start_to_first_trial(self.home, warm["run_id"])
        return {
            "cold_wall": cold_wall,
            "cold_build": cold["stages"].get("build", 0.0) + cold["stages"].get("push", 0.0),
            "warm_wall": wall,
            "worker": warm["stages"].get("worker", 0.0),
            "trials_work": work,
            "wall_over_work": wall / work if work else float("nan"),
            "outside_worker": wall - warm["stages"].get("worker", 0.0),
            "harbor_per_trial": overhead / n,
            "harbor_share": overhead / trials["total"] if trials.get("total") else float("nan"),
            "runner_start": start if start is not None else float("nan"),
        }


FIGURES = [  # key, label, target (None: none), format
    ("cold_wall", "cold release wall (s)", None, "{:.1f}"),
    ("cold_build", "cold build + push stages (s)", 60.0, "{:.1f}"),
    ("warm_wall", "warm release wall (s)", None, "{:.2f}"),
    ("worker", "warm worker stage (s)", None, "{:.2f}"),
    ("trials_work", "trials' own work: agent + verifier (s)", None, "{:.2f}"),
    ("wall_over_work", "warm wall / trials' own work", 1.15, "{:.2f}"),
    ("outside_worker", "overhead outside the worker (s)", 0.5, "{:.2f}"),
    ("harbor_per_trial", "Harbor overhead per trial (s)", 1.0, "{:.2f}"),
    ("harbor_share", "Harbor overhead share of trial wall", 0.15, "{:.0%}"),
    ("runner_start", "runner start to first trial (s)", 1.0, "{:.2f}"),
]


def print_report(sides: list[Side], tag: str, baseline: str | None) -> None:
    print(f"benchseal release {tag} --local: cold vs warm per stage (seconds)")
    print(f"{'stage':<16}" + "".join(f"{s.label + ' cold':>18}{s.label + ' warm':>18}" for s in sides))
    for stage in STAGES:
        print(f"{stage:<16}" + "".join(f"{s.runs['cold'][0]['stages'].get(stage, 0.0):>18.2f}"
                                       f"{s.runs['warm'][0]['stages'].get(stage, 0.0):>18.2f}" for s in sides))
    print(f"{'wall (process)':<16}" + "".join(f"{s.runs['cold'][1]:>18.2f}{s.runs['warm'][1]:>18.2f}" for s in sides))
    print()
    print("trials (summed over the suite's trials, which run concurrently inside the worker stage; warm):")
    for key in ("agent", "verifier", "harbor_overhead", "total"):
        print(f"  {key:<16}" + "".join(f"{s.runs['warm'][0]['trials'].get(key, 0.0):>18.2f}" for s in sides))
    for side in sides:
        cold, warm = side.runs["cold"][0], side.runs["warm"][0]
        print(f"{side.label}: same digests cold and warm: {cold['images'] == warm['images']}; "
              f"images reused: {warm['images_reused']}")
    print()
    figures = [side.figures() for side in sides]
    heads = "".join(f"{side.label:>12}" for side in sides)
    print(f"issue 27 figures (warm run unless named cold; ratio = current / baseline){'' if baseline else ': no baseline'}")
    print(f"{'figure':<42}{heads}{'ratio':>9}{'target':>10}  met")
    for key, label, target, fmt in FIGURES:
        values = [f[key] for f in figures]
        ratio = f"{values[-1] / values[0]:.2f}" if len(values) == 2 and values[0] else ""
        met = "" if target is None else ("yes" if values[-1] <= target else "NO")
        print(f"{label:<42}" + "".join(f"{fmt.format(v):>12}" for v in values)
              + f"{ratio:>9}{'' if target is None else '<= ' + fmt.format(target):>10}  {met}")
    if baseline:
        print(f"baseline: {baseline}; current: {sides[-1].tree}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="v0.0.0-bench")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to measure beside this checkout")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary homes and dists.")
    parser.add_argument("--working-tree", action="store_true",
                        help="Run the working tree itself instead of a clone of HEAD.")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-release-"))
    sides: list[Side] = []
    baseline = None
    try:
        if not args.no_baseline:
            baseline = subprocess.run(["git", "rev-parse", "--short=12", args.baseline], cwd=REPO, check=True,
                                      capture_output=True, text=True).stdout.strip()
            sides.append(Side("baseline", snapshot(baseline, scratch / "tree-baseline"), scratch))
        current = REPO if args.working_tree else snapshot("HEAD", scratch / "tree-current", own_commit=True)
        sides.append(Side("current", current, scratch))
        for which in ("cold", "warm"):
            for side in sides:
                side.release(which, args.tag)
        print_report(sides, args.tag, baseline)  # before the homes go: it reads the runs' trial dirs
    finally:
        for side in sides:
            side.stop()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
