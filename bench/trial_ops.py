"""What a HumanEval oracle trial asks of the sandbox engine, for two commits side by side (issue 36.6).

Each side is a commit's ``pipeline/`` exported to a temp dir (``git archive``) and run in a child process with it
first on ``sys.path``: N HumanEval tasks (suites/humaneval, rendered on benchseal's base in the sandbox engine, the
task image built once) through ``pipeline.runner.trial.run_suite`` with Harbor's oracle, in-process, through an
engine proxy in front of the sandbox engine (the runner's path without its container). The two sides alternate
round by round, so both meet the same load. Printed per side, medians over every trial: the trial's wall, each
phase (environment setup, agent, agent's end to verifier, verifier; from Harbor's result.json) with the engine
operations that ended in it (from env-timings.jsonl; a removal and a ``snapshot`` read are not operations), the
execs, and the engine requests a trial made (counted at the proxy; the client's version check is once a process);
and each round's span, its first trial's start to its last one's end (the throughput, whatever moved between phases).

Usage: .venv/bin/python bench/trial_ops.py [--before REV] [--after REV] [--tasks 8] [--concurrency 4] [--rounds 3]
[--agent-wait SECONDS]
(default: HEAD~1 against HEAD). Needs the sandbox engine and the local registry (the base image) running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PHASES = ("setup", "agent", "gap", "verifier")


def _child(out: Path, tasks: int, concurrency: int, agent_wait: float) -> None:
    """Run the trials with whichever ``pipeline`` comes first on sys.path (the side's export). ``agent_wait``: seconds
    the oracle sleeps before it solves (a model's latency: an agent that waits, the CPU idle meanwhile)."""
    import docker

    from pipeline.imaging.build import ensure_base, ensure_local
    from pipeline.infra.sandbox import engine as sandbox
    from pipeline.infra.sandbox.engine_proxy import EnginePolicy, EngineProxy
    from pipeline.infra.worker.images import prebuild_task_images, render_suite
    from pipeline.runner import engine_env, envshared
    from pipeline.runner.trial import run_suite

    def timed(trial_dir: Path, session: str, op: str, started: float) -> None:  # the same line, and when it ended
        with (trial_dir / envshared.TIMINGS_FILE).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"session": session, "op": op, "seconds": round(time.monotonic() - started, 4),
                                     "t": time.time()}) + "\n")

    engine_env.record_timing = timed  # type: ignore[attr-defined]
    box = sandbox.default_sandbox()
    sandbox.start(box)
    engine = docker.DockerClient(base_url=box.url, timeout=120)
    host = docker.from_env()
    ref = ensure_base(os.environ.get("BENCHSEAL_REGISTRY", "127.0.0.1:5055"))["base"]
    ensure_local(ref)
    base_id = sandbox.copy_image(host, engine, host.images.get(ref.ref).id)
    names = sorted((p.name for p in (REPO / "suites" / "humaneval").iterdir() if (p / "task.toml").is_file()),
                   key=lambda name: int(name.rsplit("-", 1)[1]))[:tasks]
    suite = out / "suite"
    render_suite(REPO / "suites" / "humaneval", suite, ref, tasks=set(names), from_image=base_id)
    if agent_wait > 0:
        for name in names:
            solve = suite / name / "solution" / "solve.sh"
            shebang, _, rest = solve.read_text().partition("\n")
            solve.write_text(f"{shebang}\nsleep {agent_wait}\n{rest}")
    records = out.parent / "task-image-records"
    records.mkdir(mode=0o700, exist_ok=True)
    prebuild_task_images(engine, suite, records)
    sandbox.grant(out)
    (out / "engine").mkdir()
    proxy = EngineProxy(out / "engine" / "docker.sock", EnginePolicy(bind_roots=(out,)), upstream=str(box.socket)).start()
    requests: list[str] = []
    forward = proxy._forward

    def counted(peer: Any, request: Any, *args: Any) -> None:
        requests.append(f"{request.method} {request.path}")
        forward(peer, request, *args)

    proxy._forward = counted  # type: ignore[method-assign,assignment]
    os.environ[engine_env.ENGINE_ENV] = f"unix://{out / 'engine' / 'docker.sock'}"
    try:
        run_suite(suite, out / "run", run_id="run-" + os.urandom(10).hex(), agent="oracle", concurrency=concurrency)
    finally:
        proxy.stop()
    (out / "requests.json").write_text(json.dumps([r for r in requests if r != "GET /version"]))
    (out / "load.json").write_text(json.dumps(os.getloadavg()))


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _trials(out: Path) -> list[dict[str, float]]:
    rows = []
    for trial in sorted((out / "run" / "harbor").iterdir()):
        result = json.loads((trial / "result.json").read_text())
        if not result.get("verifier_result") or result["verifier_result"]["rewards"].get("reward") != 1:
            raise SystemExit(f"{trial.name}: not resolved by the oracle: {result.get('exception_info')}")
        a0, a1 = _ts(result["agent_execution"]["started_at"]), _ts(result["agent_execution"]["finished_at"])
        v0, v1 = _ts(result["verifier"]["started_at"]), _ts(result["verifier"]["finished_at"])
        spans = {"setup": (_ts(result["environment_setup"]["started_at"]), _ts(result["environment_setup"]["finished_at"])),
                 "agent": (a0, a1), "gap": (a1, v0), "verifier": (v0, v1)}
        row = {"trial": _ts(result["finished_at"]) - _ts(result["started_at"]), "ops": 0.0, "execs": 0.0}
        row |= {f"{phase} s": end - start for phase, (start, end) in spans.items()}
        row |= {f"{phase} ops": 0.0 for phase in PHASES}
        for line in (trial / "env-timings.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry["op"] in ("stop", "snapshot"):
                continue
            row["ops"] += 1
            row["execs"] += entry["op"] == "exec"
            for phase, (start, end) in spans.items():
                if start - 0.002 <= entry["t"] <= end + 0.002:
                    row[f"{phase} ops"] += 1
                    break
        rows.append(row)
    return rows


def _span(out: Path) -> float:
    """A round's trials from the first one's start to the last one's end: the run's throughput, whatever moved
    between the phases (a container started ahead of its trial is in it, not in any trial's wall)."""
    results = [json.loads((trial / "result.json").read_text()) for trial in (out / "run" / "harbor").iterdir()]
    return max(_ts(r["finished_at"]) for r in results) - min(_ts(r["started_at"]) for r in results)


def _export(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "pipeline"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for shared in ("images", "suites", "policies"):  # what pipeline reads beside itself, from the checkout
        (into / shared).symlink_to(REPO / shared)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD~1")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agent-wait", type=float, default=0.0,
                        help="seconds the oracle sleeps before it solves (a model's latency; default 0)")
    parser.add_argument("--child", nargs=4, metavar=("OUT", "TASKS", "CONCURRENCY", "WAIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(Path(args.child[0]), int(args.child[1]), int(args.child[2]), float(args.child[3]))
        return
    with tempfile.TemporaryDirectory(prefix="trial-ops-") as tmp:
        root = Path(tmp)
        sides = {"before": _export(args.before, root / "before"), "after": _export(args.after, root / "after")}
        runs: dict[str, list[Path]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            for side, code in sides.items():
                out = root / f"{side}-{round_}"
                out.mkdir()
                env = dict(os.environ, PYTHONPATH=str(code), HARBOR_TELEMETRY="0")
                done = subprocess.run([sys.executable, "-P", __file__, "--child", str(out), str(args.tasks),
                                       str(args.concurrency), str(args.agent_wait)], env=env, capture_output=True,
                                      text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{side}, round {round_ + 1} failed:\n{done.stderr[-3000:]}")
                runs[side].append(out)
        print(f"{args.tasks} HumanEval oracle trials at concurrency {args.concurrency}, {args.rounds} rounds, "
              f"the oracle waiting {args.agent_wait} s first, {args.before} against {args.after}; medians per trial")
        table: dict[str, dict[str, float]] = {}
        for side, outs in runs.items():
            rows = [row for out in outs for row in _trials(out)]
            table[side] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            table[side]["requests"] = statistics.median(len(json.loads((out / "requests.json").read_text()))
                                                        / len(_trials(out)) for out in outs)
            loads = [json.loads((out / "load.json").read_text())[0] for out in outs]
            spans = [round(_span(out), 2) for out in outs]
            print(f"{side}: {len(rows)} trials, load {min(loads):.1f}-{max(loads):.1f}, the rounds' spans {spans} s "
                  f"(first trial's start to last one's end)")
        for key in table["before"]:
            print(f"  {key:>14}  {table['before'][key]:8.3f}  {table['after'][key]:8.3f}")


if __name__ == "__main__":
    main()
