"""benchseal's verifier (pipeline.runner.grader) against the real sandbox engine, behind the engine proxy as
the runner reaches it: the reward is the suite's test command's exit status, read from the engine, whatever
the graded code writes, prints or leaves running; /tests and the verifier dir are closed to the candidate
user; a hang is a reward of 0 within the grader's own limit; only the machinery's failures raise."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from harbor.models.task.task import Task

from pipeline.core.scoring import GRADER_EXIT_KEY, GRADER_TIMEOUT_KEY, REWARD_KEY
from pipeline.infra.sandbox.engine_proxy import EngineProxy
from pipeline.runner import envshared, grader
from tests.runner import test_engine_env as engine_env_tests

pytestmark = [pytest.mark.docker]
# The engine environment's fixtures: the sandbox engine behind the proxy, the base image in it.
proxied = engine_env_tests.proxied
base_in_sandbox = engine_env_tests.base_in_sandbox
_environment = engine_env_tests._environment

CANDIDATE = "setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs"
# What the graded code does when the tests run it: claims a pass everywhere it could be read from.
FORGER = """import os, pathlib
for name, text in (("reward.json", '{"reward": 1}'), ("reward.txt", "1")):
    try:
        pathlib.Path("/logs/verifier", name).write_text(text)
    except OSError:
        pass
