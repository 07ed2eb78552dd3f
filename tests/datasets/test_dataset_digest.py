"""The dataset content digest (pipeline.core.datasets): what it covers, what it ignores, what it refuses."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from pipeline.core.datasets import (
    MANIFEST_HEADER,
    DatasetEntry,
    dataset_digest,
    dataset_entries,
    digest_entries,
    manifest,
    verify_staged,
)
from pipeline.core.digests import validate_digest
from pipeline.core.errors import DatasetDigestMismatch, DatasetRefused, ValidationError

H = "ab" * 32


def _dataset(root: Path) -> Path:
    for task in ("alpha", "beta"):
        (root / task / "environment").mkdir(parents=True)
        (root / task / "tests").mkdir()
        (root / task / "solution").mkdir()
        (root / task / "task.toml").write_text(f'[task]\nname = "{task}"\n')
        (root / task / "instruction.md").write_text(f"Do {task}.\n")
        (root / task / "environment" / "Dockerfile").write_text("FROM benchseal-base\n")
        (root / task / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")
        (root / task / "tests" / "test.sh").chmod(0o755)
        (root / task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
        (root / task / "solution" / "solve.sh").chmod(0o755)
    return root


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    return _dataset(tmp_path / "ds")


def test_the_digest_is_a_sha256_over_the_documented_manifest(ds: Path) -> None:
    digest = dataset_digest(ds)
    validate_digest(digest)
    text = manifest(dataset_entries(ds)).decode()
    lines = text.splitlines()
    assert lines[0] == MANIFEST_HEADER and len(lines) == 1 + 10
    assert lines[1].startswith("644 ") and lines[1].endswith(" alpha/environment/Dockerfile")
    assert [line.split(" ", 2)[2] for line in lines[1:]] == sorted(line.split(" ", 2)[2] for line in lines[1:])
    assert any(line.startswith("755 ") and line.endswith(" beta/tests/test.sh") for line in lines)


def test_order_of_entries_and_of_creation_does_not_matter(tmp_path: Path, ds: Path) -> None:
    entries = dataset_entries(ds)
    assert digest_entries(reversed(entries)) == digest_entries(entries) == dataset_digest(ds)
    other = tmp_path / "other"
    other.mkdir()
    for task in ("beta", "alpha"):  # created in another order, copied file by file
        for source in sorted((ds / task).rglob("*"), reverse=True):
            target = other / source.relative_to(ds)
            if source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                target.chmod(source.stat().st_mode & 0o777)
    assert dataset_digest(other) == dataset_digest(ds)


def test_times_owner_other_mode_bits_and_empty_dirs_are_not_covered(ds: Path) -> None:
    before = dataset_digest(ds)
    os.utime(ds / "alpha" / "task.toml", (1, 1))
    (ds / "alpha" / "task.toml").chmod(0o600)
    (ds / "alpha" / "tests" / "test.sh").chmod(0o700)  # still executable
    (ds / "alpha" / "empty").mkdir()
    assert dataset_digest(ds) == before


@pytest.mark.parametrize("change", ["byte", "added", "renamed", "exec-bit", "moved-between-tasks"])
def test_every_content_change_changes_the_digest(ds: Path, change: str) -> None:
    before = dataset_digest(ds)
    if change == "byte":
        data = bytearray((ds / "beta" / "instruction.md").read_bytes())
        data[0] ^= 1
        (ds / "beta" / "instruction.md").write_bytes(bytes(data))
    elif change == "added":
        (ds / "beta" / "tests" / "extra.py").write_text("")
    elif change == "renamed":
        (ds / "beta" / "instruction.md").rename(ds / "beta" / "Instruction.md")
    elif change == "exec-bit":
        (ds / "beta" / "instruction.md").chmod(0o744)
    else:
        (ds / "alpha" / "tests" / "test.sh").rename(ds / "beta" / "tests" / "test2.sh")
    assert dataset_digest(ds) != before


def test_verify_staged_accepts_the_same_bytes_and_refuses_others(tmp_path: Path, ds: Path) -> None:
    pinned = dataset_digest(ds)
    staged = tmp_path / "staged"
    shutil.copytree(ds, staged)
    assert verify_staged(staged, pinned) == pinned
    (staged / "alpha" / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0 # changed in the cache\n")
    with pytest.raises(DatasetDigestMismatch, match=f"not the pinned {pinned}") as caught:
        verify_staged(staged, pinned)
    assert str(staged) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValidationError, match="dataset digest"):
        verify_staged(ds, "sha256:" + "AB" * 32)


def _refusal(root: Path) -> str:
    with pytest.raises(DatasetRefused) as caught:
        dataset_digest(root)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 1
    return message


def test_a_symlink_is_refused_naming_it(ds: Path) -> None:
    (ds / "alpha" / "tests" / "answers.txt").symlink_to("/etc/passwd")
    assert _refusal(ds) == "dataset file alpha/tests/answers.txt: is a symlink (a dataset holds regular files and directories only)"


def test_a_directory_symlink_is_refused_not_followed(ds: Path, tmp_path: Path) -> None:
    (ds / "gamma").symlink_to(ds / "alpha", target_is_directory=True)
    assert "gamma: is a symlink" in _refusal(ds)


def test_a_fifo_and_a_socket_are_refused(ds: Path, tmp_path: Path) -> None:
    os.mkfifo(ds / "beta" / "pipe")
    assert "beta/pipe: is a special file" in _refusal(ds)
    (ds / "beta" / "pipe").unlink()
    sock_dir = ds / "beta" / "s"
    sock_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_dir / "sock"))
        assert "beta/s/sock: is a special file" in _refusal(ds)


def test_a_name_that_is_not_utf8_is_refused(ds: Path) -> None:
    os.mknod(os.fsencode(ds / "alpha") + b"/caf\xe9.txt")  # a regular file named in Latin-1
    assert "the name is not UTF-8" in _refusal(ds)


def test_a_name_with_a_newline_cannot_forge_a_manifest_line(ds: Path) -> None:
    (ds / "alpha" / f"x\n644 {H} fake").write_text("")
    assert "non-printable character U+000A" in _refusal(ds)


@pytest.mark.parametrize(("name", "rule"), [("/etc/passwd", "is absolute"), ("../up/task.toml", "'..' part"),
                                            ("a/./task.toml", "'.' or '..' part"), ("a//task.toml", "empty")])
def test_absolute_and_dot_dot_names_are_refused(name: str, rule: str) -> None:
    entries = [DatasetEntry("t/task.toml", False, H), DatasetEntry(name, False, H)]
    with pytest.raises(DatasetRefused, match=rule):
        digest_entries(entries)


def test_a_duplicate_name_or_a_bad_hash_is_refused() -> None:
    with pytest.raises(DatasetRefused, match="appears twice"):
        digest_entries([DatasetEntry("t/task.toml", False, H), DatasetEntry("t/task.toml", True, H)])
    with pytest.raises(DatasetRefused, match="64 lowercase hex"):
        digest_entries([DatasetEntry("t/task.toml", False, "AB" * 32)])


def test_an_empty_dataset_or_one_without_a_task_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _refusal(empty) == "dataset file .: the dataset holds no task (no <task>/task.toml)"
    (empty / "README.md").write_text("no tasks\n")
    (empty / "deep" / "a").mkdir(parents=True)
    (empty / "deep" / "a" / "task.toml").write_text("")  # not a task of this dataset: one level too deep
    assert "holds no task" in _refusal(empty)


def test_the_root_must_be_a_real_directory(tmp_path: Path, ds: Path) -> None:
    (tmp_path / "link").symlink_to(ds, target_is_directory=True)
    assert "must be a directory" in _refusal(tmp_path / "link")
    assert "cannot read" in _refusal(tmp_path / "missing")
