"""The runner's lookahead (``trial.LOOKAHEAD``, the "prestart" tuning): a trial waiting for a slot has its agent
environment started already, by the environment's own ``start`` (``EngineEnvironment.prestart``), so a freed slot's
next trial finds its container up. What must hold: the same container as ever (one start, one stop per environment,
``test_trial_operations`` pins the rest), never more than LOOKAHEAD idle, and nothing left behind by a trial that
never got its slot or whose early start failed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import docker
import pytest

from pipeline.infra.sandbox.engine_proxy import LABEL, EngineProxy
from pipeline.runner import engine_env, envshared, trial
from pipeline.runner.plan import plan_trials
from pipeline.runner.trial import create_trial, run_suite
from pipeline.runner.tunings import DISABLE_ENV
from tests.fixtures.infra import sandbox_engine
from tests.runner import test_engine_env as engine_env_tests

pytestmark = [pytest.mark.docker]
proxied = engine_env_tests.proxied
base_in_sandbox = engine_env_tests.base_in_sandbox

REPO = Path(__file__).resolve().parents[2]
TASK = "humaneval-0"
_NAME = re.compile(r"name=([^&]+)")


def _suite(tmp_path: Path, image: str, solve: str | None = None) -> Path:
    """HumanEval/0 as the importer wrote it, its image the base (as in test_trial_operations); ``solve``: the
    oracle's script instead of the real one."""
    suite = tmp_path / "suite"
    shutil.copytree(REPO / "suites" / "humaneval" / TASK, suite / TASK)
    toml = suite / TASK / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", f'[environment]\ndocker_image = "{image}"\n'))
    if solve is not None:
        (suite / TASK / "solution" / "solve.sh").write_text(solve)
    return suite


