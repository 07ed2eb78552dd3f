"""CLI start-up benchmark: ``benchseal --help`` and what each lazily imported stage would add.

    .venv/bin/python bench/cli.py [--runs N] [--against OTHER_CHECKOUT]

Every figure is the median of N fresh interpreters (default 9); `benchseal --help` is timed through
the installed launcher, interpreter start included. ``--against`` runs the same
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
import time
from pathlib import Path

print = functools.partial(print, flush=True)
ROOT = Path(__file__).resolve().parent.parent

# The stages CLI verbs import inside their commands (pipeline/cli/*.py, '# lazy:').
LAZY_STAGES = (
    "pipeline.api.app, uvicorn", "pipeline.attest.images", "pipeline.dispatch.client", "pipeline.evidence.writer",
    "pipeline.evidence.signing", "pipeline.imaging.build", "pipeline.infra.intake.accept", "pipeline.runner.trial",
    "pipeline.infra.worker.loop", "pipeline.publish.outbox", "pipeline.publish.seal", "pipeline.publish.service",
    "pipeline.publish.targets", "pipeline.local.release", "pipeline.verify.release", "pipeline.verify.policy",
)
# What verbs import at module level, measured alone (on top of typer and the document layer).
EAGER_STAGES = ("pipeline.local.model_server", "pipeline.infra.queue.sql", "pipeline.infra.worker.export", "pipeline.host.install", "pipeline.local.registry")
_BASE = "import typer, rich, pipeline.core.contracts, pipeline.core.documents, pipeline.core.errors, pipeline.core.paths"
_TIMED = "import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"


def _median_ms(code: str, root: Path, runs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    values = []
    for _ in range(runs):
        # -P: no current directory on sys.path, so PYTHONPATH's checkout is the one imported.
        out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
        values.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(values) * 1000


def help_ms(roots: list[Path], runs: int) -> list[float]:
    """Wall time of ``benchseal --help`` (the installed launcher, interpreter start included) per checkout,
    the checkouts taking turns so that load on the machine hits them alike."""
    launcher = Path(sys.executable).with_name("benchseal")
    values: list[list[float]] = [[] for _ in roots]
    for _ in range(runs):
        for index, root in enumerate(roots):
            env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100"}
            start = time.perf_counter()
            subprocess.run([str(launcher), "--help"], env=env, capture_output=True, check=True)
            values[index].append(time.perf_counter() - start)
    return [statistics.median(v) * 1000 for v in values]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--against", type=Path, help="another checkout (its pipeline/ is imported instead)")
    args = parser.parse_args()

    roots = [ROOT] if args.against is None else [ROOT, args.against.resolve()]
    figures = help_ms(roots, args.runs)
    for root, ms in zip(roots, figures, strict=True):
        print(f"benchseal --help: {ms:.0f} ms (median of {args.runs}, {root})")
    if len(figures) == 2:
        print(f"ratio this / other: {figures[0] / figures[1]:.2f}")

    base = _median_ms(_TIMED.format(code="import pipeline.cli.main"), ROOT, args.runs)
    print(f"\nimport pipeline.cli.main: {base:.0f} ms")
    print("what each lazily imported stage would add at CLI start:")
    for stage in LAZY_STAGES:
        code = f"import pipeline.cli.main; {_TIMED.format(code=f'import {stage}')}"
        print(f"  {stage:32} +{_median_ms(code, ROOT, args.runs):.0f} ms")
    print("what each module-level stage import costs on top of typer and the document layer:")
    for stage in EAGER_STAGES:
        code = f"{_BASE}; {_TIMED.format(code=f'import {stage}')}"
        print(f"  {stage:32} +{_median_ms(code, ROOT, args.runs):.0f} ms")


if __name__ == "__main__":
    main()
