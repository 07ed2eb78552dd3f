"""deploy/: the unit files parse cleanly and name real commands and options; the sudo rule
admits only the accept, status and export wrappers, each reading only stdin; the worker
service grades and never signs."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.host_tools import require

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
UNITS = ["benchseal-worker.service", "benchseal-publisher.service"]


def _local(text: str) -> str:
    return (text.replace("/opt/benchseal/.venv/bin/", f"{VENV_BIN}/").replace("/opt/benchseal", str(REPO))
            .replace("/etc/benchseal/infra.yaml", str(REPO / "policies" / "infra.yaml")))


def _stdin(payload: str, policy: Path = REPO / "policies" / "infra.yaml") -> str:
    """What benchmark.yml's accept step sends the wrapper: the dispatching commit's policy digest, then the payload."""
    return f"sha256:{hashlib.sha256(policy.read_bytes()).hexdigest()}\n{payload}"


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
    # The sandbox unit the worker requires is verified beside it.
    sandbox_unit = tmp_path / "benchseal-sandbox.service"
    sandbox_unit.write_text(_local((DEPLOY / sandbox_unit.name).read_text()))
    done = subprocess.run([analyze, "verify", str(unit), str(sandbox_unit)], capture_output=True, text=True,
                          check=False, timeout=60)
    warnings = [line for line in (done.stderr + done.stdout).splitlines() if str(tmp_path) in line]
    assert done.returncode == 0 and warnings == [], done.stderr + done.stdout


def test_sandbox_unit_starts_the_sandbox_for_the_worker_user() -> None:
    from pipeline.infra.sandbox import engine as sandbox

    text = (DEPLOY / "benchseal-sandbox.service").read_text()
    service = _unit("benchseal-sandbox.service")["Service"]
    controller = "BENCHSEAL_SANDBOX_CONTROLLER=benchseal"
    assert f"Environment={controller}" in text and "User=" not in text  # root sets up the namespaces
    argv = shlex.split(_local(service["ExecStart"]).replace("${BENCHSEAL_SANDBOX_CONTROLLER}", "benchseal"))
    assert argv[-4:] == ["sandbox", "start", "--controller", "benchseal"]
    done = subprocess.run([*argv[:-2], "--help"], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0 and "--controller" in done.stdout, done.stderr
    assert service["PIDFile"] == str(sandbox.DEFAULT_DIR / "sandbox.pid") and service["Type"] == "forking"
    # The sandbox shares the worker's state dir and, with TMPDIR inside it, nothing else.
    worker = (DEPLOY / "benchseal-worker.service").read_text()
    for line in ("Environment=BENCHSEAL_HOME=/var/lib/benchseal", "Environment=TMPDIR=/var/lib/benchseal/tmp"):
        assert line in text and line in worker
    assert "Requires=docker.service benchseal-sandbox.service" in worker
    assert "AmbientCapabilities=CAP_CHOWN\n" in worker and "CapabilityBoundingSet=CAP_CHOWN\n" in worker


def test_sandbox_unit_has_no_systemd_warnings(tmp_path: Path) -> None:
    analyze = require("systemd-analyze", "systemd")
    unit = tmp_path / "benchseal-sandbox.service"
    unit.write_text(_local((DEPLOY / unit.name).read_text()))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60)
    warnings = [line for line in (done.stderr + done.stdout).splitlines() if str(unit) in line]
    assert done.returncode == 0 and warnings == [], done.stderr + done.stdout


def test_worker_stop_timeout_covers_the_term_grace() -> None:
    service = _unit("benchseal-worker.service")["Service"]
    grace = float(shlex.split(service["ExecStart"])[shlex.split(service["ExecStart"]).index("--term-grace") + 1])
    assert float(service["TimeoutStopSec"]) > grace + 30


def test_sudoers_admits_only_the_wrapper_without_arguments() -> None:
    text = (DEPLOY / "benchseal.sudoers").read_text()
    rules = [line for line in text.splitlines() if line.strip() and not line.startswith(("#", "Defaults"))]
    assert rules == ['github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-accept ""',
                     'github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-status ""',
                     'github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-export ""',
                     'github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-record ""']
    defaults = [line for line in text.splitlines() if line.startswith("Defaults!")]
    assert len(defaults) == 4 and all("env_reset, !setenv" in line for line in defaults)
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
    payload = json.dumps(make_payload(correlation_id="deploy-wrapper-0001"), indent=1)  # several lines
    first = subprocess.run([str(wrapper)], input=_stdin(payload), capture_output=True, text=True, check=False,
                           timeout=60)
    again = subprocess.run([str(wrapper)], input=_stdin(payload), capture_output=True, text=True, check=False,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["created"] is True and json.loads(again.stdout)["created"] is False
    assert (home / "infra" / "queue.sqlite3").is_file()
    bad = subprocess.run([str(wrapper)], input=_stdin(payload.replace("sha256:", "sha256:X")), capture_output=True,
                         text=True, check=False, timeout=60)
    assert bad.returncode == 2 and "invalid payload." in bad.stderr


@pytest.mark.parametrize("case", ["edited on the host", "no digest line", "not a digest", "under sudo without"])
def test_accept_refuses_a_host_policy_that_is_not_the_dispatching_commits(
        tmp_path: Path, make_payload, case: str) -> None:  # type: ignore[no-untyped-def]
    """One home for the policy: the host's /etc/benchseal/infra.yaml must be, byte for byte, the infra
    repository's policies/infra.yaml at the dispatching commit (its digest is the wrapper's first line);
    anything else is refused before a run is queued."""
    home = tmp_path / "home"
    repository_policy = REPO / "policies" / "infra.yaml"
    host_policy = tmp_path / "infra.yaml"
    host_policy.write_bytes(repository_policy.read_bytes())
    wrapper = tmp_path / "benchseal-accept"
    wrapper.write_text(_local((DEPLOY / "benchseal-accept").read_text()).replace("/var/lib/benchseal", str(home))
                       .replace(str(repository_policy), str(host_policy)))
    wrapper.chmod(0o755)
    payload = json.dumps(make_payload(correlation_id="deploy-policy-0001"))
    env = dict(os.environ)
    stdin = _stdin(payload)
    if case == "edited on the host":  # a comment only: still another file than the repository's
        host_policy.write_text(host_policy.read_text() + "# edited on the host\n")
    elif case == "no digest line":
        stdin = payload
    elif case == "not a digest":
        stdin = "sha256:" + "0" * 63 + "\n" + payload
    else:
        env["SUDO_UID"] = "1000"
        stdin = "\n" + payload
    done = subprocess.run([str(wrapper)], input=stdin, capture_output=True, text=True, check=False, timeout=60, env=env)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    if case == "edited on the host":
        assert done.returncode == 1
        assert f"policy: {host_policy} has digest sha256:" in lines[0]
        assert f"not the infra repository's policies/infra.yaml at the dispatching commit ({stdin.splitlines()[0]})" \
            in lines[0]
    elif case == "under sudo without":
        assert done.returncode == 2 and "invalid --policy-digest: is required under sudo" in lines[0]
    else:
        assert done.returncode == 2 and "invalid --policy-digest:" in lines[0]
    assert not (home / "infra" / "queue.sqlite3").exists()  # nothing queued
    # The same file as the repository's is accepted.
    host_policy.write_bytes(repository_policy.read_bytes())
    env.pop("SUDO_UID", None)
    done = subprocess.run([str(wrapper)], input=_stdin(payload), capture_output=True, text=True, check=False,
                          timeout=60, env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["created"] is True, done.stderr


def test_status_wrapper_reads_one_run_id_from_stdin(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    accept = tmp_path / "benchseal-accept"
    status = tmp_path / "benchseal-status"
    for path, name in ((accept, "benchseal-accept"), (status, "benchseal-status")):
        path.write_text(_local((DEPLOY / name).read_text()).replace("/var/lib/benchseal", str(home)))
        path.chmod(0o755)
    payload = json.dumps(make_payload(correlation_id="deploy-status-0001"))
    accepted = subprocess.run([str(accept)], input=_stdin(payload), capture_output=True, text=True, check=False,
                              timeout=60)
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


def test_worker_service_grades_and_never_signs() -> None:
    """No --publish (so no finalizer, no signer, no outbox row) and nothing that names a signer or
    a Sigstore instance: under systemd there is no OIDC token, benchmark.yml's seal job signs."""
    argv = shlex.split(_unit("benchseal-worker.service")["Service"]["ExecStart"])
    assert argv[1:2] == ["worker"]
    assert not any(a.startswith(("--publish", "--signer", "--with-publisher", "--sigstore", "--trusted-root"))
                   for a in argv), argv


