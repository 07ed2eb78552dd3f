"""`benchseal build` into the token-auth registry: exit codes, and no secret in argv or outputs.

While the CLI runs, every process's /proc/PID/cmdline is scanned for the
password, its base64 form and the identity token; stdout, stderr and the
digests file are scanned afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.core import paths
from pipeline.imaging.push import Registry
from tests.registry.helpers import AuthRegistry, assert_no_secret, basic_entry, write_docker_config


class _ArgvScanner:
    def __init__(self, secrets: list[str]) -> None:
        self.needles = [s.encode() for s in secrets]
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if any(n in cmdline for n in self.needles):
                    self.hits.append(entry.name)
            self.scans += 1
            self._stop.wait(0.02)

    def __enter__(self) -> _ArgvScanner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _build(registry: AuthRegistry, docker_config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "REGISTRY_AUTH_FILE"},
        "DOCKER_CONFIG": str(docker_config),
        "BENCHSEAL_BASE_LOCK": str(tmp_path / "base.lock.json"),  # the scratch registry's own base lock
    }
    argv = [sys.executable, "-m", "pipeline", "build", "--registry", registry.address, "--image", "api", "--out", str(tmp_path / "digests.json")]
    return subprocess.run(argv, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.docker
@pytest.mark.slow
def test_build_cli_pushes_with_credentials_that_never_reach_argv_or_outputs(token_registry: AuthRegistry, tmp_path: Path) -> None:
    config = write_docker_config(tmp_path / "docker", {"auths": {token_registry.address: basic_entry("alice", token_registry.users["alice"])}})
    with _ArgvScanner(token_registry.secrets) as scanner:
        done = _build(token_registry, config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert scanner.scans > 5 and scanner.hits == []
    outputs = done.stdout + done.stderr + (tmp_path / "digests.json").read_text() + (tmp_path / "base.lock.json").read_text()
    assert_no_secret(outputs, token_registry)
    digests = json.loads((tmp_path / "digests.json").read_text())
    entry = digests["images"]["api"]
    assert entry["name"] == f"{token_registry.address}/benchseal/api"
    # the registry serves exactly the digest recorded (read back with the same credentials)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_CONFIG", str(config))
        assert Registry(token_registry.address).manifest_digest("benchseal/api", entry["digest"]) == entry["digest"]
    # the registry's own log holds no secret either
    assert_no_secret(token_registry.registry.log_path.read_text(errors="replace"), token_registry)


@pytest.mark.docker
def test_build_cli_wrong_credentials_exit_1_with_clear_message(token_registry: AuthRegistry, tmp_path: Path) -> None:
    wrong = "wrong-" + token_registry.users["alice"]
    config = write_docker_config(tmp_path / "docker", {"auths": {token_registry.address: basic_entry("alice", wrong)}})
    with _ArgvScanner([*token_registry.secrets, wrong]) as scanner:
        done = _build(token_registry, config, tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr[-2000:])
    assert "token server rejected the credentials" in done.stderr
    assert scanner.hits == []
    assert_no_secret(done.stdout + done.stderr, token_registry)
    assert wrong not in done.stdout + done.stderr
