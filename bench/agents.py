"""Benchmark the agents a release can score, side by side from one run: oracle (Harbor's calibration
agent), the example adopter's Python agent (examples/hello-agent) and Qwen Code's npm release
(examples/qwen-code), each against the smoke suite (model-backed ones with the scripted model).

Per agent it prints:

* the trials' agent time and verifier time, and Harbor's overhead per trial (a trial's wall time
  minus its agent and verifier phases), from ``benchseal release --local --json``;
* the runner-image build time the agent adds: resolving the release's package (the npm tarball
  from the local registry and its integrity check, or the wheel built from the commit) plus its
  layers, cold (an empty layer cache) and warm (the same inputs again).

It runs a clone of HEAD in a fresh BENCHSEAL_HOME that shares only the machine's tools, the npm
tarball cache (``make setup`` fills it) and the downloaded wheels, so the images, the layer caches,
the Sigstore instance, the local npm registry and the queue are this run's own.

Usage: .venv/bin/python bench/agents.py [--keep]
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

# (agent, tag, project file relative to the tree, scripted model)
AGENTS: list[tuple[str, str, str | None, str | None]] = [
    ("oracle", "v0.0.0-bench", None, None),
    ("hello-agent", "v0.1.0", "examples/hello-agent/benchseal.toml", "right"),
    ("qwen-code", "v0.24.4", "examples/qwen-code/benchseal.toml", "right"),
]
BUILD_SCRIPT = """
import json, sys, time, tempfile
from pathlib import Path
from pipeline.core import paths
from pipeline.imaging.agentlayers import agent_layers
from pipeline.imaging.images import source_info
from pipeline.imaging.layers import BlobStore, LayerCache
from pipeline.agent.resolve import resolve_agent
from pipeline.local.agents import local_npm_registry

project, tag = Path(sys.argv[1]), sys.argv[2]
source = source_info()
out = {}
for phase in ("cold", "warm"):
    started = time.monotonic()
    cache_dir = paths.state_dir("bench-agent-cache", phase)
    agent = resolve_agent(project, tag=tag, commit=source.commit, repo_root=paths.REPO_ROOT, cache_dir=cache_dir,
                          npm_registry=local_npm_registry(project, tag))
    resolved = time.monotonic()
    store = BlobStore()
    cache = LayerCache(store, root=paths.state_dir("bench-agent-layers"))
    built = []
    layers = agent_layers(agent, deps_epoch=0, epoch=1, store=store, cache=cache, built=built)
    out[phase] = {"resolve": resolved - started, "layers": time.monotonic() - resolved,
                  "bytes": sum(layer.size for layer, _ in layers), "built": len(built)}
print(json.dumps(out))
"""


def snapshot(scratch: Path) -> Path:
    tree = scratch / "tree"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(tree)], check=True)
    (tree / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    return tree


def _env(home: Path, tree: Path) -> dict[str, str]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", PYTHONPATH=str(tree))
    env.pop("BENCHSEAL_NPM_REGISTRY", None)
    return env


def release(agent: str, tag: str, project: str | None, script: str | None, home: Path, tree: Path,
            dist: Path) -> dict[str, Any]:
    argv = [str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", "release", tag, "--local", "--json", "--dist",
            str(dist), "--agent", agent]
    if project:
        argv += ["--project", str(tree / project)]
    if script:
        argv += ["--scripted-model", script]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(home, tree), cwd=tree, check=False)
    if done.returncode != 0:
        sys.exit(f"release {agent} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    report["wall"] = time.monotonic() - started
    return report


def build_cost(project: str, tag: str, home: Path, tree: Path) -> dict[str, Any]:
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", BUILD_SCRIPT, str(tree / project), tag],
                          capture_output=True, text=True, env=_env(home, tree), cwd=tree, check=False)
    if done.returncode != 0:
        sys.exit(f"agent build for {project} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="Keep the temporary home and dist.")
    args = parser.parse_args()

    from pipeline.core import paths

    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-agents-"))
    home, dist = scratch / "home", scratch / "dist"
    (home / "cache").mkdir(parents=True)
    for shared, target in (("tools", home / "tools"), ("cache/npm", home / "cache" / "npm"),
                           ("cache/wheels", home / "cache" / "wheels")):
        if (paths.home() / shared).is_dir():
            target.symlink_to(paths.home() / shared, target_is_directory=True)
    tree = snapshot(scratch)
    reports: dict[str, dict[str, Any]] = {}
    builds: dict[str, dict[str, Any]] = {}
    try:
        for agent, tag, project, script in AGENTS:
            if project:
                builds[agent] = build_cost(project, tag, home, tree)
            reports[agent] = release(agent, tag, project, script, home, tree, dist)
    finally:
        for noun in (["local", "npm-registry", "stop"], ["sigstore", "stop"]):
            subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipeline", *noun], env=_env(home, tree),
                           cwd=tree, check=False, capture_output=True)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    names = [agent for agent, *_ in AGENTS]
    print("agents side by side (one run, smoke suite, 3 trials each; seconds)")
    print(f"{'figure':<44}" + "".join(f"{n:>14}" for n in names))

    def row(label: str, values: list[str]) -> None:
        print(f"{label:<44}" + "".join(f"{v:>14}" for v in values))

    def trials(agent: str, key: str) -> float:
        return float(reports[agent]["trials"].get(key, 0.0))

    def per_trial(agent: str, key: str) -> float:
        return trials(agent, key) / max(1, int(reports[agent]["counts"]["total"]))

    row("score", [f"{reports[n]['score']:.3f}" if reports[n]["score"] is not None else "-" for n in names])
    row("agent time per trial", [f"{per_trial(n, 'agent'):.2f}" for n in names])
    row("verifier time per trial", [f"{per_trial(n, 'verifier'):.2f}" for n in names])
    row("Harbor overhead per trial", [f"{per_trial(n, 'harbor_overhead'):.2f}" for n in names])
    row("worker stage", [f"{reports[n]['stages'].get('worker', 0.0):.2f}" for n in names])
    row("release wall", [f"{reports[n]['wall']:.2f}" for n in names])
    for phase in ("cold", "warm"):
        row(f"agent build, {phase}: resolve + check", ["-" if n not in builds else f"{builds[n][phase]['resolve']:.2f}"
                                                       for n in names])
        row(f"agent build, {phase}: layers", ["-" if n not in builds else f"{builds[n][phase]['layers']:.2f}"
                                              for n in names])
    row("agent layers (compressed MB)", ["-" if n not in builds else f"{builds[n]['cold']['bytes'] / 1e6:.1f}"
                                         for n in names])
    ratio = per_trial("qwen-code", "harbor_overhead") / max(1e-9, per_trial("oracle", "harbor_overhead"))
    print()
    print(f"Harbor overhead per trial, qwen-code / oracle: {ratio:.2f}x")


if __name__ == "__main__":
    main()
