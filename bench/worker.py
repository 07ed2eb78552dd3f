"""Benchmark the infra queue and worker (prints figures; asserts nothing timed).

1. enqueue rate (accept path minus validation: SqliteQueue.enqueue, incl. run.json writes);
2. claim rate, one claimer and four threads;
3. 50 consecutive worker attempts in a cheap mode (run_once against a runner
   digest the registry does not have: claim, heartbeat thread, Engine client,
   pull, infra error, terminal transition): worker RSS and open FDs per attempt;
4. REAL runs (oracle on suites/smoke in the runner image), side by side and interleaved:
   "before" (the runner without bytecode, Harbor's compose build at trial time, Harbor's compose
   environment without any of pipeline.runner.tunings' changes) and "now" (benchseal's engine
   environment); with --ablation also "now" minus each single change ("now - engine-api" is the
   compose environment with its changes). Per variant: Harbor overhead per trial (trial wall - agent - verifier),
   its share of the trial wall time, runner start to the first trial (the runner
   container's StartedAt to the earliest trial start), where the time goes (the environments'
   operations: engine calls or compose commands, from each trial's env-timings.jsonl), plus RSS/FDs;
5. `harbor --version` in the runner (container start + import) with and without bytecode;
6. with --agents (default oracle,terminus-2): the same "now" runner per agent, interleaved in the
   same rounds (terminus-2 against the scripted model server, `right` script, on 127.0.0.1, its
   trial containers each behind a model gateway), and a side-by-side table of the per-trial
   harness overhead with each agent's ratio to oracle's.

The images are signed and attested as acme/benchseal's tag.yml by a private Sigstore instance of
the bench's own (started and stopped here), which the worker trusts, as in the tests.

Ratios between variants are measured in the same process minutes apart; absolute times
depend on the machine's load.

Usage: .venv/bin/python bench/worker.py [--real-runs N] [--cheap-runs N] [--ablation] [--version-runs N]
                                        [--agents oracle,terminus-2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

# Not bench/ itself on the path: bench/queue.py would shadow the standard library's queue (urllib3 needs it).
_BENCH = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _BENCH]
sys.path.insert(0, str(_BENCH.parent))

from pipeline.core.contracts import DispatchPayload  # noqa: E402 (after the sys.path fix above)
from pipeline.infra.intake.policy import load_policy  # noqa: E402
from pipeline.infra.queue.sql import SqliteQueue  # noqa: E402
from pipeline.runner.envshared import TIMINGS_FILE  # noqa: E402


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


TAG = "v0.0.0-bench"


def payload(i: int, runner: str, api: str, agent: str = "oracle") -> DispatchPayload:
    return DispatchPayload.model_validate({
        "schema": "benchseal.dispatch/v1",
        "correlation_id": f"bench-{os.getpid()}-{i:07d}",
        "source": {"repository": "acme/benchseal", "commit": "0" * 40, "tag": TAG},
        "runner": runner, "api": api, "suite": "smoke", "agent": agent,
    })


def bench_queue(root: Path, n: int) -> None:
    runner = "127.0.0.1:5055/benchseal/runner@sha256:" + "a" * 64
    api = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64
    db = root / "rates" / "queue.sqlite3"
    with SqliteQueue(db) as q:
        items = [payload(i, runner, api) for i in range(2 * n)]
        t = time.perf_counter()
        for p in items:
            q.enqueue(p, max_attempts=3)
        enqueue = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n):
            q.claim("bench", 60)
        claim1 = time.perf_counter() - t
    claimed = [0] * 4

    def claimer(k: int) -> None:
        with SqliteQueue(db) as mine:
            while mine.claim(f"t{k}", 60) is not None:
                claimed[k] += 1

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    claim4 = time.perf_counter() - t
    print(f"enqueue: {2 * n / enqueue:,.0f} runs/s ({2 * n} runs, {enqueue * 1e3 / (2 * n):.2f} ms each, incl. run.json)")
    print(f"claim, 1 claimer: {n / claim1:,.0f} claims/s")
    print(f"claim, 4 threads: {sum(claimed) / claim4:,.0f} claims/s (claimed {sum(claimed)}, no duplicates by construction)")


def bench_cheap_worker(root: Path, n: int) -> None:
    from pipeline.infra.worker.loop import WorkerConfig, run_once

    # acme/benchseal with the local runner/api repositories: the payloads pass the policy and the
    # attempt fails at the pull (the digest is absent), before any signature is checked.
    policy = _policy_file(root / "cheap", {"runner": [{"registry": "127.0.0.1:5055", "repository": "benchseal/runner"}],
                                           "api": [{"registry": "127.0.0.1:5055", "repository": "benchseal/api"}]},
                          None).model_copy(update={"max_attempts": 1})
    db = root / "cheap" / "queue.sqlite3"
    missing = "127.0.0.1:5055/benchseal/runner@sha256:" + "0" * 64
    api = "127.0.0.1:5055/benchseal/api@sha256:" + "b" * 64
    with SqliteQueue(db) as q:
        for i in range(n):
            q.enqueue(payload(10_000 + i, missing, api), max_attempts=1)
    config = WorkerConfig(db=db, policy=policy)
    rss, fds, wall = [], [], []
    import logging

    logging.getLogger("benchseal.worker").setLevel(logging.CRITICAL)
    for _ in range(n):
        t = time.perf_counter()
        outcome = run_once(config)
        wall.append(time.perf_counter() - t)
        assert outcome is not None and outcome.state == "INFRA_ERROR"
        rss.append(rss_kib())
        fds.append(open_fds())
    print(f"cheap worker attempts x{n} (claim+heartbeat+engine+pull by digest fails+INFRA_ERROR): "
          f"median {statistics.median(wall) * 1e3:.0f} ms")
    print(f"  RSS KiB: first {rss[0]}, after 10 {rss[9]}, last {rss[-1]}, max {max(rss)}; "
          f"growth after warm-up {rss[-1] - rss[9]:+d} KiB")
    print(f"  open FDs: first {fds[0]}, last {fds[-1]}, min {min(fds)}, max {max(fds)}")


TARGETS = {"overhead": 1.0, "share": 0.15, "runner_start": 1.0}


@dataclass(frozen=True)
class Variant:
    name: str
    runner: str
    prebuild: bool = True
    disable: tuple[str, ...] = ()
    agent: str = "oracle"


KEY_ENV = "BENCHSEAL_AGENT_API_KEY"


def signed_policy(root: Path, images: list[str], model_endpoint: str | None) -> tuple[Any, Any, Any]:
    """(policy, worker image trust, sigstore state): ``images`` signed and attested as acme/benchseal's
    tag.yml at the bench payloads' tag by a private Sigstore instance (stop it with sigstore_local.stop)."""
    from pipeline.attest.images import BuildInvocation, ImageSigner, SigstoreEndpoints, attest_images
    from pipeline.core.digests import parse_ref
    from pipeline.local import sigstore as sigstore_local

    state = root / "sigstore"
    instance = sigstore_local.ensure_running(state)
    endpoints = SigstoreEndpoints.private(instance.url, instance.trusted_root)
    job = sigstore_local.GitHubJob(repository="acme/benchseal", ref=f"refs/tags/{TAG}", sha="0" * 40,
                                   workflow_file="tag.yml")
    session = sigstore_local.open_actions_session(instance, job)
    invocation = BuildInvocation(repository="acme/benchseal", ref=job.ref, commit="0" * 40,
                                 workflow_ref=job.job_workflow_ref,
                                 run_url="https://github.com/acme/benchseal/actions/runs/1/attempts/1")
    signer = ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())
    attest_images({f"image{i}": ref for i, ref in enumerate(images)}, signer, invocation, root / "sboms")
    by_role: dict[str, list[dict[str, str]]] = {"runner": [], "api": []}
    for ref in images:
        parsed = parse_ref(ref)
        role = "api" if parsed.repository.endswith("/api") else "runner"
        entry = {"registry": parsed.registry, "repository": parsed.repository}
        if entry not in by_role[role]:
            by_role[role].append(entry)
    return _policy_file(root, by_role, model_endpoint), endpoints, state


