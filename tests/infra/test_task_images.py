"""Task images by digest (issue 36.2): a task's prebuilt ``[environment] docker_image`` must be pinned
by digest and come from a registry its suite admits, refused in one line before anything runs (at
worker start and whenever the run's dataset is staged); the worker points the rendered task at the
image's id. Everything here but the registry test runs without Docker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.contracts import TrialRecord
from pipeline.core.datasets import task_images
from pipeline.core.digests import ImageRef
from pipeline.core.documents import Dataset
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.evidence.artifacts import build_summary
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.worker.config import InfraFailure
from pipeline.infra.worker.dataset import check_policy_datasets, stage_dataset
from pipeline.infra.worker.images import render_suite
from pipeline.infra.worker.task_images import load_task_images, set_docker_image
from tests.fixtures.datasets import pinned
from tests.fixtures.sigstore import make_inputs
from tests.fixtures.tb_mini import TASKS, write_tb_mini

REGISTRY = "127.0.0.1:5055"
IMAGE = f"{REGISTRY}/benchseal-tests/tb-mini@sha256:" + "ab" * 32
BASE = ImageRef(name=f"{REGISTRY}/benchseal/base", digest="sha256:" + "b" * 64)
FIELD = "task count-lines: task.toml [environment] docker_image"


def _policy(tmp_path: Path, suites: Path, registries: Any = (REGISTRY,)) -> InfraPolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["suites"] = {"tb": {"dataset": pinned(suites, "tb"), "timeout_seconds": 60}}
    if registries is not None:
        data["suites"]["tb"]["task_image_registries"] = list(registries) if isinstance(registries, tuple) else registries
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


def _suites(tmp_path: Path, image: str = IMAGE) -> Path:
    write_tb_mini(tmp_path / "suites" / "tb", image)
    return tmp_path / "suites"


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir


def _refusal(tmp_path: Path, suites: Path, registries: Any = (REGISTRY,)) -> str:
    """The one line the worker refuses the dataset with, at start and when it stages a run's copy (the same)."""
    policy = _policy(tmp_path, suites, registries)
    with pytest.raises(ValidationError) as at_start:
        check_policy_datasets(policy, suites)
    with pytest.raises(ValidationError) as staged:
        stage_dataset(policy, "tb", suites, _run_dir(tmp_path))
    line = staged.value.diagnostics()
    assert at_start.value.diagnostics() == line and "\n" not in line
    return line


def test_a_task_image_pinned_by_digest_from_an_admitted_registry_is_staged(tmp_path: Path) -> None:
    suites = _suites(tmp_path)
    policy = _policy(tmp_path, suites)
    check_policy_datasets(policy, suites)
    staged = stage_dataset(policy, "tb", suites, _run_dir(tmp_path))
    assert staged.task_images == {task: ImageRef(name=IMAGE.split("@")[0], digest=IMAGE.split("@")[1])
                                  for task in TASKS}


@pytest.mark.parametrize(("image", "needle"), [
    (f"{REGISTRY}/benchseal-tests/tb-mini:latest", "tags are not accepted"),
    (f"{REGISTRY}/benchseal-tests/tb-mini:1.0@sha256:" + "ab" * 32, "must not carry a tag"),
    ("ubuntu:24.04", "tags are not accepted"),
    ("ubuntu@sha256:" + "ab" * 32, "must name a registry host"),  # Docker Hub implied: no
    ("library/ubuntu@sha256:" + "ab" * 32, "registry host 'library'"),
    (f"{REGISTRY}/benchseal-tests/tb-mini@sha256:" + "AB" * 32, "lowercase"),
    (f"{REGISTRY}/benchseal-tests/tb-mini@sha512:" + "ab" * 64, "sha256"),
    ("", "pinned by digest"),
])
def test_a_task_image_not_pinned_by_digest_is_refused_naming_the_task_and_field(
        tmp_path: Path, image: str, needle: str) -> None:
    line = _refusal(tmp_path, _suites(tmp_path, image))
    assert FIELD in line and needle in line, line


