"""Task images built FROM a registry base pinned by digest (issue 36.2): a task's environment/Dockerfile may
build FROM ``benchseal-base`` or ``<registry>/<repository>@sha256:<64 hex>`` from a registry its suite admits;
every other FROM is refused in one line naming the task, at worker start and whenever the run's dataset is
staged (before anything runs). Rendering points an admitted base's FROM at the id the worker loaded it as.
No Docker here (tests/datasets/test_task_base_build.py builds one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.worker.dataset import check_policy_datasets, stage_dataset
from pipeline.infra.worker.images import render_suite
from tests.fixtures.datasets import pinned
from tests.fixtures.infra import remove_build_chain

REGISTRY = "127.0.0.1:5055"
BASE_REF = f"{REGISTRY}/benchseal-tests/task-base@sha256:" + "cd" * 32
BASE = ImageRef(name=f"{REGISTRY}/benchseal/base", digest="sha256:" + "b" * 64)
FIELD = "task t1: environment/Dockerfile FROM"


def write_task(root: Path, dockerfile: str, *, name: str = "t1", toml: str = "") -> Path:
    """A one-task dataset in Harbor's format whose environment/Dockerfile is ``dockerfile``."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n' + toml, encoding="utf-8")
    (task / "instruction.md").write_text("Do it.\n", encoding="utf-8")
    (task / "environment" / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", encoding="utf-8")
    return root


def _policy(tmp_path: Path, suites: Path, registries: list[str]) -> InfraPolicy:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["suites"] = {"ds": {"dataset": pinned(suites, "ds"), "timeout_seconds": 60,
                             "task_image_registries": registries}}
    (tmp_path / "infra.yaml").write_text(yaml.safe_dump(data))
    return load_policy(tmp_path / "infra.yaml")


def _stage(tmp_path: Path, dockerfile: str, registries: list[str] | None = None, toml: str = "") -> Any:
    suites = tmp_path / "suites"
    write_task(suites / "ds", dockerfile, toml=toml)
    policy = _policy(tmp_path, suites, [REGISTRY] if registries is None else registries)
    check_policy_datasets(policy, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return stage_dataset(policy, "ds", suites, run_dir)


def _refusal(tmp_path: Path, dockerfile: str, registries: list[str] | None = None) -> str:
    """The one line the worker refuses the dataset with, at start and when it stages a run's copy (the same)."""
    suites = tmp_path / "suites"
    write_task(suites / "ds", dockerfile)
    policy = _policy(tmp_path, suites, [REGISTRY] if registries is None else registries)
    with pytest.raises(ValidationError) as at_start:
        check_policy_datasets(policy, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ValidationError) as staged:
        stage_dataset(policy, "ds", suites, run_dir)
    line = staged.value.diagnostics()
    assert at_start.value.diagnostics() == line and "\n" not in line
    assert FIELD in line
    return line


def test_a_registry_base_pinned_by_digest_from_an_admitted_registry_is_staged(tmp_path: Path) -> None:
    staged = _stage(tmp_path, f"FROM {BASE_REF}\nCOPY x /x\n")
    assert staged.task_bases == {"t1": (ImageRef(name=BASE_REF.split("@")[0], digest=BASE_REF.split("@")[1]),)}


def test_benchseal_base_is_no_registry_base(tmp_path: Path) -> None:
    assert _stage(tmp_path, "FROM benchseal-base\nWORKDIR /app\n").task_bases == {}


def test_a_prebuilt_tasks_dockerfile_is_not_read(tmp_path: Path) -> None:
    # The task runs on its docker_image (task_images.py); its Dockerfile is the publisher's source, never built.
    staged = _stage(tmp_path, "ARG BASE\nFROM ${BASE}\n", toml=f'[environment]\ndocker_image = "{BASE_REF}"\n')
    assert staged.task_bases == {} and set(staged.task_images) == {"t1"}


@pytest.mark.parametrize(("line", "rule"), [
    (f"FROM {REGISTRY}/benchseal-tests/task-base:1.0", "tag"),
    (f"FROM {REGISTRY}/benchseal-tests/task-base:1.0@sha256:" + "cd" * 32, "tag"),
    ("FROM ubuntu@sha256:" + "cd" * 32, "registry"),
    ("FROM ubuntu", ""),
    ("FROM scratch", ""),
    ("ARG BASE\nFROM ${BASE}", ""),
    ("FROM --platform=linux/amd64 " + BASE_REF, ""),
    ("FROM benchseal-base AS build\nFROM build", ""),
    (f"FROM {REGISTRY}/benchseal-tests/task-base@sha256:" + "CD" * 32, ""),
])
def test_every_other_from_is_refused_in_one_line_naming_the_task(tmp_path: Path, line: str, rule: str) -> None:
    refusal = _refusal(tmp_path, line + "\nWORKDIR /app\n")
    assert rule in refusal


def test_a_base_from_a_registry_the_suite_does_not_admit_is_refused(tmp_path: Path) -> None:
    line = _refusal(tmp_path, f"FROM {BASE_REF}\n", registries=["127.0.0.1:5056"])
    assert f"registry {REGISTRY} is not admitted by suites.ds.task_image_registries" in line
    assert "task_image_registries (admitted: none)" in _refusal(tmp_path / "none", f"FROM {BASE_REF}\n",
                                                                 registries=[])


def test_rendering_points_an_admitted_base_at_its_loaded_id_and_nothing_else(tmp_path: Path) -> None:
    root = write_task(tmp_path / "ds", f"FROM {BASE_REF} AS env\nFROM benchseal-base\n")
    loaded = "sha256:" + "e" * 64
    render_suite(root, tmp_path / "suite", BASE, from_image="sha256:" + "f" * 64, bases={BASE_REF: loaded})
    assert (tmp_path / "suite" / "t1" / "environment" / "Dockerfile").read_text() == (
        f"FROM {loaded} AS env\nFROM sha256:{'f' * 64}\n")
    # A base the worker did not load (none given, or another one) is never rendered: the build would fetch it.
    with pytest.raises(CheckFailed, match="nor a base the worker loaded by digest"):
        render_suite(root, tmp_path / "suite2", BASE)
    with pytest.raises(CheckFailed, match="nor a base the worker loaded by digest"):
        render_suite(root, tmp_path / "suite3", BASE, bases={BASE_REF.replace("cd", "ab"): loaded})
    # Only environment Dockerfiles build on a registry base; tests/Dockerfile keeps the placeholder rule.
    (root / "t1" / "tests" / "Dockerfile").write_text(f"FROM {BASE_REF}\n")
    with pytest.raises(CheckFailed, match="tests/Dockerfile: FROM"):
        render_suite(root, tmp_path / "suite4", BASE, bases={BASE_REF: loaded})


@pytest.mark.docker
def test_a_task_image_is_built_without_a_network(tmp_path: Path, base_refs: dict[str, ImageRef]) -> None:
    """The worker's build of a task image has no network (only the loopback interface): what it makes is fixed
    by the context and the base it names by id, nothing fetched. The image built here is removed again."""
    import docker

    from pipeline.imaging.base import ensure_local
    from pipeline.infra.worker.images import prebuild_task_images, sandbox_image
    from tests.fixtures.infra import sandbox_engine

    base = base_refs["base"]
    ensure_local(base)
    host, sandboxed = docker.from_env(timeout=300), sandbox_engine()
    built: dict[str, str] = {}
    base_id = sandbox_image(host, sandboxed, base)
    try:
        # A unique context (its own image, never one another test built), failing wherever a network exists.
        root = write_task(tmp_path / "ds", "FROM benchseal-base\n"
                          f'RUN echo {tmp_path.name} > /marker && test "$(ls /sys/class/net)" = lo\n')
        render_suite(root, tmp_path / "suite", base, from_image=base_id)
        built = prebuild_task_images(sandboxed, tmp_path / "suite", records=tmp_path / "records")
        assert list(built) == ["t1"]
    finally:
        for image_id in built.values():
            remove_build_chain(sandboxed, image_id, base_id)
        host.close()
        sandboxed.close()