@pytest.mark.parametrize("signer", ["ambient", "auto"])
def test_worker_refuses_an_ambient_signer_without_an_actions_token(tmp_path: Path, signer: str) -> None:
    """Refused at startup (usage, exit 2), before a run is claimed; --signer local is the only way
    a worker outside Actions signs, and only when asked for."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACTIONS_", "GITHUB_"))}
    env["BENCHSEAL_HOME"] = str(tmp_path / "home")
    done = subprocess.run([str(VENV_BIN / "benchseal"), "worker", "--once", "--publish", "github", "--signer", signer],
                          capture_output=True, text=True, check=False, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "needs the GitHub Actions OIDC credential" in done.stderr and "--signer local" in done.stderr
    assert not (tmp_path / "home" / "infra").exists()  # no queue opened, nothing claimed


def _wrappers(tmp: Path, home: Path, *names: str) -> dict[str, Path]:
    """The accept wrapper and ``names`` from deploy/, runnable here: this checkout's venv, ``home`` as the state."""
    wrappers = {}
    for name in ("benchseal-accept", *names):
        wrappers[name] = tmp / name
        wrappers[name].write_text(_local((DEPLOY / name).read_text()).replace("/var/lib/benchseal", str(home)))
        wrappers[name].chmod(0o755)
    return wrappers