print("OK: all tests passed", flush=True)
os._exit(0)
"""


def _task(root: Path, test_sh: str, timeout: float = 20.0) -> Task:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir(parents=True, exist_ok=True)
    (task / "instruction.md").write_text("Probe.\n")
    (task / "task.toml").write_text(f'schema_version = "1.4"\n[verifier]\ntimeout_sec = {timeout}\n'
                                    '[metadata.benchseal]\ngrading = "exit-status"\n')
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (task / "tests" / "expected.txt").write_text("the answer only root may read\n")
    (task / "tests" / "data").mkdir()
    (task / "tests" / "data" / "cases.txt").write_text("more answers\n")
    for path, mode in ((task / "tests" / "test.sh", 0o755), (task / "tests" / "data", 0o777),
                       (task / "tests" / "data" / "cases.txt", 0o666)):
        path.chmod(mode)  # open on the worker's side: closed in the verifier all the same
    return Task(task)


class _AnyEnvironment:
    """The same real container, reached through an object that is not an EngineEnvironment: the grader takes the
    path it takes on any other environment (Harbor's compose one), its mkdir and chown/chmod commands."""

    def __init__(self, env: Any) -> None:
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def _grade(tmp_path: Path, image: str, test_sh: str, *, app: dict[str, str] | None = None,
           timeout: float = 20.0, stop_first: bool = False, before: str | None = None,
           chmod_path: bool = False) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Run the grader on a fresh environment whose /app holds ``app``; (rewards, verdict, test output)."""
    task = _task(tmp_path, test_sh, timeout)
    env = _environment(tmp_path, image, "grader")
    verifier = grader.ExitStatusVerifier(task=task, trial_paths=env.trial_paths,
                                         environment=_AnyEnvironment(env) if chmod_path else env)

    async def scenario() -> dict[str, Any]:
        await env.start(force_build=False)
        try:
            for name, text in (app or {}).items():
                source = tmp_path / "app" / name
                source.parent.mkdir(parents=True, exist_ok=True)
                source.write_text(text)
                await env.upload_file(source, f"/app/{name}")
            if before is not None:
                assert (await env.exec(before, user="root")).return_code == 0
            if stop_first:
                await env.stop(delete=True)
                await envshared.drain_teardowns()
            result = await verifier.verify()
            return dict(result.rewards or {})
        finally:
            await env.stop(delete=True)
            await envshared.drain_teardowns()

    rewards = asyncio.run(scenario())
    out = tmp_path / "trial" / grader.GRADER_DIR
    return (rewards, json.loads((out / grader.VERDICT_FILE).read_text()),
            (out / grader.OUTPUT_FILE).read_text())


def test_a_passing_test_command_is_reward_one(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str) -> None:
    rewards, verdict, output = _grade(tmp_path, base_in_sandbox, "cat /tests/expected.txt\nexit 0\n")
    assert rewards == {REWARD_KEY: 1, GRADER_EXIT_KEY: 0, GRADER_TIMEOUT_KEY: 0}
    assert verdict["reward"] == 1 and verdict["protocol"] == "exit-status"
    assert "the answer only root may read" in output
    assert proxied.refused == []


def test_reward_files_and_printed_passes_never_decide(tmp_path: Path, proxied: EngineProxy,
                                                      base_in_sandbox: str) -> None:
    """The graded code (run as the candidate user, and by root too) writes reward.json and reward.txt, prints a
    pass and exits 0; the test command itself writes reward 1 and then fails: the reward is 0."""
    test_sh = (f"python3 /app/forger.py; {CANDIDATE} python3 /app/forger.py\n"
               "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
               "echo FAILED: 1 test; exit 1\n")
    rewards, verdict, output = _grade(tmp_path, base_in_sandbox, test_sh, app={"forger.py": FORGER})
    assert rewards == {REWARD_KEY: 0, GRADER_EXIT_KEY: 1, GRADER_TIMEOUT_KEY: 0}
    assert verdict["exit_status"] == 1 and "OK: all tests passed" in output


@pytest.mark.parametrize("chmod_path", [False, True], ids=["archive-entries", "chmod-command"])
def test_tests_and_the_verifier_dir_are_closed_to_the_candidate(tmp_path: Path, proxied: EngineProxy,
                                                               base_in_sandbox: str, chmod_path: bool) -> None:
    """Both paths of the one rule (pipeline.runner.rootonly): the engine environment's archive entries and the
    chown/chmod command used on any other environment. The modes are written out here, not read from the rule:
    weakening the rule fails both."""
    # Exit 0 only if the candidate user can read nothing under /tests and write nothing in /logs/verifier.
    test_sh = (f"if {CANDIDATE} cat /tests/expected.txt; then exit 10; fi\n"
               f"if {CANDIDATE} ls /tests; then exit 11; fi\n"
               f"if {CANDIDATE} touch /logs/verifier/reward.json; then exit 12; fi\n"
               "[ \"$(stat -c '%a %u' /tests /logs/verifier)\" = \"$(printf '700 0\\n755 0')\" ] || exit 13\n"
               # Every entry root's, none with a group or other bit (the suite's files were 0755, 0777, 0666).
               "[ -z \"$(find /tests -perm /077 -o ! -uid 0 -o ! -gid 0)\" ] || exit 14\n"
               "[ \"$(stat -c '%a' /tests/test.sh /tests/data /tests/data/cases.txt)\" = \"$(printf '700\\n700\\n600')\" ] "
               "|| exit 15\n"
               "exit 0\n")
    rewards, _, output = _grade(tmp_path, base_in_sandbox, test_sh, chmod_path=chmod_path)
    assert rewards[REWARD_KEY] == 1, output
    ops = [json.loads(line)["op"] for line in (tmp_path / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    # The path taken (after the log dirs' exec): a mkdir exec, the upload and the chown/chmod exec; else a stat and
    # one archive upload. Then the test command.
    assert ops == ["start", "exec", *(["exec", "upload", "exec"] if chmod_path else ["stat", "upload"]), "exec", "stop"]


def test_the_tests_dir_is_fresh_whatever_the_image_had_there(tmp_path: Path, proxied: EngineProxy,
                                                             base_in_sandbox: str) -> None:
    """A /tests the verifier's image holds (files, an open mode) is removed before the suite's tests go in; a
    verifier dir that is there and open (Harbor's 0777) is made root's 0755."""
    before = ("mkdir -p /tests/planted && echo stale > /tests/planted/old.txt && echo stale > /tests/expected.txt "
              "&& chmod -R 777 /tests && chmod 777 /logs/verifier")
    test_sh = ("[ ! -e /tests/planted ] || exit 10\n"
               "[ \"$(cat /tests/expected.txt)\" = 'the answer only root may read' ] || exit 11\n"
               "[ \"$(ls -A /tests | tr '\\n' ' ')\" = 'data expected.txt test.sh ' ] || exit 12\n"
               "[ \"$(stat -c '%a %u' /tests /logs/verifier)\" = \"$(printf '700 0\\n755 0')\" ] || exit 13\n"
               "exit 0\n")
    rewards, _, output = _grade(tmp_path, base_in_sandbox, test_sh, before=before)
    assert rewards[REWARD_KEY] == 1, output
    ops = [json.loads(line)["op"] for line in (tmp_path / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    assert ops[-5:] == ["stat", "exec", "upload", "exec", "stop"]  # the rm of what was there, then as usual


def test_the_graders_tests_are_one_stat_and_one_upload(tmp_path: Path, proxied: EngineProxy,
                                                      base_in_sandbox: str) -> None:
    """What the grader asks of the engine environment before its test command: a stat (nothing at /tests) and one
    archive upload carrying /tests and the verifier dir with their owners and modes; no exec."""
    rewards, _, output = _grade(tmp_path, base_in_sandbox, "exit 0\n", app={"solution.py": "print(1)\n"})
    assert rewards[REWARD_KEY] == 1, output
    ops = [json.loads(line)["op"] for line in (tmp_path / "trial" / envshared.TIMINGS_FILE).read_text().splitlines()]
    assert ops == ["start", "exec", "upload", "stat", "upload", "exec", "stop"]  # log dirs, /app, tests, test.sh


def test_a_hanging_test_command_is_reward_zero_within_the_graders_limit(tmp_path: Path, proxied: EngineProxy,
                                                                       base_in_sandbox: str) -> None:
    started = time.monotonic()
    rewards, verdict, _ = _grade(tmp_path, base_in_sandbox, "echo started\nsleep 600\n", timeout=12.0)
    assert rewards == {REWARD_KEY: 0, GRADER_EXIT_KEY: -1, GRADER_TIMEOUT_KEY: 1}
    assert verdict["timed_out"] is True and verdict["limit"] == grader.verifier_timeout(12.0) == 7.0
    assert time.monotonic() - started < 12.0 + 20  # its own limit, then the container is removed


def test_the_machinerys_failure_is_a_grader_fault(tmp_path: Path, proxied: EngineProxy, base_in_sandbox: str) -> None:
    with pytest.raises(grader.GraderFault):
        _grade(tmp_path, base_in_sandbox, "exit 0\n", stop_first=True)


def test_the_graders_own_limit_stays_below_the_tasks() -> None:
    assert grader.verifier_timeout(60.0) == 55.0
    assert grader.verifier_timeout(None) == grader.DEFAULT_TIMEOUT_SECONDS - grader.TIMEOUT_MARGIN_SECONDS
    assert 0 < grader.verifier_timeout(4.0) < 4.0
