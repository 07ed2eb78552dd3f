"""Print the mutation score of `make mutate` per module and fail under the target (issue 39.3).

Reads the results mutmut keeps beside each mutated file (mutants/<path>.meta) and names every survivor, so
each one is either killed by a new test or listed as equivalent in docs/architecture.md ("Mutation testing").
Usage: mutation_score.py [--target PERCENT] [PATH_PREFIX ...]   (prefixes narrow the modules counted)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

MUTANTS = Path("mutants")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=90.0, help="the least killed percentage that passes")
    parser.add_argument("prefixes", nargs="*", help="count only mutants of files under these paths")
    args = parser.parse_args()
    metas = sorted(MUTANTS.glob("pipeline/**/*.py.meta"))
    if not metas:
        print("mutation score: no mutmut results under mutants/ (run `make mutate` first)", file=sys.stderr)
        return 1
    total: Counter[str] = Counter()
    survivors: list[str] = []
    for meta in metas:
        source = meta.relative_to(MUTANTS).as_posix().removesuffix(".meta")
        if args.prefixes and not any(source.startswith(p) for p in args.prefixes):
            continue
        codes = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
        counts = Counter(status_by_exit_code[code] for code in codes.values())
        if not counts or counts["not checked"] == sum(counts.values()):
            continue
        total.update(counts)
        survivors += [name for name, code in codes.items() if status_by_exit_code[code] in ("survived", "no tests")]
        print(f"{source}: {_line(counts)}")
    checked = sum(total.values()) - total["not checked"] - total["skipped"]
    if checked == 0:
        print("mutation score: no checked mutant in the modules asked for", file=sys.stderr)
        return 1
    for name in survivors:
        print(f"  not killed: {name}  (mutmut show {name})")
    score = 100.0 * (total["killed"] + total["caught by type check"]) / checked
    print(f"total: {_line(total)}; {score:.1f} % killed (target {args.target:.0f} %)")
    return 0 if score >= args.target else 1


def _line(counts: Counter[str]) -> str:
    shown = ("killed", "survived", "no tests", "timeout", "suspicious", "segfault", "not checked")
    return ", ".join(f"{counts[s]} {s}" for s in shown if counts[s]) or "none"


if __name__ == "__main__":
    sys.exit(main())
