"""The worker runs nothing on an engine that is not the confined, limit-enforcing sandbox, and the sandbox service
stops only the process it recorded."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, InfrastructureError
from pipeline.infra.sandbox import disk
from pipeline.infra.sandbox import engine as sbx
from pipeline.infra.worker import loop as worker

pytestmark = pytest.mark.needs_root("the sandbox engine is set up by root")
HOST_ENGINE = "unix:///var/run/docker.sock"


def test_the_host_root_engine_is_refused_as_sandbox():
    with pytest.raises(CheckFailed, match="runs as root on this host"):
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


def test_the_running_sandbox_is_confined_enforcing_and_ours():
    s = sbx.default_sandbox()
    sbx.start(s)
    info = sbx.status(s)
    assert info["answers"] and info["confined"] and info["limits"] and info["pid"]
    # Its data root is its own file system, of a fixed size (pipeline/infra/sandbox/disk.py).
    assert info["disk_own"] is True and disk.MIN_GIB - 0.1 <= float(str(info["disk_gib"])) <= disk.DEFAULT_MAX_GIB + 0.1
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


def test_reclaim_takes_back_what_the_sandbox_wrote_without_following_anything(tmp_path):
    first, _ = sbx.subid_range()
    batch = tmp_path / "batch"
    (batch / "locked" / "deeper").mkdir(parents=True)
    (batch / "locked" / "deeper" / "result.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.write_text("not the sandbox's")
    (batch / "link").symlink_to(outside)
    os.mkfifo(batch / "fifo")
    (batch / "setuid").write_text("#!/bin/sh\n")
    (batch / "setuid").chmod(0o4755)
    for path in [batch / "locked" / "deeper" / "result.json", batch / "locked" / "deeper", batch / "locked",
                 batch / "fifo", batch / "setuid", batch]:
        os.chown(path, first + 999, first + 999)
    os.lchown(batch / "link", first + 999, first + 999)
    for path, mode in [(batch / "locked" / "deeper" / "result.json", 0), (batch / "locked" / "deeper", 0),
                       (batch / "locked", 0)]:
        path.chmod(mode)
    sbx.reclaim(batch)
    for path in [batch, *batch.rglob("*")]:
        st = path.lstat()
        if path.is_symlink():
            assert st.st_uid == first + 999  # a link is left as it is (never followed, removable)
        else:
            assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()), path
    assert (batch / "locked" / "deeper" / "result.json").read_text() == "{}"
    assert stat.S_IMODE((batch / "locked").stat().st_mode) == 0o700
    assert stat.S_IMODE((batch / "setuid").stat().st_mode) == 0o755  # no setuid bit survives
    assert outside.stat().st_uid == 0 and (batch / "link").is_symlink()  # the link itself, never its target
    assert stat.S_ISFIFO((batch / "fifo").lstat().st_mode)
    sbx.reclaim(tmp_path / "missing")  # nothing there: nothing to do
    # Someone else's entry (neither the sandbox's ids nor ours) is refused and left as it is.
    (batch / "other").write_text("x")
    os.chown(batch / "other", first - 1, first - 1)
    with pytest.raises(CheckFailed, match=f"owned by uid {first - 1}, neither the sandbox's"):
        sbx.reclaim(batch)
    assert (batch / "other").stat().st_uid == first - 1
    (batch / "other").unlink()
    # What is already the worker's is never changed, not even a setuid file or a sticky directory.
    (batch / "ours").write_text("#!/bin/sh\n")
    (batch / "ours").chmod(0o4750)
    (batch / "sticky").mkdir(mode=0o1777)
    (batch / "sticky").chmod(0o1777)
    sbx.reclaim(batch)
    assert stat.S_IMODE((batch / "ours").stat().st_mode) == 0o4750
    assert stat.S_IMODE((batch / "sticky").stat().st_mode) == 0o1777


def test_grant_sees_an_entry_the_mask_disabled_as_missing(tmp_path):
    s = sbx.default_sandbox()
    batch = tmp_path / "batch"
    batch.mkdir(mode=0o700)
    sbx.grant(batch, s)
    assert _as(s.user, "-w", str(batch)) == 0
    batch.chmod(0o700)  # an operator's chmod narrows the ACL mask: the named entry is no longer effective
    assert _as(s.user, "-w", str(batch)) != 0
    sbx.grant(batch, s)
    assert _as(s.user, "-w", str(batch)) == 0
    assert _as("nobody", "-x", str(batch)) != 0


def test_keep_reachable_gives_back_what_a_chmod_of_a_parent_took(tmp_path):
    """pytest chmods its temp root to 0700 whenever another session starts: the grant's entries on the way to a
    batch dir stay, but the mask disables them, and the engine could no longer reach the batch's binds."""
    s = sbx.default_sandbox()
    uid = sbx.service_uid(s.user)
    batch = tmp_path / "run" / "batch"
    batch.mkdir(parents=True, mode=0o700)
    sbx.grant(batch, s)
    # (Each list may also name the temp root: another session may chmod it at any time, which is the point.)
    assert batch not in sbx.keep_reachable(batch, uid) and _as(s.user, "-w", str(batch)) == 0
    tmp_path.chmod(0o700)
    assert _as(s.user, "-w", str(batch)) != 0
    fixed = sbx.keep_reachable(batch, uid)
    assert tmp_path in fixed and batch not in fixed and _as(s.user, "-w", str(batch)) == 0, fixed
    batch.chmod(0o700)  # the batch dir itself: its rwx entry
    fixed = sbx.keep_reachable(batch, uid)
    assert batch in fixed and tmp_path not in fixed and _as(s.user, "-w", str(batch)) == 0, fixed
    assert _as("nobody", "-x", str(batch)) != 0 and _as("nobody", "-x", str(tmp_path)) != 0  # still its alone
    assert sbx.keep_reachable(tmp_path / "gone", uid) == []  # a batch dir removed: nothing to keep


