"""Host setup and the local registry: idempotence and pid-scoped stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.local import registry as reg

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_setup_second_run_changes_nothing() -> None:
    first = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, check=True)
    stamp = (REPO / ".venv" / ".benchseal-stamp").read_text()
    pid_before = reg.status(reg.default_registry())["pid"]
    second = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, check=True)
    acted = [line for line in second.stderr.splitlines() if not line.startswith("[setup] ready:")]
    assert acted == [], f"second setup run acted: {acted!r} (first run said {first.stderr!r})"
    assert (REPO / ".venv" / ".benchseal-stamp").read_text() == stamp
    assert reg.status(reg.default_registry())["pid"] == pid_before
    assert reg.answers(reg.default_registry())


def test_registry_start_status_stop_own_process(tmp_path: Path) -> None:
    env = {**os.environ, "BENCHSEAL_HOME": str(tmp_path), "BENCHSEAL_REGISTRY": f"127.0.0.1:{_free_port()}"}
    cli = [sys.executable, "-m", "pipeline"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, "registry", *args], env=env, cwd=REPO, capture_output=True, text=True)

    assert run("status").returncode == 1
    assert "started" in run("start").stdout
    assert "running" in run("start").stdout  # idempotent
    status = run("status", "--json")
    assert status.returncode == 0 and '"answers": true' in status.stdout
    pid = int((tmp_path / "registry" / "registry.pid").read_text())
    assert "docker-registry" in Path(f"/proc/{pid}/cmdline").read_text()
    assert "stopped" in run("stop").stdout
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run("status").returncode == 1


def test_registry_stop_refuses_foreign_pid(tmp_path: Path) -> None:
    # A pid file pointing at some other process must never get that process killed.
    victim = subprocess.Popen(["sleep", "30"])
    try:
        r = reg.Registry(address=f"127.0.0.1:{_free_port()}", state=tmp_path)
        r.pid_path.write_text(str(victim.pid))
        assert reg.stop(r) == "stopped"
        assert victim.poll() is None, "stop() killed a process benchseal did not start"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("address", ["0.0.0.0:5000", "example.com:5000", "127.0.0.1:x"])
def test_registry_address_must_be_loopback(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    from pipeline.core.errors import ValidationError

    monkeypatch.setenv("BENCHSEAL_REGISTRY", address)
    with pytest.raises(ValidationError, match="BENCHSEAL_REGISTRY"):
        reg.default_registry()
