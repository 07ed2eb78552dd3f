"""CLI start-up benchmark: ``benchseal --help`` and what each lazily imported stage would add.

    .venv/bin/python bench/cli.py [--runs N] [--against OTHER_CHECKOUT]

Every figure is the median of N fresh interpreters (default 9). ``--against`` runs the same
``--help`` with another checkout's ``pipeline`` first on sys.path (e.g. main before a change) and
prints the ratio. The second table is the cost of each stage a CLI verb imports lazily, measured
on top of what ``pipeline.cli.main`` already imports: the figures the ``# lazy:`` comments cite.
Prints figures only; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
from pathlib import Path

print = functools.partial(print, flush=True)
ROOT = Path(__file__).resolve().parent.parent

# The stages CLI verbs import inside their commands (pipeline/cli/*.py, '# lazy:').
LAZY_STAGES = (
    "pipeline.api.app, uvicorn", "pipeline.attest", "pipeline.dispatch", "pipeline.evidence",
    "pipeline.evidence.signing", "pipeline.imaging", "pipeline.infra.accept", "pipeline.infra.trial",
    "pipeline.infra.worker", "pipeline.publish.outbox", "pipeline.publish.seal", "pipeline.publish.service",
    "pipeline.publish.targets", "pipeline.release.local", "pipeline.verify", "pipeline.verify.policy",
)
_TIMED = "import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"


def _median_ms(code: str, root: Path, runs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    values = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        values.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(values) * 1000


def help_ms(root: Path, runs: int) -> float:
    """Wall time of ``benchseal --help`` in a fresh interpreter (import + parse + render)."""
    code = ("import sys, time; t = time.perf_counter(); sys.argv = ['benchseal', '--help']\n"
            "from pipeline.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(time.perf_counter() - t)")
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100"}
    values = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        values.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(values) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--against", type=Path, help="another checkout (its pipeline/ is imported instead)")
    args = parser.parse_args()

    now = help_ms(ROOT, args.runs)
    print(f"benchseal --help: {now:.0f} ms (median of {args.runs}, {ROOT})")
    if args.against is not None:
        before = help_ms(args.against.resolve(), args.runs)
        print(f"benchseal --help: {before:.0f} ms (median of {args.runs}, {args.against})")
        print(f"ratio this / other: {now / before:.2f}")

    base = _median_ms(_TIMED.format(code="import pipeline.cli.main"), ROOT, args.runs)
    print(f"\nimport pipeline.cli.main: {base:.0f} ms")
    print("what each lazily imported stage would add at CLI start:")
    for stage in LAZY_STAGES:
        code = f"import pipeline.cli.main; {_TIMED.format(code=f'import {stage}')}"
        print(f"  {stage:32} +{_median_ms(code, ROOT, args.runs):.0f} ms")


if __name__ == "__main__":
    main()