@pytest.mark.parametrize("user", ["root", sbx.SERVICE_USER, "no-such-user-here"])
def test_a_controller_must_be_an_unprivileged_other_user(user):
    done = subprocess.run([str(Path(sys.executable).with_name("benchseal")), "sandbox", "start", "--controller", user],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--controller" in done.stderr and "Traceback" not in done.stderr


def test_the_running_sandbox_records_what_it_shares_and_refuses_other_sockets(tmp_path):
    s = sbx.default_sandbox()
    sbx.start(s)
    shared = [Path(p) for p in __import__("json").loads(s.shared_record.read_text())["paths"]]
    assert shared and all(p.is_absolute() for p in shared)
    sbx.require_sees(s.url, shared)
    with pytest.raises(CheckFailed, match="does not see /root"):
        sbx.require_sees(s.url, [Path("/root")])
    for url in (HOST_ENGINE, "unix:///a.sock", f"unix://{tmp_path}/engine/run/docker.sock"):
        with pytest.raises(CheckFailed):
            sbx.require_sees(url, shared)


def test_an_engine_whose_data_root_is_not_its_own_disk_is_refused():
    """The worker's check (``engine_refusal``): the engine's data root must be the mount of its sandbox's disk file;
    anything else (the host's disk, a mount of another file) could let a trial fill the host's disk."""
    s = sbx.default_sandbox()
    sbx.start(s)
    info = sbx.engine_info(s.url)
    assert info is not None and sbx.disk_refusal(s.url, info) is None
    for root in ("/var/lib/docker", str(s.engine_dir), str(s.data_dir / "docker")):
        refused = sbx.disk_refusal(s.url, {**info, "DockerRootDir": root})
        assert refused is not None and "host's disk" in refused, root
    other = s.data_dir.parent / "not-the-disk.ext4"
    assert not disk.is_own_mount(s.data_dir, other)


def test_the_disk_file_bounds_what_is_written_and_keeps_the_engine_data_across_mounts(tmp_path):
    """The mechanism on a small file: a write past the file system's size ends in ENOSPC while the host's free
    space shrinks by at most that size; the engine's data from before is removed when the file is made, and what
    was written stays across an unmount and a mount of the same file."""
    data, image = tmp_path / "data", tmp_path / disk.DISK_FILE
    data.mkdir()
    (data / "old-engine-data").mkdir()
    (data / "old-engine-data" / "layer").write_bytes(b"x" * 1024)
    account = pwd.getpwnam("nobody")
    free_before = sbx.shutil.disk_usage(tmp_path).free
    disk.mount_data_root(data, image, account.pw_uid, account.pw_gid, size=256 << 20)
    try:
        assert disk.is_own_mount(data, image) and os.path.ismount(data)
        device = disk._mounted_source(data)
        assert device is not None and Path(f"/sys/block/{Path(device).name}/loop/dio").read_text().strip() == "1"
        assert sorted(p.name for p in data.iterdir()) == ["lost+found"]  # the old data went, not hidden
        info = data.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (account.pw_uid, account.pw_gid, 0o700)
        assert stat.S_IMODE(image.stat().st_mode) == 0o600 and image.stat().st_uid == 0
        written = subprocess.run(["sh", "-c", f"for i in 1 2 3; do head -c 200M /dev/zero > {data}/f$i; done"],
                                 capture_output=True, text=True, timeout=120)
        assert written.returncode != 0 and "No space left on device" in written.stderr, written
        assert free_before - sbx.shutil.disk_usage(tmp_path).free <= (256 + 16) << 20
        (data / "f1").unlink()
        (data / "kept").write_text("warm")
        disk.unmount_data_root(data, image)
        assert not os.path.ismount(data) and image.is_file()
        disk.mount_data_root(data, image, account.pw_uid, account.pw_gid, size=256 << 20)
        assert (data / "kept").read_text() == "warm"
    finally:
        disk.unmount_data_root(data, image)
    assert not os.path.ismount(data)
    assert not Path(f"/sys/block/{Path(device).name}/loop/backing_file").exists()  # the device went with the mount


@pytest.mark.parametrize(("value", "why"), [("lots", "not a number of GiB"), ("2", "below the 8 GiB")])
def test_a_bad_disk_size_is_refused_in_one_line(tmp_path, monkeypatch, value, why):
    monkeypatch.setenv(disk.DISK_ENV, value)
    with pytest.raises(sbx.UsageError, match=why) as raised:
        disk.chosen_size(tmp_path)
    assert disk.DISK_ENV in str(raised.value) and "\n" not in str(raised.value)
