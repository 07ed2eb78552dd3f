"""Suites pinned by their dataset's content digest (issue 36.1, 36.4): the policy rule, the shipped policies'
honesty, and the worker's staging (copy, re-hash, refuse) that every run's tasks come from. No Docker."""

from __future__ import annotations

import os
import shutil
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError as PydanticValidationError

from pipeline.core.datasets import dataset_digest
from pipeline.core.digests import ImageRef
from pipeline.core.documents import HistoryEntry, TaskCounts
from pipeline.core.errors import CheckFailed, DatasetDigestMismatch, DatasetRefused, ValidationError
from pipeline.core.history import baseline, check_comparison, compare
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.worker.dataset import STAGED, check_policy_datasets, stage_dataset
from pipeline.infra.worker.grading import run_dataset
from pipeline.infra.worker.images import render_suite
from tests.fixtures.datasets import pinned
from tests.fixtures.sigstore import make_inputs

SHIPPED = [REPO_ROOT / "policies" / "infra.yaml", REPO_ROOT / "examples" / "bench-infra" / "policies" / "infra.yaml"]
BASE = ImageRef(name="127.0.0.1:5055/benchseal/base", digest="sha256:" + "b" * 64)


def _policy(tmp_path: Path, suites: Path, mutate: Any = None) -> InfraPolicy:
    data = yaml.safe_load(SHIPPED[0].read_text())
    data["suites"] = {"smoke": data["suites"]["smoke"]}  # the fixture's suites root holds smoke only
    data["suites"]["smoke"]["dataset"] = pinned(suites, "smoke")
    if mutate is not None:
        mutate(data)
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


@pytest.fixture()
def suites(tmp_path: Path) -> Path:
    root = tmp_path / "suites"
    shutil.copytree(REPO_ROOT / "suites" / "smoke", root / "smoke")
    return root


# --- the policy rule -----------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "mutate", "field", "needle"), [
    ("no dataset", lambda d: d["suites"]["smoke"].pop("dataset"), "suites.smoke.dataset", "Field required"),
    ("short digest", lambda d: d["suites"]["smoke"]["dataset"].update(digest="sha256:abc"),
     "suites.smoke.dataset.digest", "exactly 64 hex digits"),
    ("upper-case digest", lambda d: d["suites"]["smoke"]["dataset"].update(digest="sha256:" + "A" * 64),
     "suites.smoke.dataset.digest", "lowercase"),
    ("other algorithm", lambda d: d["suites"]["smoke"]["dataset"].update(digest="sha512:" + "a" * 64),
     "suites.smoke.dataset.digest", "sha256"),
    ("absolute path", lambda d: d["suites"]["smoke"]["dataset"].update(path="/srv/suites/smoke"),
     "suites.smoke.dataset.path", "absolute"),
    ("escaping path", lambda d: d["suites"]["smoke"]["dataset"].update(path="../smoke"),
     "suites.smoke.dataset.path", ".."),
    ("unknown key", lambda d: d["suites"]["smoke"]["dataset"].update(url="https://example.invalid/smoke"),
     "suites.smoke.dataset.url", "Extra inputs"),
])
def test_a_suite_names_its_dataset_by_path_and_digest(tmp_path: Path, suites: Path, case: str, mutate: Any,
                                                    field: str, needle: str) -> None:
    _policy(tmp_path, suites)  # the unmutated policy loads
    with pytest.raises(ValidationError) as info:
        _policy(tmp_path, suites, mutate)
    line = info.value.diagnostics()
    assert field in line and needle in line and "\n" not in line, (case, line)


@pytest.mark.parametrize("path", SHIPPED, ids=["policies", "example"])
def test_the_shipped_policies_pin_the_real_bytes_of_suites_smoke(tmp_path: Path, path: Path) -> None:
    """Fails when a file of suites/smoke changes and the policies' digest does not (update it with
    `benchseal dataset digest suites/smoke`)."""
    copy = tmp_path / "infra.yaml"  # the example's builder commit is a placeholder the adopter fills in
    copy.write_text(path.read_text().replace("@BENCHSEAL_COMMIT", "@" + "0" * 40))
    policy = load_policy(copy)
    assert policy.suites["smoke"].dataset.path == "smoke"
    assert policy.suites["smoke"].dataset.digest == dataset_digest(REPO_ROOT / "suites" / "smoke")
    check_policy_datasets(policy, REPO_ROOT / "suites")


