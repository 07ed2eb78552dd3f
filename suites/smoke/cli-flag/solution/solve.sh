#!/bin/bash
set -euo pipefail
cat > /app/wc.py <<'PY'
"""Count the words (or lines) of a file."""

import argparse


def main(argv=None):
    parser = argparse.ArgumentParser(prog="wc.py")
    parser.add_argument("--lines", action="store_true", help="count lines instead of words")
    parser.add_argument("path")
    args = parser.parse_args(argv)
    with open(args.path, encoding="utf-8") as handle:
        text = handle.read()
    print(len(text.splitlines()) if args.lines else len(text.split()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
PY
