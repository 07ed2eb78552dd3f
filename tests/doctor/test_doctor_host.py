"""``benchseal doctor host`` on a host installed by ``pipeline.host.install`` into a --prefix root, with
the shipped suites where the worker reads them: it passes, then each piece removed is found, one line
each with its fix."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import doctor as cli_doctor
from pipeline.core.doctor import Finding, exit_code
from pipeline.core.errors import ValidationError
from pipeline.host import install as hi
from pipeline.host.doctor import HostOptions, check_host
from pipeline.host.install import SUITES_DIR
from pipeline.infra.queue.sql import SqliteQueue
from tests.fixtures.hostfs import root_fs

REPO = Path(__file__).resolve().parents[2]
RUNNER = "actions-ci"


def _root_fs(tmp_path: Path) -> Path:
    return root_fs(tmp_path, RUNNER)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = _root_fs(tmp_path)
    hi.install(hi.InstallOptions(runner_user=RUNNER, prefix=root))
    shutil.copytree(REPO / "suites", root / "opt/benchseal/suites")
    # A running worker's heartbeat, written by the queue code it polls with (claim: nothing queued).
    state = root / "var/lib/benchseal"
    (state / "infra").mkdir()
    queue = SqliteQueue(state / "infra/queue.sqlite3")
    try:
        queue.claim("worker-1", 60)
    finally:
        queue.close()
    for path in (state / "infra", *(state / "infra").iterdir()):
        os.chown(path, state.stat().st_uid, state.stat().st_gid)
    return root


@pytest.fixture
def sigstore() -> Iterator[str]:
    """Something answering HTTP on 127.0.0.1, as a Sigstore service would (any answer is reachable)."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


def _failed(found: list[Finding]) -> list[str]:
    return [f.line() for f in found if f.status == "missing"]


@pytest.mark.needs_root("host install creates users and root-owned files")
def test_an_installed_host_passes_and_each_removed_piece_is_found(host: Path, sigstore: str) -> None:
    found = check_host(HostOptions(prefix=host, sigstore_url=sigstore))
    assert exit_code(found) == 0, _failed(found)
    # No Docker config yet, and the registry answers anonymously: no credentials needed.
    assert "OK      host: registry credentials for 127.0.0.1:5055: none needed: 127.0.0.1:5055/v2/ answers " \
        "anonymously" in [f.line() for f in found]
    # Offline, the registry is not asked: the packages may be public, so that is not a failure, but it says how to
    # log in.
    found = check_host(HostOptions(prefix=host, offline=True))
    assert "UNKNOWN host: registry credentials for 127.0.0.1:5055: none in /var/lib/benchseal/.docker/config.json: " \
           "fine when the packages are public -> fix: for private packages: `sudo -u benchseal -g docker -H docker " \
           "login 127.0.0.1:5055 --password-stdin` (docs/host.md step 3.2)" in [f.line() for f in found]
    st = (host / "var/lib/benchseal").stat()
    config = host / "var/lib/benchseal/.docker/config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"auths": {"127.0.0.1:5055": {"auth": "dXNlcjpwYXNz"}}}))
    config.chmod(0o600)
    os.chown(config, st.st_uid, st.st_gid)
    found = check_host(HostOptions(prefix=host, sigstore_url=sigstore))
    assert exit_code(found) == 0, _failed(found)
    assert {f.check for f in found if f.status == "ok"} >= {
        "policy", "policy agents", "suites directory", "suite smoke dataset", "unit benchseal-worker.service",
        "queue writable by benchseal", "Sigstore reachable"}
    assert [f.line() for f in found if f.status == "unknown"] == [
        "UNKNOWN host: services running: not checked (no systemctl here, or --prefix)"]

    # A suite whose bytes are not the pinned ones, a unit removed, the queue not writable: one line each.
    task = next(p for p in sorted((host / "opt/benchseal/suites/smoke").rglob("*")) if p.is_file())
    task.write_text(task.read_text() + "\n# edited\n")
    (host / "etc/systemd/system/benchseal-worker.service").unlink()
    (host / "var/lib/benchseal/infra/queue.sqlite3").chmod(0o440)
    config.chmod(0o644)  # the pull token readable by every user of the host
    found = check_host(HostOptions(prefix=host, offline=True))
    failed = _failed(found)
    assert len(failed) == 4, failed
    assert failed[0].startswith("MISSING host: suite smoke dataset: /opt/benchseal/suites/smoke has digest sha256:")
    assert "the policy pins sha256:a2585" in failed[0] and "-> fix: run `benchseal host install --runner-user RUNNER " \
        "--infra-checkout DIR` with a checkout of the infra repository" in failed[0]
    assert failed[1] == (f"MISSING host: registry credentials file: /var/lib/benchseal/.docker/config.json (owner "
                         f"{st.st_uid}, mode 0644) is readable by others than benchseal -> fix: chown benchseal "
                         "/var/lib/benchseal/.docker/config.json && chmod 0600 /var/lib/benchseal/.docker/config.json")
    assert failed[2] == ("MISSING host: unit benchseal-worker.service: not installed -> fix: run `benchseal host install "
                         "--runner-user RUNNER` (docs/host.md step 2)")
    assert failed[3].startswith("MISSING host: queue writable by benchseal: /var/lib/benchseal/infra/queue.sqlite3 "
                                "(owner ")
    assert "mode 0440" in failed[3]
    assert [f.line() for f in found if f.status == "skipped"] == ["SKIPPED host: Sigstore reachable: --offline"]

    # No suites where the worker reads them; a policy that does not parse.
    shutil.rmtree(host / "opt/benchseal/suites")
    assert "MISSING host: suites directory: /opt/benchseal/suites is missing -> fix: run `benchseal host install " \
           "--runner-user RUNNER --infra-checkout DIR` with a checkout of the infra repository (docs/host.md step 2)" \
           in _failed(check_host(HostOptions(prefix=host, offline=True)))
    (host / "etc/benchseal/infra.yaml").write_text("schema: benchseal.infra-policy/v2\nagents: []\n")
    policy = _failed(check_host(HostOptions(prefix=host, offline=True)))[0]
    assert policy.startswith("MISSING host: policy: ") and "-> fix: correct /etc/benchseal/infra.yaml" in policy


