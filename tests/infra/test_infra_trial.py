"""The trial driver's knobs and the worker's task-image pinning (no engine needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import load_policy
from pipeline.infra.worker.loop import _pin_docker_image, _task_context_hash
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
    data["suites"] = {"smoke": suite}
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_trial_concurrency_comes_from_the_policy(tmp_path: Path) -> None:
    assert load_policy().trial_concurrency("smoke") == 3
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