def test_a_task_image_that_is_not_a_string_is_refused(tmp_path: Path) -> None:
    suites = _suites(tmp_path)
    toml = suites / "tb" / "count-lines" / "task.toml"
    toml.write_text(toml.read_text().replace(f'"{IMAGE}"', "42"))
    assert FIELD in _refusal(tmp_path, suites)


@pytest.mark.parametrize(("registries", "admitted"), [
    (("registry.example.org",), "registry.example.org"),
    (None, "none"),  # no task_image_registries: every task builds from its Dockerfile
    (("127.0.0.1:5056", "127.0.0.1"), "127.0.0.1:5056, 127.0.0.1"),  # the port is part of the registry
])
def test_an_image_from_a_registry_the_suite_does_not_admit_is_refused(
        tmp_path: Path, registries: Any, admitted: str) -> None:
    line = _refusal(tmp_path, _suites(tmp_path), registries)
    assert FIELD in line and f"registry {REGISTRY} is not admitted" in line, line
    assert "suites.tb.task_image_registries" in line and f"(admitted: {admitted})" in line, line


def test_a_verifier_environment_image_is_refused(tmp_path: Path) -> None:
    suites = _suites(tmp_path)
    toml = suites / "tb" / "reverse-lines" / "task.toml"
    toml.write_text(toml.read_text() + f'\n[verifier.environment]\ndocker_image = "{IMAGE}"\n')
    line = _refusal(tmp_path, suites)
    assert "task reverse-lines: task.toml [verifier.environment] docker_image" in line, line


@pytest.mark.parametrize("value", ["https://ghcr.io", "GHCR.IO", "ghcr.io/acme", "", "ghcr.io ", "ghcr.io:port",
                                   "-ghcr.io", 5055])
def test_the_policy_admits_registries_by_host_only(tmp_path: Path, value: object) -> None:
    suites = _suites(tmp_path)
    with pytest.raises(ValidationError) as info:
        _policy(tmp_path, suites, [value])
    line = info.value.diagnostics()
    assert "suites.tb.task_image_registries" in line and "\n" not in line, line


def test_the_shipped_policy_parses_with_the_registries_it_documents(tmp_path: Path) -> None:
    for registries in ([REGISTRY], ["ghcr.io", "registry.example.org:8443", "localhost:5000"]):
        assert _policy(tmp_path, _suites(tmp_path / str(len(registries))), registries).suites["tb"]\
            .task_image_registries == tuple(registries)


def test_core_reads_task_images_of_the_tasks_asked(tmp_path: Path) -> None:
    root = write_tb_mini(tmp_path / "tb", IMAGE)
    assert sorted(task_images(root)) == list(TASKS)
    assert sorted(task_images(root, ["reverse-lines"])) == ["reverse-lines"]


def test_rendering_leaves_a_prebuilt_tasks_dockerfile_and_points_the_task_at_the_loaded_id(tmp_path: Path) -> None:
    """The Dockerfile of a task with a pinned image is its publisher's source, never built: rendering keeps it
    (its FROM is no benchseal-base placeholder) and the rendered task.toml then names the image's id."""
    root = write_tb_mini(tmp_path / "tb", IMAGE)
    render_suite(root, tmp_path / "suite", BASE)
    rendered = tmp_path / "suite" / "count-lines"
    assert (rendered / "environment" / "Dockerfile").read_bytes() == \
        (root / "count-lines" / "environment" / "Dockerfile").read_bytes()
    image_id = "sha256:" + "cd" * 32
    set_docker_image(rendered / "task.toml", image_id)
    assert f'docker_image = "{image_id}"' in (rendered / "task.toml").read_text()
    assert IMAGE in (root / "count-lines" / "task.toml").read_text()  # the staged copy is never touched
    # Without its image the same Dockerfile is refused, as any FROM that is not the placeholder.
    toml = root / "count-lines" / "task.toml"
    toml.write_text("\n".join(line for line in toml.read_text().splitlines() if "docker_image" not in line))
    with pytest.raises(CheckFailed, match="is not the benchseal-base placeholder"):
        render_suite(root, tmp_path / "suite2", BASE)