def _policy_file(root: Path, images: dict[str, list[dict[str, str]]], model_endpoint: str | None) -> Any:
    """The shipped infra policy with acme/benchseal (signed by its tag.yml) running ``images``."""
    import yaml

    from pipeline.core.paths import REPO_ROOT

    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [{"repository": "acme/benchseal", "signer": {"workflow": "tag.yml"}, "images": images}]
    if model_endpoint is not None:
        data["suites"]["smoke"]["model"]["endpoint"] = model_endpoint
    root.mkdir(parents=True, exist_ok=True)
    path = root / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


@dataclass
class Sample:
    walls: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    agents: list[float] = field(default_factory=list)
    verifiers: list[float] = field(default_factory=list)
    overheads: list[float] = field(default_factory=list)
    runner_start: list[float] = field(default_factory=list)
    ops: dict[str, list[float]] = field(default_factory=dict)  # op -> seconds per trial (summed per trial)
    counts: dict[str, list[int]] = field(default_factory=dict)
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)


def _ts(value: str) -> datetime:
    # Docker writes nanoseconds; fromisoformat wants at most microseconds.
    import re

    value = re.sub(r"(\.\d{6})\d+", r"\1", value.replace("Z", "+00:00"))
    return datetime.fromisoformat(value)


def runner_variants(registry: str) -> tuple[str, str, str]:
    """(runner as built now, the same runner without bytecode, api), all pushed by digest."""
    from pipeline.imaging.build import as_names, build_images, ensure_base
    from pipeline.imaging.images import assemble, load_image_spec, push_image, source_info
    from pipeline.imaging.layers import BlobStore, build_lock
    from pipeline.imaging.push import Registry

    images = build_images(["runner", "api"], registry)
    spec = load_image_spec("runner")
    plain = replace(spec, layers=tuple({k: v for k, v in layer.items() if k != "bytecode"} for layer in spec.layers))
    bases = ensure_base(registry)
    store = BlobStore()
    names = as_names(registry)
    with build_lock():
        manifest, _, _ = assemble(plain, bases[plain.base], source_info(), store)
        digest = push_image(Registry(names.registry), names.repository("runner"), manifest, store, bases[plain.base], ())
    return images.images["runner"].ref, f"{names.name('runner')}@{digest}", images.images["api"].ref


