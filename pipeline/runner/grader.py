"""benchseal's verifier: the reward comes from the grader, never from the graded.

Harbor 0.26's own verifier (``harbor.verifier.verifier.Verifier``) runs ``tests/test.sh`` and then
trusts whatever ``/logs/verifier/reward.json`` (else ``reward.txt``) holds. That directory is a
bind mount of the trial dir, writable in the agent's container and in the verifier's, so code the
agent left behind (imported by the tests, a background process, a file written during the agent
phase) decides its own reward; the test command's exit status is never looked at.

This verifier, given to every trial as Harbor's ``verifier.import_path``, reads no reward file:

1. the tests are uploaded from the suite (the worker's rendered copy, which no agent reaches) into
   a fresh ``/tests``, owned by root and closed to everyone else (``chmod -R go-rwx``): code run as
   the candidate user cannot read the expected answers;
2. ``/logs/verifier`` is made root's and not writable by others (the candidate cannot plant files
   in the trial dir through it). On benchseal's engine environment 1 and 2 are one archive upload
   whose entries carry the owner and modes (``EngineEnvironment.upload_root_only``), after a stat
   (and an ``rm -rf`` only when the image has a ``/tests``); elsewhere a mkdir exec, the upload and
   a chown/chmod exec. Both apply the one rule in ``pipeline.runner.rootonly``;
3. ``bash /tests/test.sh`` runs as root with the task's verifier env and a timeout of its own,
   shorter than Harbor's (so a hang is this verifier's verdict, not Harbor's exception);
4. the result is the test command's **exit status, read from the engine** (exec inspect, outside
   the container): 0 -> reward 1, anything else, or the timeout -> reward 0. Output goes to
   ``grader/test-output.txt`` in the trial dir, which is mounted into no container.

A task declares that its ``tests/test.sh`` reports by exit status (``[metadata.benchseal] grading =
"exit-status"``, checked before any trial by ``pipeline.runner.plan.task_grading``). Tests that run
the agent's code do so in a separate process as an unprivileged user (the smoke suite's
``setpriv --reuid 65534``): a process that imports the agent's code can be made to exit 0 by it.

Only failures of the machinery (the engine refusing an upload or an exec) raise, as
``GraderFault``: the grader counts that trial as an infrastructure error. Whatever the agent's
artifacts cause (failing tests, a crash, a hang) is a reward of 0.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult
from harbor.models.trial.paths import EnvironmentPaths
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.base import BaseVerifier

from pipeline.core.scoring import GRADER_EXIT_KEY, GRADER_TIMEOUT_KEY, REWARD_KEY
from pipeline.runner import rootonly
from pipeline.runner.engine_env import EngineEnvironment

IMPORT_PATH = "pipeline.runner.grader:ExitStatusVerifier"
GRADER_DIR = "grader"  # in the trial dir; never bind-mounted into a container
OUTPUT_FILE = "test-output.txt"
VERDICT_FILE = "verdict.json"
MAX_OUTPUT_BYTES = 1_000_000
# This verifier's own limit is the task's verifier timeout less this margin; Harbor's limit (the
# full timeout) then only fires if the engine itself stops answering.
TIMEOUT_MARGIN_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 600.0
ROOT = "root"


class GraderFault(RuntimeError):
    """The grading machinery failed (engine, upload): an infrastructure error, never the agent's."""


def verifier_timeout(task_timeout: float | None) -> float:
    """This verifier's limit for a task whose ``[verifier] timeout_sec`` is ``task_timeout``."""
    limit = task_timeout if task_timeout and task_timeout > 0 else DEFAULT_TIMEOUT_SECONDS
    return max(1.0, limit - TIMEOUT_MARGIN_SECONDS) if limit > 2 * TIMEOUT_MARGIN_SECONDS else max(0.5, limit / 2)


class ExitStatusVerifier(BaseVerifier):  # type: ignore[misc]  # Harbor ships no type information
    """See the module docstring."""

    async def verify(self) -> VerifierResult:
        env_paths = EnvironmentPaths.for_os(self.environment.os)
        tests = str(env_paths.tests_dir)
        verifier_dir = str(env_paths.verifier_dir)
        if isinstance(self.environment, EngineEnvironment):
            # The same /tests and verifier dir in one archive upload, its entries carrying the rule's owner and modes.
            try:
                await self.environment.upload_root_only(self.task.paths.tests_dir, tests, (verifier_dir,))
            except (asyncio.CancelledError, TimeoutError):
                raise
            except Exception as exc:
                raise GraderFault(f"uploading the suite's tests failed: {type(exc).__name__}: {exc}") from exc
        else:
            await self._as_root(f"rm -rf {tests} && mkdir -p {tests} {verifier_dir}", "preparing /tests")
            try:
                await self.environment.upload_dir(source_dir=self.task.paths.tests_dir, target_dir=tests)
            except Exception as exc:
                raise GraderFault(f"uploading the suite's tests failed: {type(exc).__name__}: {exc}") from exc
            await self._as_root(rootonly.close_command(tests, verifier_dir), "closing /tests")
        limit = verifier_timeout(self.task.config.verifier.timeout_sec)
        env = {**self.task.config.verifier.env, **(self.verifier_env or {}), **self.override_env} or None
        started = time.monotonic()
        timed_out = False
        result: ExecResult | None = None
        try:
            result = await asyncio.wait_for(
                self._exec(f"bash {tests}/test.sh", env=env), timeout=limit)
        except TimeoutError:
            timed_out = True
        exit_status = -1 if result is None else int(result.return_code)
        passed = not timed_out and exit_status == 0
        self._record(result, exit_status=exit_status, timed_out=timed_out, limit=limit,
                     seconds=time.monotonic() - started, reward=1 if passed else 0)
        return VerifierResult(rewards={REWARD_KEY: 1 if passed else 0, GRADER_EXIT_KEY: exit_status,
                                       GRADER_TIMEOUT_KEY: 1 if timed_out else 0})

    async def _exec(self, command: str, *, env: dict[str, str] | None = None) -> ExecResult:
        try:
            result: ExecResult = await self.environment.exec(command=command, env=env, user=ROOT)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as exc:
            raise GraderFault(f"running {command.split()[0]} in the verifier environment failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        return result

    async def _as_root(self, command: str, what: str) -> None:
        result = await self._exec(command)
        if result.return_code != 0:
            raise GraderFault(f"{what} failed (exit {result.return_code}): "
                              f"{(result.stderr or result.stdout or '').strip()[:300]}")

    def _record(self, result: ExecResult | None, **verdict: Any) -> None:
        """The test command's output and the verdict, beside (never inside) the mounted verifier dir."""
        out = Path(self.trial_paths.trial_dir) / GRADER_DIR
        out.mkdir(parents=True, exist_ok=True)
        text = "" if result is None else (result.stdout or "") + (result.stderr or "")
        data = text.encode("utf-8", "replace")
        if len(data) > MAX_OUTPUT_BYTES:
            data = data[:MAX_OUTPUT_BYTES // 2] + b"\n[... cut ...]\n" + data[-MAX_OUTPUT_BYTES // 2:]
        (out / OUTPUT_FILE).write_bytes(data)
        # Where Harbor's own verifier leaves the test output (its viewer reads it): written here, after the
        # verifier environment is done with, never downloaded from it.
        stdout_path = Path(self.trial_paths.test_stdout_path)
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        stdout_path.write_bytes(data)
        (out / VERDICT_FILE).write_text(json.dumps({"protocol": "exit-status", **verdict,
                                                    "seconds": round(float(verdict["seconds"]), 3)}, sort_keys=True),
                                        encoding="utf-8")