def _creates(proxied: EngineProxy, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the containers created through the proxy, in order (a live list)."""
    names: list[str] = []
    forward = proxied._forward

    def counted(peer: Any, request: Any, *args: Any) -> None:
        if request.method == "POST" and request.path == "/containers/create":
            match = _NAME.search(request.target)
            names.append(match.group(1) if match else "")
        forward(peer, request, *args)

    monkeypatch.setattr(proxied, "_forward", counted)
    return names


async def _environment(suite: Path, trials_dir: Path, trial_name: str) -> engine_env.EngineEnvironment:
    """The agent environment Harbor's trial of ``suite``'s task makes (as ``run_suite`` creates the trial)."""
    made = await create_trial(trial._trial_config(suite / TASK, trials_dir, trial_name, "oracle", ()))
    environment = made.agent_environment
    assert isinstance(environment, engine_env.EngineEnvironment)
    return environment


def _one_trial(tmp_path: Path) -> tuple[str, Path]:
    """A planned trial's name and the trials dir it writes into."""
    [spec] = plan_trials("run-" + os.urandom(10).hex(), [TASK])
    trials_dir = tmp_path / "out" / "harbor"
    trials_dir.mkdir(parents=True)
    return spec.trial_name, trials_dir


def _left(token: str, *, running: bool = False) -> list[str]:
    """Containers the proxy (``token``: its policy's) made that the sandbox engine still has (running ones only)."""
    api = sandbox_engine().api
    return [c["Id"] for c in api.containers(all=not running, filters={"label": f"{LABEL}={token}"})]


def test_the_next_trials_agent_environment_starts_before_the_slot_frees(tmp_path: Path, proxied: EngineProxy,
                                                                       base_in_sandbox: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot, three trials: the second and third trials' agent containers are created (in whatever order: the
    three starts run side by side) before the first trial's verifier container (its last one), and every trial still scores 1 with one start and one stop per environment."""
    suite = _suite(tmp_path, base_in_sandbox)
    names = _creates(proxied, monkeypatch)
    out = tmp_path / "out"
    specs = run_suite(suite, out, run_id="run-" + os.urandom(10).hex(), agent="oracle", concurrency=1, attempts=3)
    assert len(specs) == 3 and trial.LOOKAHEAD == 2
    agents = [next(i for i, n in enumerate(names) if n.startswith(s.trial_name.lower()) and "verifier" not in n)
              for s in specs]
    first_verifier = next(i for i, n in enumerate(names) if n.startswith(specs[0].trial_name.lower()) and "verifier" in n)
    assert max(agents) < first_verifier, names
    for spec in specs:
        result = json.loads((out / "harbor" / spec.trial_name / "result.json").read_text())
        assert result["exception_info"] is None and result["verifier_result"]["rewards"]["reward"] == 1
        ops = [json.loads(line)["op"] for line in (out / "harbor" / spec.trial_name / "env-timings.jsonl").read_text().splitlines()]
        assert ops.count("start") == 2 and ops.count("stop") == 2, ops
    assert len(names) == 6 and _left(proxied.policy.token) == []


def test_without_the_tuning_a_trial_starts_its_environment_in_its_slot(tmp_path: Path, proxied: EngineProxy,
                                                                       base_in_sandbox: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, base_in_sandbox)
    names = _creates(proxied, monkeypatch)
    monkeypatch.setenv(DISABLE_ENV, "prestart")
    specs = run_suite(suite, tmp_path / "out", run_id="run-" + os.urandom(10).hex(), agent="oracle", concurrency=1,
                      attempts=2)
    order = [next(s.trial_name for s in specs if n.startswith(s.trial_name.lower())) for n in names]
    assert order == [specs[0].trial_name] * 2 + [specs[1].trial_name] * 2, names


def test_a_trial_cancelled_while_waiting_for_its_slot_leaves_no_container(tmp_path: Path, proxied: EngineProxy,
                                                                          base_in_sandbox: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The first trial's agent sleeps in its slot; once the second trial's container is up (started ahead), the run
    is cancelled: both containers go, the idle one included."""
    suite = _suite(tmp_path, base_in_sandbox, solve="#!/bin/bash\nsleep 120\n")
    names = _creates(proxied, monkeypatch)
    specs = plan_trials("run-" + os.urandom(10).hex(), [TASK], attempts=2)
    trials_dir = tmp_path / "out" / "harbor"
    trials_dir.mkdir(parents=True)

    async def scenario() -> None:
        run = asyncio.create_task(trial._run_all(suite, trials_dir, specs, "oracle", (), concurrency=1))
        while len(names) < 2 or len(_left(proxied.policy.token, running=True)) < 2:  # both agent containers up
            await asyncio.sleep(0.05)
            assert not run.done(), names
        # The first trial's, its agent asleep; the second's, idle, waiting for the slot.
        assert len(_left(proxied.policy.token, running=True)) == 2
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(scenario())
    assert [n.split("__")[0] for n in names] == [TASK, TASK]
    assert _left(proxied.policy.token) == []


def test_an_early_start_that_fails_says_why_at_harbors_start_and_stop_still_works(tmp_path: Path, proxied: EngineProxy,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An image the engine does not have: the start begun ahead fails in the background; Harbor's start raises the
    environment's own EngineFault naming the engine's answer; a start with another force_build is refused; stop
    removes nothing and raises nothing."""
    suite = _suite(tmp_path, "benchseal-tests/absent@sha256:" + "0" * 64)
    trial_name, trials_dir = _one_trial(tmp_path)

    async def scenario() -> None:
        environment = await _environment(suite, trials_dir, trial_name)
        environment.prestart(force_build=False)
        environment.prestart(force_build=False)  # once: a second call starts nothing more
        with pytest.raises(engine_env.EngineFault, match=r"starting the environment .* failed: .*(No such image|404)"):
            await environment.start(force_build=False)
        with pytest.raises(engine_env.EngineFault, match="started ahead with force_build=False"):
            await environment.start(force_build=True)
        await environment.stop(delete=True)
        await envshared.drain_teardowns()

    asyncio.run(scenario())
    assert _left(proxied.policy.token) == []
    with pytest.raises(docker.errors.ImageNotFound):
        sandbox_engine().api.inspect_image("benchseal-tests/absent@sha256:" + "0" * 64)


def test_a_stop_right_after_the_early_start_began_removes_what_it_made(tmp_path: Path, proxied: EngineProxy,
                                                                       base_in_sandbox: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """stop() while the start begun ahead is still getting its image (a task's Dockerfile build takes that long; a
    pause stands for it here), before it has made anything: stop waits for that start and removes its container
    (else the container would be made after the removal, and left). The stat is the log dirs' parent's, part of
    the start."""
    image_of = engine_env.EngineEnvironment._image

    async def slow_image(self: engine_env.EngineEnvironment, force_build: bool) -> str:
        await asyncio.sleep(0.3)
        return str(await image_of(self, force_build))

    monkeypatch.setattr(engine_env.EngineEnvironment, "_image", slow_image)
    suite = _suite(tmp_path, base_in_sandbox)
    trial_name, trials_dir = _one_trial(tmp_path)

    async def scenario() -> None:
        environment = await _environment(suite, trials_dir, trial_name)
        environment.prestart(force_build=False)
        await environment.stop(delete=True)
        await envshared.drain_teardowns()

    asyncio.run(scenario())
    ops = [json.loads(line)["op"] for line in (trials_dir / trial_name / "env-timings.jsonl").read_text().splitlines()]
    assert ops == ["stat", "start", "stop"] and _left(proxied.policy.token) == []
