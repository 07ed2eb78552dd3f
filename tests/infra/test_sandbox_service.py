"""The worker runs nothing on an engine that is not the rootless sandbox, and the sandbox service
stops only the process it recorded."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import CheckFailed, InfrastructureError
from pipeline.host import sandbox as sbx
from pipeline.infra import worker

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox engine is set up by root")
HOST_ENGINE = "unix:///var/run/docker.sock"


def test_the_host_root_engine_is_refused_as_sandbox():
    with pytest.raises(CheckFailed, match="not rootless"):
        sbx.require_sandbox_engine(HOST_ENGINE)
    with pytest.raises((worker.InfraFailure, CheckFailed)):
        worker._sandbox(worker.WorkerConfig(sandbox_engine=HOST_ENGINE))


@pytest.mark.parametrize("url", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:2375", "unix:///etc/passwd"])
def test_an_engine_that_does_not_answer_is_refused(url):
    with pytest.raises(InfrastructureError, match="does not answer"):
        sbx.require_sandbox_engine(url)


@pytest.mark.parametrize("engine", [HOST_ENGINE, "unix:///nonexistent/docker.sock", "http://127.0.0.1:2375"])
def test_worker_cli_fails_closed_in_one_line(tmp_path, engine):
    done = subprocess.run([str(Path(sys.executable).with_name("benchseal")), "worker", "--once", "--db",
                           str(tmp_path / "q.sqlite3"), "--sandbox-engine", engine],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "sandbox" in done.stderr


def test_the_running_sandbox_is_rootless_and_ours():
    s = sbx.default_sandbox()
    sbx.start(s)
    info = sbx.status(s)
    assert info["answers"] and info["rootless"] and info["pid"]
    # The engine process runs as the service user, never root.
    assert Path(f"/proc/{info['pid']}").stat().st_uid == sbx.pwd.getpwnam(sbx.SERVICE_USER).pw_uid


def test_stop_touches_only_the_recorded_process(tmp_path):
    foreign = subprocess.Popen(["sleep", "300"])
    try:
        fake = sbx.Sandbox(base=tmp_path)
        fake.pid_path.write_text(f"{foreign.pid}\n")
        assert sbx.stop(fake) == "stopped"
        assert foreign.poll() is None  # a pid record naming someone else's process is not obeyed
        # Not even a rootlesskit of someone else (its command line does not name our child script).
        fake.pid_path.write_text(f"{os.getpid()}\n")
        assert sbx.stop(fake) == "stopped"
    finally:
        foreign.kill()
        foreign.wait()
    # The real one is untouched by all this.
    assert sbx.status()["answers"]


def _as(user: str, *test: str) -> int:
    return subprocess.run(["runuser", "-u", user, "--", "test", *test], check=False).returncode


def test_grant_gives_the_service_user_alone_access_and_keeps_what_it_had(tmp_path):
    s = sbx.default_sandbox()
    sbx.start(s)  # creates the service user on a new machine; a no-op when it runs
    uid = pwd.getpwnam(s.user).pw_uid
    batch = tmp_path / "run" / "batch"
    batch.mkdir(parents=True, mode=0o700)
    (batch / "secret").write_text("canary")
    (batch / "secret").chmod(0o400)
    sbx.grant(batch, s)
    # Still private: root's, nothing for its group or others (the mode's group bits now show the
    # ACL mask, which only the named entry uses).
    assert batch.stat().st_uid == 0 and stat.S_IMODE(batch.stat().st_mode) & 0o007 == 0
    acl = subprocess.run(["getfacl", "--numeric", "--omit-header", str(batch)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert "group::---" in acl and "other::---" in acl and f"user:{uid}:rwx" in acl
    assert (batch / "secret").stat().st_uid == uid and stat.S_IMODE((batch / "secret").stat().st_mode) == 0o400
    assert _as(s.user, "-w", str(batch)) == 0 and _as(s.user, "-r", str(batch / "secret")) == 0
    assert _as("nobody", "-x", str(batch)) != 0 and _as("nobody", "-r", str(batch / "secret")) != 0
    # A later search-only grant on the way to a deeper path adds --x: it never takes rwx away.
    (batch / "inner").mkdir()
    sbx.grant(batch / "inner", s)
    assert _as(s.user, "-w", str(batch)) == 0
    # A symlink is never granted (nor followed).
    (tmp_path / "link").symlink_to(batch)
    with pytest.raises(CheckFailed, match="symlink"):
        sbx.grant(tmp_path / "link", s)
