"""deploy/: the unit files parse cleanly and name real commands and options; the sudo rule
admits only the accept wrapper, and the wrapper only reads a payload from stdin."""

from __future__ import annotations

import configparser
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.host_tools import require

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
UNITS = ["benchseal-worker.service", "benchseal-publisher.service"]


def _local(text: str) -> str:
    return (text.replace("/opt/benchseal/.venv/bin/", f"{VENV_BIN}/").replace("/opt/benchseal", str(REPO))
            .replace("/etc/benchseal/infra.yaml", str(REPO / "policies" / "infra.yaml")))


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / name).read_text())
    return parser


@pytest.mark.parametrize("name", UNITS)
def test_unit_execstart_is_a_real_command(name: str) -> None:
    unit = _unit(name)
    argv = shlex.split(_local(unit["Service"]["ExecStart"]))
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr  # an unknown option would exit 2
    assert unit["Service"]["User"] == "benchseal" and unit["Service"]["NoNewPrivileges"] == "yes"
    assert "Environment=BENCHSEAL_HOME=/var/lib/benchseal" in (DEPLOY / name).read_text()
    assert "TOKEN" not in unit["Service"]["ExecStart"] and "KEY" not in unit["Service"]["ExecStart"]


@pytest.mark.parametrize("name", UNITS)
def test_unit_has_no_systemd_warnings(name: str, tmp_path: Path) -> None:
    analyze = require("systemd-analyze", "systemd")
    text = _local((DEPLOY / name).read_text()).replace("User=benchseal", "User=root").replace(
        "Group=benchseal", "Group=root")
    unit = tmp_path / name
    unit.write_text(text)
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60)
    warnings = [line for line in (done.stderr + done.stdout).splitlines() if str(unit) in line]
    assert done.returncode == 0 and warnings == []


def test_worker_stop_timeout_covers_the_term_grace() -> None:
    service = _unit("benchseal-worker.service")["Service"]
    grace = float(shlex.split(service["ExecStart"])[shlex.split(service["ExecStart"]).index("--term-grace") + 1])
    assert float(service["TimeoutStopSec"]) > grace + 30


def test_sudoers_admits_only_the_wrapper_without_arguments() -> None:
    text = (DEPLOY / "benchseal.sudoers").read_text()
    rules = [line for line in text.splitlines() if line.strip() and not line.startswith(("#", "Defaults"))]
    assert rules == ['github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-accept ""',
                     'github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-status ""']
    visudo = require("visudo", "sudo")
    done = subprocess.run([visudo, "-cf", str(DEPLOY / "benchseal.sudoers")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_accept_wrapper_reads_stdin_only(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    wrapper = tmp_path / "benchseal-accept"
    wrapper.write_text(_local((DEPLOY / "benchseal-accept").read_text()).replace("/var/lib/benchseal", str(home)))
    wrapper.chmod(0o755)
    refused = subprocess.run([str(wrapper), "--db", "/tmp/other.sqlite3"], capture_output=True, text=True,
                             check=False, input="{}")
    assert refused.returncode == 2 and "takes no arguments" in refused.stderr
    payload = json.dumps(make_payload(correlation_id="deploy-wrapper-0001"))
    first = subprocess.run([str(wrapper)], input=payload, capture_output=True, text=True, check=False, timeout=60)
    again = subprocess.run([str(wrapper)], input=payload, capture_output=True, text=True, check=False, timeout=60)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["created"] is True and json.loads(again.stdout)["created"] is False
    assert (home / "infra" / "queue.sqlite3").is_file()
    bad = subprocess.run([str(wrapper)], input=payload.replace("sha256:", "sha256:X"), capture_output=True,
                         text=True, check=False, timeout=60)
    assert bad.returncode == 2 and "invalid payload." in bad.stderr


def test_status_wrapper_reads_one_run_id_from_stdin(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    accept = tmp_path / "benchseal-accept"
    status = tmp_path / "benchseal-status"
    for path, name in ((accept, "benchseal-accept"), (status, "benchseal-status")):
        path.write_text(_local((DEPLOY / name).read_text()).replace("/var/lib/benchseal", str(home)))
        path.chmod(0o755)
    payload = json.dumps(make_payload(correlation_id="deploy-status-0001"))
    accepted = subprocess.run([str(accept)], input=payload, capture_output=True, text=True, check=False, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    run_id = json.loads(accepted.stdout)["run_id"]
    shown = subprocess.run([str(status)], input=run_id + "\n", capture_output=True, text=True, check=False, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "QUEUED" and json.loads(shown.stdout)["run_id"] == run_id
    for hostile in ("", "run-../../etc", run_id + " --db /tmp/x", run_id.upper(), "run-" + "0" * 19):
        refused = subprocess.run([str(status)], input=hostile + "\n", capture_output=True, text=True, check=False)
        assert refused.returncode == 2 and "invalid run id" in refused.stderr, hostile
    with_args = subprocess.run([str(status), run_id], input="", capture_output=True, text=True, check=False)
    assert with_args.returncode == 2 and "takes no arguments" in with_args.stderr
