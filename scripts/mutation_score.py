"""Print the mutation score of `make mutate` per module and fail under the target (issue 39.3).

Reads the results mutmut keeps beside each mutated file (mutants/<path>.meta) and names every mutant not killed,
so each one is either killed by a new test or listed as equivalent in docs/mutation-equivalents.md. A listed
mutant counts as equivalent only while mutmut's diff of it still shows the listed change (mutant numbers move
when their function changes); a stale entry is reported and the mutant counts as survived.

Score of a module: detected / (checked - equivalent), where detected is killed, caught by the type check or
timed out (the tests did not pass), and checked leaves out what mutmut has not run yet.

Usage: mutation_score.py [--target PERCENT] [SELECTOR ...]
A selector is a path prefix (pipeline/core/contracts.py) or mutmut's own name pattern ('pipeline.core.contracts.*',
what `make mutate MUTANTS=...` passes on); without one, every module with results is counted.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from collections import Counter
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

MUTANTS = Path("mutants")
EQUIVALENTS = Path("docs/mutation-equivalents.md")
# - `pipeline.core.contracts.x_sri_problem__mutmut_4` `value.rpartition("-")`: why no test can tell it apart
_ENTRY = re.compile(r"^- `(?P<name>[^`\s]+)` `(?P<change>[^`]+)`: (?P<reason>\S.*)$")
DETECTED = ("killed", "caught by type check", "timeout")
SHOWN = ("killed", "timeout", "equivalent", "survived", "no tests", "suspicious", "segfault", "not checked")


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """Mutant name -> the text its mutated line must contain, from the list's entries."""
    if not path.is_file():
        return {}
    found = (_ENTRY.match(line) for line in path.read_text("utf-8").splitlines())
    return {m["name"]: m["change"] for m in found if m}


def _selected(name: str, source: str, selectors: list[str]) -> bool:
    if not selectors:
        return True
    return any(fnmatch.fnmatchcase(name, s) if "." in s and "/" not in s else source.startswith(s) for s in selectors)


def _still_listed_change(name: str, source: str, change: str) -> bool:
    try:
        diff = get_diff_for_mutant(name, path=source)
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return any(line.startswith("+") and not line.startswith("+++") and change in line for line in diff.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--target", type=float, default=90.0, help="the least detected percentage that passes")
    parser.add_argument("selectors", nargs="*", help="path prefixes or mutmut name patterns of the mutants counted")
    args = parser.parse_args()
    metas = sorted(MUTANTS.glob("pipeline/**/*.py.meta"))
    if not metas:
        print("mutation score: no mutmut results under mutants/ (run `make mutate` first)", file=sys.stderr)
        return 1
    equivalents = load_equivalents()
    total: Counter[str] = Counter()
    not_killed: list[str] = []
    stale: list[str] = []
    print(f"{'module':<44} {'checked':>7} {'detected':>8} {'equiv':>5} {'survived':>8} {'no tests':>8} "
          f"{'unchecked':>9} {'score':>7}")
    for meta in metas:
        source = meta.relative_to(MUTANTS).as_posix().removesuffix(".meta")
        codes = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
        counts: Counter[str] = Counter()
        for name, code in codes.items():
            if not _selected(name, source, args.selectors):
                continue
            status = status_by_exit_code[code]
            if status in ("survived", "no tests") and name in equivalents:
                if _still_listed_change(name, source, equivalents[name]):
                    status = "equivalent"
                else:
                    stale.append(name)
            if status not in (*DETECTED, "equivalent", "not checked", "skipped"):
                not_killed.append(name)
            counts[status] += 1
        if not counts or counts["not checked"] == sum(counts.values()):
            continue
        total.update(counts)
        print(_row(source, counts))
    if not total:
        print("mutation score: no checked mutant in the modules asked for", file=sys.stderr)
        return 1
    print(_row("total", total))
    for name in not_killed:
        print(f"  not killed: {name}  (.venv/bin/mutmut show {name})")
    for name in stale:
        print(f"  stale entry in {EQUIVALENTS}: {name} no longer shows the listed change (counted as not killed)")
    score = _score(total)
    print(f"total: {', '.join(f'{total[s]} {s}' for s in SHOWN if total[s])}; {score:.1f} % detected "
          f"(target {args.target:.0f} %)")
    return 0 if score >= args.target else 1


def _checked(counts: Counter[str]) -> int:
    return sum(counts.values()) - counts["not checked"] - counts["skipped"]


def _score(counts: Counter[str]) -> float:
    denominator = _checked(counts) - counts["equivalent"]
    return 100.0 * sum(counts[s] for s in DETECTED) / denominator if denominator else 0.0


def _row(label: str, counts: Counter[str]) -> str:
    return (f"{label:<44} {_checked(counts):>7} {sum(counts[s] for s in DETECTED):>8} {counts['equivalent']:>5} "
            f"{counts['survived'] + counts['suspicious'] + counts['segfault']:>8} {counts['no tests']:>8} "
            f"{counts['not checked']:>9} {_score(counts):>6.1f}%")


if __name__ == "__main__":
    sys.exit(main())
