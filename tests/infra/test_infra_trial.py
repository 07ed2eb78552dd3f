"""The trial driver's knobs and the worker's task-image pinning (no engine needed)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import task_trial_names, trial_name
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.queue.sql import TrialClaim
from pipeline.infra.worker import containers
from pipeline.infra.worker.loop import _pin_docker_image, _task_context_hash, batch_attempts
from pipeline.runner.tunings import DISABLE_ENV, TUNINGS, enabled_tunings

IMAGE_ID = "sha256:" + "ab" * 32


def test_every_tuning_is_on_unless_disabled_by_name() -> None:
    assert enabled_tunings({}) == frozenset(TUNINGS)
    assert enabled_tunings({DISABLE_ENV: "async-stop, no-predown"}) == frozenset(TUNINGS) - {"async-stop", "no-predown"}
    assert enabled_tunings({DISABLE_ENV: ",".join(TUNINGS)}) == frozenset()


@pytest.mark.parametrize("value", ["asyncstop", "async-stop,bogus", "ASYNC-STOP", "no-chown"])
def test_an_unknown_tuning_name_is_a_usage_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ValidationError, match=DISABLE_ENV):
        enabled_tunings({DISABLE_ENV: value})


def _policy_with(tmp_path: Path, suite: dict[str, object]) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["suites"] = {"smoke": {"dataset": data["suites"]["smoke"]["dataset"], **suite}}
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_trial_concurrency_comes_from_the_policy(tmp_path: Path) -> None:
    assert load_policy().trial_concurrency("smoke") == 4
    assert load_policy(_policy_with(tmp_path, {"timeout_seconds": 60})).trial_concurrency("smoke") == 3
    assert load_policy(_policy_with(tmp_path, {"timeout_seconds": 60, "trial_concurrency": 7})).trial_concurrency("smoke") == 7


@pytest.mark.parametrize("bad", [0, -1, 17, "3", 2.5])
def test_trial_concurrency_out_of_range_is_rejected(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValidationError, match="trial_concurrency"):
        load_policy(_policy_with(tmp_path, {"timeout_seconds": 60, "trial_concurrency": bad}))


def test_pin_adds_docker_image_to_the_environment_table(tmp_path: Path) -> None:
    toml = tmp_path / "task.toml"
    toml.write_text('[task]\nname = "x"\n\n[environment]\ncpus = 1\n\n[verifier]\ntimeout_sec = 5.0\n')
    _pin_docker_image(toml, IMAGE_ID)
    data = tomllib.loads(toml.read_text())
    assert data["environment"] == {"docker_image": IMAGE_ID, "cpus": 1}
    assert data["verifier"] == {"timeout_sec": 5.0}


def test_pin_creates_the_environment_table_when_absent(tmp_path: Path) -> None:
    toml = tmp_path / "task.toml"
    toml.write_text('[task]\nname = "x"')
    _pin_docker_image(toml, IMAGE_ID)
    assert tomllib.loads(toml.read_text())["environment"] == {"docker_image": IMAGE_ID}


def test_task_context_hash_covers_names_contents_and_exec_bits(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM x\n")
    (env / "a.py").write_text("A = 1\n")
    first = _task_context_hash(env)
    (env / "a.py").chmod(0o755)
    second = _task_context_hash(env)
    (env / "a.py").chmod(0o644)
    assert _task_context_hash(env) == first != second
    (env / "a.py").rename(env / "b.py")
    assert _task_context_hash(env) != first
    (env / "link").symlink_to("/etc/passwd")
    with pytest.raises(CheckFailed, match="symlink"):
        _task_context_hash(env)


# --- attempts: trials per task (issue 26.2) -------------------------------------------------------

def test_attempts_come_from_the_policy(tmp_path: Path) -> None:
    assert load_policy().task_attempts("smoke") == 1  # the shipped policy: one trial per task, as before
    assert load_policy(_policy_with(tmp_path, {"timeout_seconds": 60})).task_attempts("smoke") == 1
    for n in (1, 3, 10):
        assert load_policy(_policy_with(tmp_path, {"timeout_seconds": 60, "attempts": n})).task_attempts("smoke") == n


@pytest.mark.parametrize(("bad", "rule"), [(0, "greater than or equal to 1"), (-2, "greater than or equal to 1"),
                                           (11, "less than or equal to 10"), ("3", "valid integer"),
                                           (2.0, "valid integer"), (True, "valid integer"), (None, "valid integer")])
def test_bad_attempts_are_refused_naming_the_suite(tmp_path: Path, bad: object, rule: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_policy(_policy_with(tmp_path, {"timeout_seconds": 60, "attempts": bad}))
    assert caught.value.field == "policy infra.yaml: suites.smoke.attempts", caught.value.field
    assert rule in caught.value.rule, caught.value.rule


def test_bad_attempts_exit_2_in_one_line(tmp_path: Path) -> None:
    path = _policy_with(tmp_path, {"timeout_seconds": 60, "attempts": 11})
    done = subprocess.run([sys.executable, "-m", "pipeline", "infra", "validate", "--payload", "-", "--policy",
                           str(path)], input="{}", capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "suites.smoke.attempts" in done.stderr and "less than or equal to 10" in done.stderr, done.stderr


RUN = "run-0123456789abcdef0123"


def _claims(names: list[tuple[str, str]]) -> list[TrialClaim]:
    return [TrialClaim(idx=i, task=task, trial_name=name, attempts=0, max_attempts=3)
            for i, (task, name) in enumerate(names)]


def test_a_batch_says_the_attempts_its_trials_were_planned_with() -> None:
    assert batch_attempts(RUN, _claims([("hello", trial_name("hello", RUN)), ("fail", trial_name("fail", RUN))])) == 1
    some = [("hello", task_trial_names("hello", RUN, 3)[2]), ("fail", task_trial_names("fail", RUN, 3)[0])]
    assert batch_attempts(RUN, _claims(some)) == 3  # not the policy's now: the names the run was planned with
    assert batch_attempts(RUN, []) == 1


def _runner_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, names: tuple[str, ...], attempts: int,
                    artifact: Any = None) -> list[str]:
    """The argv ``_run_container`` gives ``benchseal trial run`` for a batch (the container itself not started)."""
    seen: list[list[str]] = []
    setup = SimpleNamespace(args=["--secret-dir", "/s"], close=lambda: None)
    monkeypatch.setattr(containers, "prepare_runner_agent", lambda *a, **k: setup)
    monkeypatch.setattr(containers, "sandbox_url", lambda config: "unix:///run/sandbox.sock")
    monkeypatch.setattr(containers.sandbox, "default_sandbox", lambda: SimpleNamespace(user="sandbox"))
    monkeypatch.setattr(containers.sandbox, "reclaim", lambda path: None)

    def started(engines: Any, record: Any, runner_ref: Any, run_dir: Any, config: Any, command: list[str],
                *rest: Any) -> tuple[Any, None, bool]:
        seen.append(command)
        return None, None, False
    monkeypatch.setattr(containers, "_run_started_container", started)
    record = SimpleNamespace(run_id=RUN, payload=SimpleNamespace(agent="oracle", suite="smoke", agent_artifact=artifact))
    batch = containers._BatchRun(suite_dir=tmp_path / "suite", out_dir=tmp_path / "out", name="b", trial_names=names,
                                 concurrency=3, label="l", attempts=attempts)
    containers._run_container(SimpleNamespace(runner_id="sha256:" + "1" * 64), record, None, tmp_path,  # type: ignore[arg-type]
                              None, load_policy(), batch)  # type: ignore[arg-type]
    return seen[0]


@pytest.mark.parametrize("kind", ["python", "npm"])
def test_a_python_release_agent_is_run_in_the_runner_images_own_container(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path, kind: str) -> None:
    """The runner gets its own image id (the one the worker started it from) for a Python agent's boxes."""
    command = _runner_command(monkeypatch, tmp_path, (trial_name("hello", RUN),), 1, SimpleNamespace(kind=kind))
    if kind == "python":
        assert command[command.index("--agent-image") + 1] == "sha256:" + "1" * 64
    else:
        assert "--agent-image" not in command


def test_the_runner_is_told_the_attempts_and_trials_only_when_a_task_runs_more_than_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    once = (trial_name("hello", RUN), trial_name("fail", RUN))
    command = _runner_command(monkeypatch, tmp_path, once, 1)
    # One attempt: exactly the command of before attempts existed (an older runner image still runs it).
    assert command == ["trial", "run", "--suite-dir", str(tmp_path / "suite"), "--out", str(tmp_path / "out"),
                       "--run-id", RUN, "--concurrency", "3", "--agent", "oracle"]
    twice = (task_trial_names("hello", RUN, 2)[1], task_trial_names("fail", RUN, 2)[0])
    command = _runner_command(monkeypatch, tmp_path, twice, 2)
    assert command[command.index("--agent") + 2:] == [
        "--attempts", "2", "--trial", twice[0], "--trial", twice[1]]
