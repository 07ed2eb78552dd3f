"""One home for the infra policy (issue 38.7), on the host side: ``host install --infra-checkout DIR`` installs the
infra repository's policies/infra.yaml as /etc/benchseal/infra.yaml (an edit made on the host is replaced, never
kept) and its suites where the worker reads them; the installed policy then has exactly the digest benchmark.yml's
accept step sends for that commit, and doctor host passes on it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.host import install as hi
from pipeline.host.doctor import HostOptions, check_host
from pipeline.infra.intake.policy_home import check_policy_home, policy_digest
from tests.fixtures.hostfs import root_fs

REPO = Path(__file__).resolve().parents[2]
RUNNER = "actions-ci"


def _infra_checkout(tmp_path: Path) -> Path:
    """An infra repository's files as `benchseal init --infra` writes them (the example policy, benchseal's smoke)."""
    checkout = tmp_path / "bench-infra"
    (checkout / "policies").mkdir(parents=True)
    policy = (REPO / "examples/bench-infra/policies/infra.yaml").read_text()
    (checkout / "policies/infra.yaml").write_text(policy.replace("BENCHSEAL_COMMIT", "0" * 40))
    shutil.copytree(REPO / "suites/smoke", checkout / "suites/smoke")
    return checkout


def _install(root: Path, checkout: Path | None) -> hi.InstallReport:
    return hi.install(hi.InstallOptions(runner_user=RUNNER, prefix=root, infra_checkout=checkout))


@pytest.mark.needs_root("host install creates users and root-owned files")
def test_the_host_policy_and_suites_are_the_infra_repositorys(tmp_path: Path) -> None:
    root, checkout = root_fs(tmp_path, RUNNER), _infra_checkout(tmp_path)
    host_policy, host_suite = root / "etc/benchseal/infra.yaml", root / "opt/benchseal/suites/smoke"
    _install(root, None)  # a host installed before, with the shipped policy
    host_policy.write_text(host_policy.read_text() + "# edited on the host\n")
    report = _install(root, checkout)
    assert host_policy.read_bytes() == (checkout / "policies/infra.yaml").read_bytes()  # the edit is gone, not kept
    assert not (root / "etc/benchseal/infra.yaml.benchseal-new").exists() and report.warnings == ()
    digest = policy_digest(checkout / "policies/infra.yaml")
    assert check_policy_home(host_policy, digest) == host_policy  # what accept checks for that commit
    updated = next(a for a in report.actions if a.path == "/etc/benchseal/infra.yaml")
    assert updated.action == "updated" and digest in updated.detail
    files = sorted(p.relative_to(host_suite) for p in host_suite.rglob("*"))
    assert files == sorted(p.relative_to(checkout / "suites/smoke") for p in (checkout / "suites/smoke").rglob("*"))
    assert all(p.stat().st_uid == 0 and not p.stat().st_mode & 0o022 for p in host_suite.rglob("*"))
    assert "--infra-checkout" in " ".join(report.manual_steps) and "Never edit" in " ".join(report.manual_steps)
    # What doctor host reads there passes (the policy's agents, the suite by its pinned digest).
    found = check_host(HostOptions(prefix=root, offline=True))
    assert [f.line() for f in found if f.check.startswith(("policy", "suite")) and f.status != "ok"] == []

    assert "the running worker uses it from its next claim, without a restart" in " ".join(report.manual_steps)
    # A second run changes nothing (and says nothing of the policy changing); a suite changed in the repository is replaced.
    second = _install(root, checkout)
    assert not second.changed and "The policy changed" not in " ".join(second.manual_steps)
    task = sorted(p for p in (checkout / "suites/smoke").rglob("*") if p.is_file())[0]
    task.write_text(task.read_text() + "\n# changed in the repository\n")
    again = _install(root, checkout)
    assert [a.action for a in again.actions if a.path == "/opt/benchseal/suites/smoke"] == ["updated"]
    assert (host_suite / task.relative_to(checkout / "suites/smoke")).read_text() == task.read_text()
    # The host's policy edited again: accept refuses it for the repository's digest.
    host_policy.write_text(host_policy.read_text() + "# edited on the host\n")
    with pytest.raises(CheckFailed, match=r"not the infra repository's policies/infra\.yaml"):
        check_policy_home(host_policy, digest)


@pytest.mark.needs_root("host install creates users and root-owned files")
def test_a_suite_that_is_a_link_is_refused_and_the_cli_takes_the_option(tmp_path: Path) -> None:
    root, checkout = root_fs(tmp_path, RUNNER), _infra_checkout(tmp_path)
    (checkout / "suites/linked").symlink_to(checkout / "suites/smoke")
    done = subprocess.run([sys.executable, "-m", "pipeline", "host", "install", "--runner-user", RUNNER, "--prefix",
                           str(root), "--infra-checkout", str(checkout), "--json"], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().endswith("suites/linked is not a directory (each suite is one)")
    (checkout / "suites/linked").unlink()
    done = subprocess.run([sys.executable, "-m", "pipeline", "host", "install", "--runner-user", RUNNER, "--prefix",
                           str(root), "--infra-checkout", str(checkout), "--json"], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {"path": "/opt/benchseal/suites/smoke", "action": "created",
            "detail": f"from {checkout}/suites/smoke"} in json.loads(done.stdout)["actions"]


def test_a_directory_without_the_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="--infra-checkout: must be a checkout of the infra repository"):
        _install(tmp_path, tmp_path)
