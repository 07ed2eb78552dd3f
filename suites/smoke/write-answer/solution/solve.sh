#!/bin/bash
set -euo pipefail
python3 -c 'import pathlib; n = [int(x) for x in pathlib.Path("/app/numbers.txt").read_text().split()]; pathlib.Path("/app/answer.txt").write_text(f"{sum(n)}\n")'