def test_a_changed_file_of_a_suite_fails_the_policy_check(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    check_policy_datasets(policy, suites)
    (suites / "smoke" / "fix-mean" / "tests" / "test.sh").write_bytes(b"#!/bin/sh\nexit 0\n")
    with pytest.raises(DatasetDigestMismatch) as info:
        check_policy_datasets(policy, suites)
    assert "suites.smoke.dataset" in str(info.value) and "not the pinned" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_dataset_directory_is_refused(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    with pytest.raises(DatasetRefused, match=r"suites\.smoke\.dataset"):
        check_policy_datasets(policy, tmp_path / "elsewhere")


# --- staging ---------------------------------------------------------------------------------------

def test_staging_copies_exactly_the_pinned_bytes(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    staged = stage_dataset(policy, "smoke", suites, run_dir)
    assert staged.path == run_dir / STAGED and staged.digest == policy.suites["smoke"].dataset.digest
    assert dataset_digest(staged.path) == staged.digest
    assert os.access(staged.path / "fix-mean" / "solution" / "solve.sh", os.X_OK) == \
        os.access(suites / "smoke" / "fix-mean" / "solution" / "solve.sh", os.X_OK)
    assert sorted(p.name for p in run_dir.iterdir()) == [STAGED]  # no scratch left behind
    # A later batch on this host re-hashes the copy and gets the same.
    assert stage_dataset(policy, "smoke", suites, run_dir) == staged


def test_a_source_that_differs_from_its_digest_stages_nothing(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    (suites / "smoke" / "write-answer" / "instruction.md").write_text("Do nothing.\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(DatasetDigestMismatch) as info:
        stage_dataset(policy, "smoke", suites, run_dir)
    assert "suites.smoke.dataset" in str(info.value) and policy.suites["smoke"].dataset.digest in str(info.value)
    assert list(run_dir.iterdir()) == []


def test_a_changed_byte_in_the_staged_copy_is_refused(tmp_path: Path, suites: Path) -> None:
    """The copy a batch would render its tasks from is re-hashed: a byte changed after staging
    (a cache, a tampering process) is refused, so nothing of it reaches a trial."""
    policy = _policy(tmp_path, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    staged = stage_dataset(policy, "smoke", suites, run_dir)
    target = staged.path / "cli-flag" / "tests" / "test.sh"
    data = bytearray(target.read_bytes())
    data[-2] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(DatasetDigestMismatch) as info:
        stage_dataset(policy, "smoke", suites, run_dir)
    assert "suites.smoke.dataset: staged copy" in str(info.value) and "\n" not in str(info.value)


def test_a_task_added_to_the_staged_copy_is_refused(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    staged = stage_dataset(policy, "smoke", suites, run_dir)
    shutil.copytree(staged.path / "write-answer", staged.path / "extra-task")
    with pytest.raises(DatasetDigestMismatch):
        stage_dataset(policy, "smoke", suites, run_dir)


def test_a_link_in_the_source_is_refused_and_never_followed(tmp_path: Path, suites: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    os.symlink(secret, suites / "smoke" / "write-answer" / "tests" / "extra.txt")
    policy = _policy(tmp_path, REPO_ROOT / "suites")  # pins the clean bytes
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(DatasetRefused, match="symlink"):
        stage_dataset(policy, "smoke", suites, run_dir)
    assert list(run_dir.iterdir()) == []


def test_a_suite_outside_the_policy_is_a_named_refusal(tmp_path: Path, suites: Path) -> None:
    policy = _policy(tmp_path, suites)
    with pytest.raises(ValidationError, match=r"payload\.suite"):
        stage_dataset(policy, "nosuch", suites, tmp_path)


def test_a_planned_task_the_digest_does_not_cover_is_never_rendered(tmp_path: Path, suites: Path) -> None:
    """The batch's tasks are rendered from the staged copy only: a task that exists in the suites root but
    not in the pinned dataset cannot reach a trial."""
    policy = _policy(tmp_path, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    staged = stage_dataset(policy, "smoke", suites, run_dir)
    shutil.copytree(suites / "smoke" / "write-answer", suites / "smoke" / "smuggled")  # after pinning and staging
    with pytest.raises(Exception, match="smuggled"):
        render_suite(staged.path, tmp_path / "out", BASE, tasks={"write-answer", "smuggled"})
    assert not (tmp_path / "out" / "smuggled").exists()


# --- the history key -------------------------------------------------------------------------------

def _release(n: int, tag: str, dataset: str | None) -> HistoryEntry:
    return HistoryEntry(repository="acme/widget", suite="smoke", tag=tag, run_id=f"run-{n:020x}", commit="a" * 40,
                        score=1.0, interval=None, tasks={"a": TaskCounts(attempts=1, completed=1, resolved=1)},
                        gated=False, finished_at=datetime(2026, 1, 1, tzinfo=UTC), summary_digest="sha256:" + "c" * 64,
                        dataset_digest=dataset)


def test_two_datasets_never_compare_as_one() -> None:
    one, other = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    history = [_release(1, "v1", one), _release(2, "v2", other), _release(3, "v3", None)]
    assert baseline(history, "v4", dataset_digest=one) == history[0]
    assert baseline(history, "v4", dataset_digest=other) == history[1]
    assert baseline(history, "v4", dataset_digest="sha256:" + "3" * 64) is None  # a new dataset starts afresh
    assert baseline(history, "v4", dataset_digest=None) == history[2]  # unpinned history stays apart
    assert baseline(history, "v2", dataset_digest=one) == history[0]  # only tags recorded before v2's first entry


def test_the_grading_carries_a_valid_dataset_digest() -> None:
    """The grading names the one digest every trial ran from (summary.json's dataset.digest comes from it)."""
    grading, _ = make_inputs({"runner": "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64,
                              "api": "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64})
    assert grading.dataset_digest == "sha256:" + "5" * 64
    with pytest.raises(PydanticValidationError):
        grading.model_validate({**grading.model_dump(mode="json"), "dataset_digest": "sha256:short"})


def test_a_run_whose_trials_ran_on_two_datasets_is_failed() -> None:
    one, other = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert run_dataset([one, one, one]) == (one, None)
    assert run_dataset([]) == (None, None)
    for mixed in ([one, other], [one, None]):
        digest, failure = run_dataset(mixed)
        assert digest is None and failure is not None and "different datasets" in failure


def test_a_comparison_with_a_release_of_another_dataset_is_refused() -> None:
    """The seal job, the worker's finalizer and verify recompute the comparison: its previous release must
    have run the same dataset as this one."""
    one, other = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    tasks = {"a": TaskCounts(attempts=1, completed=1, resolved=1)}
    previous = _release(1, "v1", one).as_previous()
    assert previous.dataset_digest == one
    comparison = compare(score=1.0, interval=None, tasks=tasks, previous=previous, gate=None)
    check_comparison(comparison, score=1.0, interval=None, tasks=tasks, where="comparison", dataset_digest=one)
    with pytest.raises(CheckFailed, match=r"comparison\.previous\.dataset_digest"):
        check_comparison(comparison, score=1.0, interval=None, tasks=tasks, where="comparison", dataset_digest=other)


def test_staging_makes_each_directory_once_each_readable_under_a_strict_umask(tmp_path: Path, suites: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy asks for each directory once, not once per file (HumanEval's 1,148 files: 1,479 mkdir calls, now 823;
    the time is in the 657 directories made, so the calls saved cost little), and every directory it made is 755
    whatever the worker's umask (the runner is another uid); the copy is still re-hashed against the pin."""
    policy = _policy(tmp_path, suites)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    attempts: list[str] = []
    real = os.mkdir

    def counting(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        attempts.append(os.path.basename(path))
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", counting)
    previous = os.umask(0o077)
    try:
        staged = stage_dataset(policy, "smoke", suites, run_dir)
    finally:
        os.umask(previous)
        monkeypatch.undo()
    directories = [staged.path, *(p for p in staged.path.rglob("*") if p.is_dir())]
    crowded = max(directories, key=lambda d: sum(1 for p in d.iterdir() if p.is_file()))
    assert sum(1 for p in crowded.iterdir() if p.is_file()) >= 3  # a per-file mkdir would ask for it 3 times
    scratch_attempts = [a for a in attempts if a != STAGED]
    assert len(scratch_attempts) <= 2 * len(directories), scratch_attempts
    assert {oct(stat.S_IMODE(d.stat().st_mode)) for d in directories} == {"0o755"}
    assert dataset_digest(staged.path) == staged.digest