def test_a_rendered_task_without_exactly_one_image_line_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "task.toml"
    toml.write_text(f'[environment]\ndocker_image = "{IMAGE}"\n[other]\ndocker_image = "x"\n')
    set_docker_image(toml, "sha256:" + "cd" * 32)  # the other table's key is not the environment's
    toml.write_text(f'environment = {{ docker_image = "{IMAGE}" }}\n')
    with pytest.raises(CheckFailed, match="expected one"):
        set_docker_image(toml, "sha256:" + "cd" * 32)


@pytest.mark.docker
def test_a_digest_the_registry_does_not_have_is_an_infrastructure_error(tmp_path: Path, image_registry: str) -> None:
    """Nothing is pulled or run: the registry's answer for the pinned digest is one line naming the task."""
    import docker

    ref = ImageRef(name=f"{image_registry}/benchseal-tests/tb-absent", digest="sha256:" + "0" * 64)
    suite = write_tb_mini(tmp_path / "suite", ref.ref)
    host = docker.from_env()
    try:
        with pytest.raises(InfraFailure) as info:
            load_task_images(host, None, suite, {"count-lines": ref})
    finally:
        host.close()
    line = str(info.value)
    assert line.startswith("task count-lines: ") and "has no manifest" in line and ref.digest in line, line
    assert "\n" not in line


def test_the_dataset_images_verb_lists_pinned_images_and_refuses_a_tag_in_one_line(tmp_path: Path) -> None:
    """``benchseal dataset images``: what an operator admits in ``task_image_registries``, read with the same rule."""
    root = write_tb_mini(tmp_path / "tb", IMAGE)
    cli = [sys.executable, "-m", "pipeline", "dataset", "images"]
    listed = subprocess.run([*cli, str(root)], capture_output=True, text=True, check=False, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"{task} {IMAGE}" for task in TASKS]
    toml = root / "reverse-lines" / "task.toml"
    toml.write_text(toml.read_text().replace(IMAGE, f"{REGISTRY}/benchseal-tests/tb-mini:latest"))
    refused = subprocess.run([*cli, str(root)], capture_output=True, text=True, check=False, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "task reverse-lines: task.toml [environment] docker_image" in refused.stderr
    assert "tags are not accepted" in refused.stderr


# --- the evidence: each trial's record and summary.json ------------------------------------------------

IMAGES = {"runner": f"{REGISTRY}/benchseal/runner@sha256:" + "1" * 64, "api": f"{REGISTRY}/benchseal/api@sha256:" + "2" * 64}


def test_summary_json_names_each_tasks_image_by_digest_and_refuses_two_for_one_task() -> None:
    grading, payload = make_inputs(IMAGES)
    assert build_summary(grading, payload).dataset.task_images is None  # built from Dockerfiles: nothing added
    assert "task_images" not in build_summary(grading, payload).dataset.to_json_dict()
    trials = tuple(t.model_copy(update={"task_image": IMAGE}) for t in grading.trials)
    summary = build_summary(grading.model_copy(update={"trials": trials}), payload)
    assert summary.dataset.task_images == {t.task: IMAGE for t in grading.trials}
    assert json.loads(json.dumps(summary.to_json_dict()))["dataset"]["task_images"] == summary.dataset.task_images
    other = f"{REGISTRY}/benchseal-tests/tb-mini@sha256:" + "cd" * 32
    twice = (*trials, trials[0].model_copy(update={"trial_name": trials[0].trial_name + "x", "task_image": other}))
    with pytest.raises(CheckFailed, match=f"task {trials[0].task} ran on"):
        build_summary(grading.model_copy(update={"trials": twice}), payload)


def test_a_recorded_task_image_must_be_pinned_by_digest() -> None:
    grading, _ = make_inputs(IMAGES)
    record = grading.trials[0].model_dump(mode="json")
    assert TrialRecord.model_validate({**record, "task_image": IMAGE}).task_image == IMAGE
    with pytest.raises(PydanticValidationError):
        TrialRecord.model_validate({**record, "task_image": f"{REGISTRY}/benchseal-tests/tb-mini:latest"})
    with pytest.raises(PydanticValidationError):
        Dataset.model_validate({"name": "tb", "task_images": {"count-lines": "ubuntu:24.04"}})
