"""What the seal job accepts from the infra host's export: only a graded run's own files, for the
run it expects (pipeline.infra.worker.export.import_run). Hostile tars fail closed, naming the member."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.infra.worker.export import import_run

RUN_ID = "run-0123456789abcdef0123"
RUNNER = "127.0.0.1:5055/benchseal/runner@sha256:" + "1" * 64
API = "127.0.0.1:5055/benchseal/api@sha256:" + "2" * 64


def _run_json(run_id: str = RUN_ID, state: str = "SUCCEEDED") -> bytes:
    return json.dumps({
        "run_id": run_id, "correlation_id": "corr-export-0001", "state": state, "attempts": 1, "suite": "smoke",
        "agent": "oracle", "source": {"repository": "acme/widget", "commit": "c" * 40, "tag": "v1.0.0"},
        "runner": RUNNER, "api": API, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:01:00Z",
    }).encode()


def _grading(run_id: str = RUN_ID, status: str = "SUCCEEDED") -> bytes:
    return json.dumps({
        "run_id": run_id, "status": status, "suite": "smoke", "agent": "oracle",
        "counts": {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0},
        "score": 1.0 if status == "SUCCEEDED" else None, "runner_ref": RUNNER, "api_ref": API,
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:01:00Z",
    }).encode()


Member = tuple[str, bytes | None, bytes]  # name, data (None: not a file), type


def _tar(members: list[Member]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = "/etc/passwd"
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    buffer.seek(0)
    return buffer


GOOD: list[Member] = [("run.json", _run_json(), tarfile.REGTYPE), ("grading.json", _grading(), tarfile.REGTYPE),
                      ("artifacts/evidence/harbor/t1/result.json", b"{}", tarfile.REGTYPE)]


def test_a_graded_run_unpacks(tmp_path: Path) -> None:
    dest = import_run(_tar(GOOD), tmp_path / "run", RUN_ID)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "artifacts/evidence/harbor/t1/result.json", "grading.json", "run.json"]


def _with(extra: Member) -> list[Member]:
    return [*GOOD, extra]


HOSTILE: dict[str, tuple[Callable[[], list[Member]], str]] = {
    "absolute path": (lambda: _with(("/etc/cron.d/x", b"x", tarfile.REGTYPE)), "is not run.json"),
    "dot-dot": (lambda: _with(("artifacts/evidence/../../x", b"x", tarfile.REGTYPE)), "is not run.json"),
    "dot segment": (lambda: _with(("artifacts/evidence/./x", b"x", tarfile.REGTYPE)), "is not run.json"),
    "outside evidence": (lambda: _with(("artifacts/SHA256SUMS", b"x", tarfile.REGTYPE)), "is not run.json"),
    "symlink": (lambda: _with(("artifacts/evidence/l", None, tarfile.SYMTYPE)), "not a regular file"),
    "hardlink": (lambda: _with(("artifacts/evidence/h", None, tarfile.LNKTYPE)), "not a regular file"),
    "device": (lambda: _with(("artifacts/evidence/d", None, tarfile.CHRTYPE)), "not a regular file"),
    "directory entry": (lambda: _with(("artifacts/evidence/dir", None, tarfile.DIRTYPE)), "not a regular file"),
    "duplicate": (lambda: _with(("run.json", _run_json(), tarfile.REGTYPE)), "appears twice"),
    "missing grading": (lambda: GOOD[:1] + GOOD[2:], "grading.json is missing"),
    "another run": (lambda: [("run.json", _run_json("run-" + "f" * 20), tarfile.REGTYPE),
                             ("grading.json", _grading("run-" + "f" * 20), tarfile.REGTYPE)], "not the expected"),
    "not terminal": (lambda: [("run.json", _run_json(state="RUNNING"), tarfile.REGTYPE),
                              ("grading.json", _grading(), tarfile.REGTYPE)], "not a graded terminal run"),
    "grading disagrees": (lambda: [("run.json", _run_json(state="SUCCEEDED"), tarfile.REGTYPE),
                                   ("grading.json", _grading(status="FAILED"), tarfile.REGTYPE)],
                          "not a graded terminal run"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_exports_are_refused(tmp_path: Path, case: str) -> None:
    members, rule = HOSTILE[case]
    with pytest.raises(CheckFailed, match=rule):
        import_run(_tar(members()), tmp_path / "run", RUN_ID)
    assert not (tmp_path / "etc").exists() and not (tmp_path / "x").exists()


def test_not_a_tar_and_truncated(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match="not a valid tar stream"):
        import_run(io.BytesIO(b"not a tar at all" * 100), tmp_path / "a", RUN_ID)
    whole = _tar(GOOD).getvalue()
    with pytest.raises(CheckFailed):
        import_run(io.BytesIO(whole[:700]), tmp_path / "b", RUN_ID)


def test_destination_must_be_new_or_empty_and_the_run_id_well_formed(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "run.json").write_text("{}")
    with pytest.raises(ValidationError, match="RUN_DIR"):
        import_run(_tar(GOOD), used, RUN_ID)
    with pytest.raises(ValidationError, match="--run-id"):
        import_run(_tar(GOOD), tmp_path / "new", "run-../x")


def test_unpacking_makes_each_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory is asked for once, not once per member in it (a 164-task run's export has thousands of members);
    every member still lands, written O_EXCL."""
    trials = [(f"artifacts/evidence/harbor/t{i}/{name}", b"{}", tarfile.REGTYPE)
              for i in range(3) for name in ("result.json", "config.json", "trial.log")]
    attempts: list[str] = []
    real = os.mkdir

    def counting(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        attempts.append(str(path))
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", counting)
    dest = import_run(_tar([*GOOD[:2], *trials]), tmp_path / "run", RUN_ID)
    monkeypatch.undo()
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(
        ["run.json", "grading.json", *(name for name, _, _ in trials)])
    # t0's parents fail once each before they are made (ENOENT), then are made; nothing is asked for again.
    assert max(Counter(attempts).values()) <= 2, Counter(attempts).most_common(3)