def _record(sample: Sample, run_dir: Path, outcome: Any, wall: float) -> None:
    import json

    sample.walls.append(wall)
    for trial in outcome.grading.trials:
        if trial.total_seconds is None:
            continue
        a, v = trial.agent_seconds or 0.0, trial.verifier_seconds or 0.0
        sample.totals.append(trial.total_seconds)
        sample.agents.append(a)
        sample.verifiers.append(v)
        sample.overheads.append(trial.total_seconds - a - v)
    # The first batch's runner container (each batch of trials runs in its own).
    batch_states = sorted(run_dir.glob("batches/*/logs/runner-state.json"))
    state = json.loads(batch_states[0].read_text()) if batch_states else {}
    starts = [_ts(json.loads(p.read_text())["started_at"]) for p in (run_dir / "harbor").glob("*/result.json")]
    if starts and state.get("StartedAt"):
        sample.runner_start.append((min(starts) - _ts(state["StartedAt"])).total_seconds())
    for timings in (run_dir / "harbor").glob(f"*/{TIMINGS_FILE}"):
        per_op: dict[str, float] = {}
        per_count: dict[str, int] = {}
        for line in timings.read_text().splitlines():
            item = json.loads(line)
            role = "verifier" if "verifier" in item["session"] else "agent env"
            key = f"{role}: {item['op']}"
            per_op[key] = per_op.get(key, 0.0) + item["seconds"]
            per_count[key] = per_count.get(key, 0) + 1
        for key, seconds in per_op.items():
            sample.ops.setdefault(key, []).append(seconds)
            sample.counts.setdefault(key, []).append(per_count[key])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_real(root: Path, n: int, ablation: bool, version_runs: int, agents: tuple[str, ...] = ("oracle",)) -> None:
    import secrets

    from pipeline.infra.worker.loop import WorkerConfig, run_once
    from pipeline.local import sigstore as sigstore_local
    from pipeline.local.model_server import ModelServer
    from pipeline.runner.tunings import TUNINGS

    now_ref, plain_ref, api = runner_variants("127.0.0.1:5055")
    variants = [Variant("before", plain_ref, prebuild=False, disable=TUNINGS), Variant("now", now_ref)]
    if ablation:
        variants += [Variant("now - bytecode", plain_ref), Variant("now - prebuilt images", now_ref, prebuild=False)]
        variants += [Variant(f"now - {name}", now_ref, disable=(name,)) for name in TUNINGS]
    variants += [Variant(f"now, {agent}", now_ref, agent=agent) for agent in agents if agent != "oracle"]
    server = None
    if any(v.agent != "oracle" for v in variants):
        key = secrets.token_urlsafe(32)
        server = ModelServer(key=key, mode="right", log_path=root / "model-requests.jsonl")
        server.start()
        os.environ[KEY_ENV] = key  # the worker writes it to the runner's 0400 secret file
    policy, trust, sigstore_state = signed_policy(root, [now_ref, plain_ref, api],
                                                  server.base_url if server is not None else None)
    try:
        samples = _run_rounds(root, n, variants, policy, trust, api, WorkerConfig, run_once)
    finally:
        if server is not None:
            server.stop()
            os.environ.pop(KEY_ENV, None)
        sigstore_local.stop(sigstore_state)
    _report(samples, variants, policy, n, now_ref, plain_ref, version_runs)