def _accepted(wrappers: dict[str, Path], payload: dict[str, Any]) -> str:
    """The run id the accept wrapper gives ``payload``."""
    accepted = subprocess.run([str(wrappers["benchseal-accept"])], input=_stdin(json.dumps(payload)),
                              capture_output=True, text=True, check=False, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    return str(json.loads(accepted.stdout)["run_id"])


def _graded(home: Path, run_id: str, status: str = "FAILED") -> None:
    """Make ``run_id`` terminal the way the worker does (claim, complete with its grading)."""
    from pipeline.core.contracts import GradeCounts, Grading
    from pipeline.infra.queue.sql import SqliteQueue

    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        record = queue.claim("deploy-test-worker", 60)
        assert record is not None and record.run_id == run_id and record.lease_token
        run_dir = queue.run_dir(run_id)
        evidence = run_dir / "artifacts" / "evidence" / "harbor" / "trial-1"
        evidence.mkdir(parents=True)
        (evidence / "result.json").write_text('{"reward": 0}')
        (evidence / "link").symlink_to("/etc/passwd")  # never exported
        grading = Grading(run_id=run_id, status=status, suite="smoke", agent="oracle", reason="refused by policy: x",
                          counts=GradeCounts(total=3, completed=0, resolved=0, unresolved=0, infra_errors=0),
                          score=None, runner_ref=record.payload.runner, api_ref=record.payload.api,
                          started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:01:00Z")
        queue.complete(run_id, record.lease_token, grading, [])


def test_export_wrapper_streams_only_a_graded_run(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    """The seal job's only way to the benchseal user's runs: one run id on stdin, a tar out, only
    once the run is terminal; what it streams unpacks (checked) into exactly that graded run."""
    import io
    import tarfile

    from pipeline.core.errors import CheckFailed
    from pipeline.infra.worker.export import import_run

    home = tmp_path / "home"
    wrappers = _wrappers(tmp_path, home, "benchseal-export")
    run_id = _accepted(wrappers, make_payload(correlation_id="deploy-export-0001"))
    export = wrappers["benchseal-export"]
    queued = subprocess.run([str(export)], input=(run_id + "\n").encode(), capture_output=True, check=False, timeout=60)
    assert queued.returncode == 1 and b"not terminal" in queued.stderr and queued.stdout == b""
    for hostile in ("", "run-../../etc", run_id + " --db /tmp/x", run_id.upper(), "run-" + "0" * 19):
        refused = subprocess.run([str(export)], input=(hostile + "\n").encode(), capture_output=True, check=False)
        assert refused.returncode == 2 and b"invalid run id" in refused.stderr, hostile
    with_args = subprocess.run([str(export), run_id], input=b"", capture_output=True, check=False)
    assert with_args.returncode == 2 and b"takes no arguments" in with_args.stderr

    _graded(home, run_id)
    done = subprocess.run([str(export)], input=(run_id + "\n").encode(), capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        names = sorted(tar.getnames())
    assert names == ["artifacts/evidence/harbor/trial-1/result.json", "grading.json", "run.json"]
    dest = import_run(io.BytesIO(done.stdout), tmp_path / "sealed", run_id)
    assert json.loads((dest / "grading.json").read_text())["status"] == "FAILED"
    assert json.loads((dest / "run.json").read_text())["state"] == "FAILED"
    with pytest.raises(CheckFailed, match="not the expected"):
        import_run(io.BytesIO(done.stdout), tmp_path / "other", "run-" + "0" * 20)


def test_record_wrapper_records_one_checked_summary_digest(tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    """The seal job's way to add a sealed release to the repository's history: one line `RUN_ID sha256:HEX`
    on stdin, checked by the wrapper and again by the queue; the same digest again is a no-op, another
    digest for the run is refused (exit 1), and anything else is a usage error (exit 2) that changes nothing."""
    from pipeline.core.contracts import GradeCounts, Grading, TrialRecord
    from pipeline.infra.intake.policy import load_policy
    from pipeline.infra.queue.sql import SqliteQueue
    from pipeline.infra.worker.history import scored_release

    home = tmp_path / "home"
    wrappers = _wrappers(tmp_path, home, "benchseal-record")
    run_id = _accepted(wrappers, make_payload(correlation_id="deploy-record-0001"))
    record = wrappers["benchseal-record"]
    digest = "sha256:" + "ab" * 32

    def recorded(line: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([str(record)], input=(line + "\n").encode(), capture_output=True, check=False, timeout=60)

    not_scored = recorded(f"{run_id} {digest}")  # accepted, not graded: nothing in the history yet
    assert not_scored.returncode == 2 and b"has no scored release in the history" in not_scored.stderr
    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        claim = queue.claim("deploy-test-worker", 60)
        assert claim is not None and claim.run_id == run_id and claim.lease_token
        grading = Grading(run_id=run_id, status="SUCCEEDED", suite="smoke", agent="oracle",
                          counts=GradeCounts(total=1, completed=1, resolved=1, unresolved=0, infra_errors=0), score=1.0,
                          trials=(TrialRecord(task="hello", trial_name="hello__x", outcome="resolved", reward=1.0,
                                              agent_name="oracle"),),
                          runner_ref=claim.payload.runner, api_ref=claim.payload.api,
                          started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:01:00Z")
        queue.complete(run_id, claim.lease_token, grading, [],
                       release=scored_release(queue, claim, grading, load_policy()))
    for hostile in ("", run_id, f"{run_id} sha256:{'AB' * 32}", f"{run_id} {digest} extra", f"run-../../x {digest}",
                    f"{run_id} sha256:{'ab' * 31}", f"{run_id}  {digest}", f"{run_id} {digest} --db /tmp/x"):
        refused = recorded(hostile)
        assert refused.returncode == 2 and refused.stdout == b"", (hostile, refused.stderr)
    with_args = subprocess.run([str(record), run_id, digest], input=b"", capture_output=True, check=False)
    assert with_args.returncode == 2 and b"takes no arguments" in with_args.stderr
    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        assert [e.summary_digest for e in queue.history("acme/widget")] == [None]  # nothing changed so far
    for _ in range(2):  # idempotent
        done = recorded(f"{run_id} {digest}")
        assert done.returncode == 0 and json.loads(done.stdout) == {"run_id": run_id, "summary_digest": digest}
    other = recorded(f"{run_id} sha256:{'cd' * 32}")
    assert other.returncode == 1 and b"was recorded as" in other.stderr
    with SqliteQueue(home / "infra" / "queue.sqlite3") as queue:
        assert [e.summary_digest for e in queue.history("acme/widget")] == [digest]