@pytest.mark.needs_root("host install creates users and root-owned files")
def test_a_worker_that_polls_but_claims_nothing_is_found_with_why(host: Path) -> None:
    why = ("policy /etc/benchseal/infra.yaml changed and is refused, so no run is claimed until it loads (the policy "
           "loaded before, sha256:" + "1" * 64 + ", is not used in its place): invalid policy infra.yaml: ...")
    queue = SqliteQueue(host / "var/lib/benchseal/infra/queue.sqlite3")
    try:
        queue.worker_problem("worker-1", why)  # what the worker records when its installed policy does not load
        found = [f.line() for f in check_host(HostOptions(prefix=host, offline=True))
                 if f.check == "worker polling the queue"]
        assert found == [f"MISSING host: worker polling the queue: worker-1 claims nothing: {why} -> fix: run "
                         "`benchseal host install --runner-user RUNNER --infra-checkout DIR` with a checkout of the "
                         "infra repository (docs/host.md step 2); the worker loads /etc/benchseal/infra.yaml at its "
                         "next claim, no restart"]
        queue.claim("worker-1", 60)  # the file loads again: its next claim attempt clears it
        assert [f.status for f in check_host(HostOptions(prefix=host, offline=True))
                if f.check == "worker polling the queue"] == ["ok"]
    finally:
        queue.close()


def test_an_empty_root_and_an_unreachable_sigstore_exit_1_and_usage_errors_exit_2(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipeline", "doctor", "host", *args], cwd=REPO,
                              capture_output=True, text=True, check=False, timeout=120)

    done = doctor("--prefix", str(tmp_path), "--sigstore-url", closed)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISSING host: policy: /etc/benchseal/infra.yaml is missing" in done.stdout
    assert f"MISSING host: Sigstore reachable: {closed}: " in done.stdout
    assert "-> fix: allow the host HTTPS to Sigstore" in done.stdout
    bad = doctor("--prefix", "relative", "--offline")
    assert bad.returncode == 2 and bad.stderr == "benchseal: error: invalid --prefix: must be an absolute path (got 'relative')\n"
    # The other bad inputs, refused by the verb before any check (in-process: each CLI start costs ~2.5 s).
    for user, url, field in (("Root!", "https://x", "--service-user"), ("benchseal", "ftp://x", "--sigstore-url")):
        with pytest.raises(ValidationError) as refused:
            cli_doctor.host(prefix=tmp_path, service_user=user, suites_dir=SUITES_DIR, sigstore_url=url,
                            offline=True, as_json=False)
        assert refused.value.exit_code == 2 and refused.value.diagnostics().startswith(f"invalid {field}:")
