"""Issue 38 (fewer steps): ``benchseal init --infra`` in an infra repository's checkout writes its caller of
benchseal's benchmark.yml (pinned), policies/infra.yaml (each --source with the agent detected in its checkout)
and suites/smoke, which ``doctor infra``'s own checks pass; the variables and secrets ``init`` prints are the
ones ``doctor`` checks (one home, ``pipeline.core.doctor.SETTINGS``). Run in this process as the CLI runs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.cli.init import Detected, github_list
from pipeline.cli.init_infra import _EXAMPLE_AGENT, _EXAMPLE_SOURCE, EXAMPLE, POLICY_PATH
from pipeline.core.doctor import SETTINGS
from pipeline.dispatch.doctor import REQUIRED, find_caller
from pipeline.host.doctor import checkout_place, policy_findings, suites_findings
from pipeline.infra.intake.policy import ReleaseAgentPolicy, load_policy
from tests.fixtures.cli import run_benchseal

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _checkout(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "-C", str(path), "init", "-q"], check=True)
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    return path


def _init(where: Path, *args: str, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_benchseal(where, "init", *args, monkeypatch=monkeypatch, capsys=capsys)


def test_init_infra_writes_what_doctor_infra_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    python = _checkout(tmp_path / "widget", {"pyproject.toml": '[project]\nname = "widget-agent"\nversion = "1.0.0"\n'})
    npm = _checkout(tmp_path / "tern", {"package.json": json.dumps({"name": "@acme/tern-cli", "version": "1.0.0",
                                                                     "bin": {"tern": "cli.js"}})})
    infra = _checkout(tmp_path / "bench-infra")
    code, out, err = _init(infra, "--infra", "--benchseal-commit", COMMIT, "--source", "Acme/Widget", "--source-dir",
                           str(python), "--source", "acme/tern", "--source-dir", str(npm),
                           monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert "secret BENCHSEAL_PUBLISH_TOKEN = " in out
    # The caller is found and pinned as doctor infra reads it.
    assert find_caller(infra, "benchmark.yml") == (".github/workflows/benchmark.yml", COMMIT)
    policy = load_policy(infra / POLICY_PATH)
    assert [s.repository for s in policy.sources] == ["Acme/Widget", "acme/tern"]
    assert {signer.builder for s in policy.sources for signer in s.signer} == {
        f"benchseal/benchseal/.github/workflows/release.yml@{COMMIT}"}
    agents = {a.name: (a.kind, a.package) for a in policy.agents if isinstance(a, ReleaseAgentPolicy)}
    assert agents == {"widget-agent": ("python", "widget-agent"), "tern-cli": ("npm", "@acme/tern-cli")}
    assert "BENCHSEAL_COMMIT" not in (infra / POLICY_PATH).read_text()
    # doctor infra's policy and suite checks (the host's code) pass for each adopter.
    place = checkout_place(infra)
    for source in ("acme/widget", "acme/tern"):
        found, loaded = policy_findings(place, source)
        assert loaded is not None and [f.line() for f in found if f.status != "ok"] == [], source
        assert [f.line() for f in suites_findings(place, loaded) if f.status != "ok"] == []
    # Nothing overwritten without --force; with it, the example's entries when no --source is given.
    code, _, err = _init(infra, "--infra", "--benchseal-commit", COMMIT, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "already exist" in err and len(err.strip().splitlines()) == 1
    code, out, err = _init(infra, "--infra", "--force", "--benchseal-commit", COMMIT, monkeypatch=monkeypatch,
                           capsys=capsys)
    assert code == 0, err
    assert "replace the example adopter acme/widget" in out
    assert [s.repository for s in load_policy(infra / POLICY_PATH).sources] == ["acme/widget"]


@pytest.mark.parametrize("args, needle", [
    (["--source", "acme/widget", "--source-dir", "."], "pass --infra"),
    (["--infra", "--source", "acme/widget"], "invalid --source-dir: one per --source"),
    (["--infra", "--source", "not a repo", "--source-dir", "."], "invalid --source"),
    (["--infra", "--kind", "npm"], "--kind is detected in each --source-dir"),
])
def test_init_infra_refuses_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    infra = _checkout(tmp_path / "bench-infra")
    code, _, err = _init(infra, *args, "--benchseal-commit", COMMIT, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (infra / POLICY_PATH).exists()


def test_the_example_holds_the_entries_init_replaces() -> None:
    text = (EXAMPLE / POLICY_PATH).read_text()
    assert _EXAMPLE_SOURCE in text and _EXAMPLE_AGENT in text


def test_init_prints_the_settings_doctor_checks() -> None:
    """One home: every variable and secret doctor requires is in init's list, and nothing else of that form."""
    detected = Detected(kind="python", name="a", package="a", version="1", toml="")
    printed = {m.group(1, 2) for line in github_list(detected, "acme/widget", COMMIT)
               if (m := re.match(r"(variable|secret) ([A-Z_]+) = ", line))}
    required = {(kind[:-1], name) for kind, names in REQUIRED["adopter"].items() for name in names}
    assert printed == required == {(s.kind, s.name) for s in SETTINGS["adopter"]}
    assert REQUIRED["infra"] == {"variables": (), "secrets": ("BENCHSEAL_PUBLISH_TOKEN",)}