def _run_rounds(root: Path, n: int, variants: list[Variant], policy: Any, trust: Any, api: str,
                config_cls: Any, run_once: Any) -> dict[str, Sample]:
    db = root / "real" / "queue.sqlite3"
    samples = {v.name: Sample() for v in variants}
    counter = 0
    from pipeline.core.digests import parse_ref
    from pipeline.imaging.build import ensure_local

    for ref in {v.runner for v in variants}:
        ensure_local(parse_ref(ref))  # a pull is not per-trial work
    for round_ in range(-1, n):  # round 0 warms up (task images, page cache) and is not recorded
        for variant in variants:
            counter += 1
            with SqliteQueue(db) as q:
                run_id = q.enqueue(payload(20_000 + counter, variant.runner, api, variant.agent), max_attempts=1)[0]
                run_dir = q.run_dir(run_id)
            config = config_cls(db=db, policy=policy, prebuild_task_images=variant.prebuild,
                                harbor_disable=variant.disable, image_trust=trust)
            t = time.perf_counter()
            outcome = run_once(config)
            wall = time.perf_counter() - t
            assert outcome is not None and outcome.grading is not None and outcome.run_id == run_id, outcome
            assert outcome.state == "SUCCEEDED" and outcome.grading.score == 1.0, (variant, outcome.reason)
            if round_ >= 0:
                _record(samples[variant.name], run_dir, outcome, wall)
            samples[variant.name].rss.append(rss_kib())
            samples[variant.name].fds.append(open_fds())
            print(f"  {'warm-up' if round_ < 0 else f'round {round_ + 1}'} {variant.name:<26} run wall {wall:6.1f} s",
                  flush=True)
    return samples


def _report(samples: dict[str, Sample], variants: list[Variant], policy: Any, n: int, now_ref: str, plain_ref: str,
            version_runs: int) -> None:
    before = samples["before"]
    print(f"\nreal runs: {n} per variant, interleaved; smoke suite, oracle, {policy.trial_concurrency('smoke')} trials at once "
          "in one runner container per run (medians)")
    print(f"{'variant':<26}{'run wall':>9}{'trial':>8}{'agent':>8}{'verif.':>8}{'harbor ovh':>11}{'share':>7}"
          f"{'runner->1st':>12}{'ovh/before':>11}")
    for name, smp in samples.items():
        ovh = _median(smp.overheads)
        print(f"{name:<26}{_median(smp.walls):>9.1f}{_median(smp.totals):>8.2f}{_median(smp.agents):>8.2f}"
              f"{_median(smp.verifiers):>8.2f}{ovh:>11.2f}{ovh / _median(smp.totals):>7.0%}"
              f"{_median(smp.runner_start):>12.2f}{ovh / _median(before.overheads):>11.2f}")
    print("\nwhere a trial's Harbor time goes (median seconds per trial, and operations per trial):")
    keys = sorted({k for smp in samples.values() for k in smp.ops})
    shown = [v.name for v in variants[:2]] + [v.name for v in variants if v.agent != "oracle"]
    print(f"{'':<28}" + "".join(f"{name:>18}" for name in shown))
    for key in keys:
        cells = []
        for name in shown:
            smp = samples[name]
            if key in smp.ops:
                cells.append(f"{_median(smp.ops[key]):>12.2f} x{int(_median([float(c) for c in smp.counts[key]])):<4}")
            else:
                cells.append(f"{'-':>18}")
        print(f"{key:<28}" + "".join(cells))

    now = samples["now"]
    version = bench_version(now_ref, plain_ref, version_runs)
    print("\nthe issue's figures for the worker (before = same run, old configuration):")
    rows = [
        ("Harbor overhead per trial (s)", _median(before.overheads), _median(now.overheads), "overhead"),
        ("harness overhead share of trial wall", _median(before.overheads) / _median(before.totals),
         _median(now.overheads) / _median(now.totals), "share"),
        ("runner start to first trial (s)", _median(before.runner_start), _median(now.runner_start), "runner_start"),
        ("harbor --version in the runner (s)", version[1], version[0], "runner_start"),
    ]
    print(f"{'figure':<40}{'before':>9}{'now':>9}{'now/before':>11}{'target':>9}  met")
    for label, old, new, target in rows:
        fmt = (lambda x: f"{x:.0%}") if target == "share" else (lambda x: f"{x:.2f}")
        goal = TARGETS[target]
        print(f"{label:<40}{fmt(old):>9}{fmt(new):>9}{new / old:>11.2f}{'<= ' + fmt(goal):>9}  "
              f"{'yes' if new <= goal else 'NO'}")
    print(f"  RSS KiB after each real run: {[x for smp in samples.values() for x in smp.rss]}; "
          f"open FDs: {[x for smp in samples.values() for x in smp.fds]}")
    agent_rows = [v for v in variants if v.agent != "oracle"]
    if agent_rows:
        print("\nper-trial harness overhead by agent (same runner 'now', same rounds, medians; "
              "terminus-2 against the scripted model):")
        print(f"{'agent':<14}{'trial':>8}{'agent':>8}{'verif.':>8}{'harbor ovh':>11}{'share':>7}{'ovh/oracle':>11}"
              f"{'trial/oracle':>13}")
        oracle = samples["now"]
        for name, label in [("now", "oracle")] + [(v.name, v.agent) for v in agent_rows]:
            smp = samples[name]
            ovh = _median(smp.overheads)
            print(f"{label:<14}{_median(smp.totals):>8.2f}{_median(smp.agents):>8.2f}{_median(smp.verifiers):>8.2f}"
                  f"{ovh:>11.2f}{ovh / _median(smp.totals):>7.0%}{ovh / _median(oracle.overheads):>11.2f}"
                  f"{_median(smp.totals) / _median(oracle.totals):>13.2f}")


