"""What the rootless sandbox engine costs against the host's root engine (prints figures; asserts nothing timed).

Side by side in one run, rounds interleaved (host, sandbox, host, ...), the same images by id:

1. a container's life (create, start, wait, remove) of the base image running ``true``;
2. ``docker exec`` of ``true`` in a running container (Harbor drives trials by exec);
3. a classic build of a small task image (FROM the base by id, RUN, COPY), no cache;
4. 2000 small files written in a container's own layer (overlay2 in a user namespace);
5. REAL oracle trials: the runner container running ``benchseal trial run`` on suites/smoke with the
   engine's socket at /var/run/docker.sock (the worker's command, task images prebuilt, without
   the engine proxy, which is the same on both sides); per trial: wall, Harbor's own phases;
6. the one-time cost of handing the runner image to the sandbox (``copy_image``: docker save | load)
   and the warm check.

Usage: .venv/bin/python bench/sandbox.py [--rounds N] [--trial-rounds N]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

_BENCH = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH]
sys.path.insert(0, str(_BENCH.parent))

import docker  # noqa: E402 (after the sys.path fix above)

from pipeline.core.digests import parse_ref  # noqa: E402
from pipeline.imaging.build import build_images, ensure_base, ensure_local  # noqa: E402
from pipeline.infra.sandbox import engine as sandbox  # noqa: E402
from pipeline.infra.worker.loop import prebuild_task_images, render_suite  # noqa: E402

print = functools.partial(print, flush=True)
ROOT = _BENCH.parent


def _timed(fn: Callable[[], Any]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def _lifecycle(client: Any, image: str) -> None:
    container = client.containers.create(image, ["true"], network_mode="none")
    container.start()
    container.wait()
    container.remove(force=True)


def _files(client: Any, image: str) -> None:
    container = client.containers.run(image, ["sh", "-c", "mkdir /d; for i in $(seq 2000); do echo $i > /d/$i; done"],
                                      network_mode="none", detach=True)
    container.wait()
    container.remove(force=True)


def _build(client: Any, base_id: str, scratch: Path, n: int) -> None:
    ctx = scratch / f"build-{n}"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(f"FROM {base_id}\nRUN echo {n} > /n && mkdir -p /app\nCOPY f /app/f\n")
    (ctx / "f").write_bytes(b"x" * 100_000)
    image, _ = client.images.build(path=str(ctx), rm=True, forcerm=True, pull=False, nocache=True)
    client.images.remove(image.id, force=True)


def _trial(client: Any, runner_id: str, base_ref: Any, base_id: str, socket: str, work: Path, n: int,
           grant: bool) -> dict[str, float]:
    out = work / f"trial-{n}"
    out.mkdir(parents=True)
    render_suite(ROOT / "suites" / "smoke", out / "suite", base_ref, tasks={"write-answer"}, from_image=base_id)
    prebuild_task_images(client, out / "suite")
    if grant:
        sandbox.grant(out)
    start = time.monotonic()
    container = client.containers.run(
        runner_id, entrypoint=["benchseal"],
        command=["trial", "run", "--suite-dir", str(out / "suite"), "--out", str(out), "--run-id", f"bench-{n}",
                 "--concurrency", "1", "--agent", "oracle"],
        environment={"HARBOR_TELEMETRY": "0", "DOCKER_BUILDKIT": "0"},
        volumes={str(out): {"bind": str(out), "mode": "rw"}, socket: {"bind": "/var/run/docker.sock", "mode": "rw"}},
        network_mode="none", detach=True)
    code = container.wait()["StatusCode"]
    wall = time.monotonic() - start
    logs = container.logs()[-2000:].decode("utf-8", "replace")
    container.remove(force=True)
    results = list(out.glob("harbor/**/result.json"))
    if code != 0 or not results:
        raise SystemExit(f"trial on {socket} failed (exit {code}): {logs}")
    result = json.loads(results[0].read_text())
    reward = ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward")
    if reward != 1 and reward != 1.0:
        raise SystemExit(f"trial on {socket}: reward {reward!r}, exception {result.get('exception_info')}")

    def span(key: str) -> float:
        phase = result.get(key) or {}
        if not phase.get("started_at") or not phase.get("finished_at"):
            return 0.0
        return (datetime.fromisoformat(phase["finished_at"]) - datetime.fromisoformat(phase["started_at"])).total_seconds()

    return {"runner wall": wall, "environment setup": span("environment_setup"), "agent": span("agent_execution"),
            "verifier": span("verifier")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--trial-rounds", type=int, default=3)
    args = parser.parse_args()
    box = sandbox.default_sandbox()
    sandbox.start(box)
    host = docker.from_env(timeout=300)
    sand = docker.DockerClient(base_url=box.url, timeout=300)
    registry = os.environ.get("BENCHSEAL_REGISTRY", "127.0.0.1:5055")
    base_ref = ensure_base(registry)["base"]
    ensure_local(base_ref)
    base_id = host.images.get(base_ref.ref).id
    runner_ref = parse_ref(build_images(["runner"], registry).images["runner"].ref)
    ensure_local(runner_ref)
    runner_id = host.images.get(runner_ref.ref).id

    t = time.monotonic()
    present = True
    try:
        sand.images.get(runner_id)
    except docker.errors.ImageNotFound:
        present = False
    sandbox.copy_image(host, sand, base_id)
    sandbox.copy_image(host, sand, runner_id)
    first = time.monotonic() - t
    warm = _timed(lambda: sandbox.copy_image(host, sand, runner_id))
    size = host.images.get(runner_id).attrs["Size"] / 1e6
    print(f"runner image ({size:.0f} MB) into the sandbox: {'already there' if present else f'{first:.1f} s first time'}, "
          f"{warm * 1000:.0f} ms warm check")

    engines = {"host": (host, "/var/run/docker.sock", False), "sandbox": (sand, str(box.socket), True)}
    micro: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-sandbox-"))
    for n in range(args.rounds):
        for name, (client, _, _) in engines.items():
            samples = micro[name]
            samples.setdefault("container life (true)", []).append(_timed(lambda c=client: _lifecycle(c, base_id)))
            running = client.containers.run(base_id, ["sleep", "60"], network_mode="none", detach=True)
            samples.setdefault("exec true", []).append(_timed(lambda r=running: r.exec_run(["true"])))
            running.remove(force=True)
            samples.setdefault("2000 files in a layer", []).append(_timed(lambda c=client: _files(c, base_id)))
            samples.setdefault("classic build, no cache", []).append(
                _timed(lambda c=client, k=n, d=scratch / name: _build(c, base_id, d, k)))
    print(f"\nmedians over {args.rounds} interleaved rounds (seconds):")
    print(f"{'':<28}{'host':>9}{'sandbox':>9}{'ratio':>8}")
    for key in micro["host"]:
        h, s = statistics.median(micro["host"][key]), statistics.median(micro["sandbox"][key])
        print(f"{key:<28}{h:>9.3f}{s:>9.3f}{s / h:>8.2f}")

    trials: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for n in range(args.trial_rounds):
        for name, (client, socket, grant) in engines.items():
            trials[name].append(_trial(client, runner_id, base_ref, base_id, socket, scratch / name, n, grant))
    print(f"\noracle trial (suites/smoke write-answer), {args.trial_rounds} interleaved rounds, medians (seconds):")
    print(f"{'':<28}{'host':>9}{'sandbox':>9}{'ratio':>8}")
    for key in trials["host"][0]:
        h = statistics.median(t[key] for t in trials["host"])
        s = statistics.median(t[key] for t in trials["sandbox"])
        print(f"{key:<28}{h:>9.2f}{s:>9.2f}{(s / h if h else float('nan')):>8.2f}")
    host.close()
    sand.close()


if __name__ == "__main__":
    main()