def bench_version(now_ref: str, plain_ref: str, n: int) -> tuple[float, float]:
    """Median wall time of `docker run --entrypoint harbor REF --version` (container start + import), (now, before)."""
    import subprocess

    from pipeline.core.digests import parse_ref
    from pipeline.imaging.build import ensure_local

    walls: dict[str, list[float]] = {now_ref: [], plain_ref: []}
    inside: dict[str, list[float]] = {now_ref: [], plain_ref: []}
    probe = ("import subprocess, time\nt = time.perf_counter()\n"
             "subprocess.run(['harbor', '--version'], check=True, capture_output=True)\nprint(time.perf_counter() - t)")
    for ref in walls:
        ensure_local(parse_ref(ref))
    for _ in range(n):
        for ref in walls:
            t = time.perf_counter()
            subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "harbor", ref, "--version"],
                           check=True, capture_output=True)
            walls[ref].append(time.perf_counter() - t)
            out = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", probe],
                                 check=True, capture_output=True, text=True)
            inside[ref].append(float(out.stdout.strip()))
    now_wall, plain_wall = _median(walls[now_ref]), _median(walls[plain_ref])
    print(f"\nharbor --version, {n} runs each, interleaved (median s): docker run wall: with bytecode {now_wall:.2f}, "
          f"without {plain_wall:.2f} (ratio {now_wall / plain_wall:.2f}); inside the container: with "
          f"{_median(inside[now_ref]):.2f}, without {_median(inside[plain_ref]):.2f} "
          f"(ratio {_median(inside[now_ref]) / _median(inside[plain_ref]):.2f})")
    return now_wall, plain_wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue-n", type=int, default=1000)
    parser.add_argument("--cheap-runs", type=int, default=50)
    parser.add_argument("--real-runs", type=int, default=3, help="real runs per variant")
    parser.add_argument("--ablation", action="store_true", help="also 'now' minus each single change")
    parser.add_argument("--version-runs", type=int, default=5)
    parser.add_argument("--agents", default="oracle,terminus-2",
                        help="agents whose per-trial overhead is compared with oracle's (comma-separated)")
    args = parser.parse_args()
    agents = tuple(a.strip() for a in args.agents.split(",") if a.strip())
    unknown = sorted(set(agents) - set(load_policy().agent_names))
    if unknown:
        parser.error(f"--agents: not in the infra policy: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        root = Path(tmp)
        bench_queue(root, args.queue_n)
        bench_cheap_worker(root, args.cheap_runs)
        if args.real_runs:
            bench_real(root, args.real_runs, args.ablation, args.version_runs, agents)


if __name__ == "__main__":
    main()
