"""The worker as deploy/benchseal-worker.service runs it: an unprivileged user whose one capability is
CAP_CHOWN, no new privileges, a private /tmp, TMPDIR inside its state dir, driving the sandbox engine
through the socket ACL that ``benchseal sandbox start --controller USER`` gives it.

systemd cannot run here, so the unit's credentials are applied with the kernel's own tools, read
from the unit file itself (User, SupplementaryGroups, AmbientCapabilities, CapabilityBoundingSet,
NoNewPrivileges, PrivateTmp, UMask, Environment): ``unshare --mount`` with a fresh tmpfs on /tmp for
PrivateTmp, then ``setpriv`` for the user, groups and capabilities. The production paths
(/var/lib/benchseal, /etc/benchseal, /opt/benchseal) are mapped to this checkout and a state dir
inside what the running sandbox shares. A real oracle run goes through it end to end."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core import paths
from pipeline.core.contracts import DigestsFile
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.infra.sandbox import engine as sbx
from tests.fixtures.infra import built_images_source

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.needs_root("creates a service user and applies its credentials")]

UNIT = REPO_ROOT / "deploy" / "benchseal-worker.service"
WORKER_USER = "benchseal-unittest"  # a system account of the tests, never the production `benchseal`
VENV_BIN = Path(sys.executable).parent
CAPS = {"CAP_CHOWN": 0}  # capability bit numbers (linux/capability.h) of those the unit may name


def _unit_service(path: Path) -> dict[str, list[str]]:
    """The [Service] section as key -> values in order (Environment= and friends repeat)."""
    section, out = "", {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _one(service: dict[str, list[str]], key: str, default: str = "") -> str:
    values = service.get(key, [default])
    assert len(values) == 1, f"{key} appears {len(values)} times"
    return values[0]


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def _search_acl(path: Path, uid: int) -> list[Path]:
    """Search permission for ``uid`` on ``path`` and its parents where it lacks it; the dirs changed."""
    changed = []
    for target in [*reversed(path.parents), path]:
        if subprocess.run(["runuser", "-u", pwd.getpwuid(uid).pw_name, "--", "test", "-x", str(target)],
                          check=False).returncode != 0:
            subprocess.run(["setfacl", "-m", f"u:{uid}:x", str(target)], check=True)
            changed.append(target)
    return changed


class UnitWorker:
    """benchseal commands under the unit's credentials, production paths mapped to ``state``."""

    def __init__(self, state: Path, account: pwd.struct_passwd, keep: Path) -> None:
        self.state, self.account, self.keep = state, account, keep
        self.service = _unit_service(UNIT)

    def _map(self, text: str) -> str:
        return (text.replace("/var/lib/benchseal", str(self.state)).replace("/etc/benchseal", str(self.state / "etc"))
                .replace("/opt/benchseal/.venv/bin/", f"{VENV_BIN}/").replace("/opt/benchseal", str(REPO_ROOT)))

    def environment(self) -> dict[str, str]:
        # systemd's default PATH (not the venv's bin), the service user's home (the state dir).
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.state),
               "LANG": "C.UTF-8"}
        for item in self.service.get("Environment", []):
            key, _, value = self._map(item).partition("=")
            env[key] = value
        return env

    def argv(self, *command: str, capabilities: bool = True) -> list[str]:
        """``command`` under the unit's credentials (``capabilities=False``: without its ambient ones)."""
        service = self.service
        assert _one(service, "User") == "benchseal" and _one(service, "NoNewPrivileges") == "yes"
        groups = [str(grp.getgrnam(name).gr_gid) for name in _one(service, "SupplementaryGroups").split()]
        ambient = _one(service, "AmbientCapabilities").split() if capabilities else []
        bounding = _one(service, "CapabilityBoundingSet").split()
        assert set(ambient) <= set(CAPS) and set(bounding) <= set(CAPS), "a capability this emulation does not know"
        caps = lambda names: ",".join(["-all", *(f"+{n.removeprefix('CAP_').lower()}" for n in names)])  # noqa: E731
        setpriv = ["setpriv", f"--reuid={self.account.pw_uid}", f"--regid={self.account.pw_gid}",
                   f"--groups={','.join(groups)}", f"--inh-caps={caps(ambient)}", f"--ambient-caps={caps(ambient)}",
                   f"--bounding-set={caps(bounding)}", "--no-new-privs", "--"]
        umask = _one(service, "UMask", "0022")
        inner = shlex.join(["env", "-i", *(f"{k}={v}" for k, v in self.environment().items()), *command])
        # PrivateTmp=yes: a fresh /tmp in a mount namespace of its own (the state dir stays where it is,
        # should this checkout live under /tmp), then the unit's user and capabilities.
        assert _one(service, "PrivateTmp") == "yes"
        state, keep = shlex.quote(str(self.state)), shlex.quote(str(self.keep))
        script = (f"mount --bind {state} {keep} && mount -t tmpfs -o mode=1777 benchseal-private-tmp /tmp && "
                  f"mkdir -p {state} && mount --bind {keep} {state} && umask {umask} && "
                  f"exec {shlex.join(setpriv)} {inner}")
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]

    def run(self, *command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*command), capture_output=True, text=True, check=False, timeout=timeout,
                              cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def unit_worker(built_images: DigestsFile, sign_release_images: Any) -> Iterator[tuple[UnitWorker, dict[str, Any]]]:
    account = _ensure_user(WORKER_USER)
    # The unit's state dir: inside what the running sandbox shares (this checkout's state home).
    home = paths.home()
    sbx.require_sees(sbx.default_sandbox().url, [home])
    state = home / f"unit-worker-{uuid.uuid4().hex[:8]}"
    state.mkdir(mode=0o750)
    keep = Path(tempfile.mkdtemp(prefix="benchseal-unit-", dir="/dev/shm"))  # a mount point outside /tmp
    # The checkout, the state dir and the venv's interpreter (pyenv's lives under /root here) for that user.
    opened = [*_search_acl(REPO_ROOT, account.pw_uid), *_search_acl(home, account.pw_uid),
              *_search_acl(Path(sys.base_prefix), account.pw_uid)]
    sbx.start(controllers=[WORKER_USER])
    s = sbx.default_sandbox()
    try:
        runner, api = built_images.images["runner"], built_images.images["api"]
        trust = sign_release_images("acme/benchseal", "v9.9.9", [runner.ref, api.ref])
        data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
        data["sources"] = [built_images_source("acme/benchseal", built_images)]
        data["suites"] = {"smoke": {"timeout_seconds": 300, "dataset": data["suites"]["smoke"]["dataset"]}}
        (state / "etc").mkdir()
        (state / "etc" / "infra.yaml").write_text(yaml.safe_dump(data))
        shutil.copytree(REPO_ROOT / "suites", state / "suites")
        shutil.copy(trust.trusted_root, state / "trusted_root.json")
        (state / "tmp").mkdir(mode=0o750)  # what benchseal host install makes
        payload = {"schema": "benchseal.dispatch/v1", "correlation_id": f"unit-worker-{uuid.uuid4().hex[:12]}",
                   "source": {"repository": "acme/benchseal", "commit": "0123456789abcdef0123456789abcdef01234567",
                              "tag": "v9.9.9"},
                   "runner": runner.ref, "api": api.ref, "suite": "smoke", "agent": "oracle"}
        from pipeline.infra.intake.policy import load_policy

        accepted = accept_payload(payload, db=state / "infra" / "queue.sqlite3", policy=load_policy(state / "etc" / "infra.yaml"))
        subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", str(state)], check=True)
        yield UnitWorker(state, account, keep), {"run_id": accepted.run_id, "trust": trust}
    finally:
        for target in opened:
            subprocess.run(["setfacl", "-x", f"u:{account.pw_uid}", str(target)], check=False)
        for target in (s.engine_dir, s.runtime_dir, s.socket):
            subprocess.run(["setfacl", "-x", f"u:{account.pw_uid}", str(target)], check=False)
        subprocess.run(["chown", "-R", "0:0", str(state)], check=False)
        shutil.rmtree(state, ignore_errors=True)
        keep.rmdir()


def test_the_emulation_applies_the_units_credentials(unit_worker):
    worker, _ = unit_worker
    status = worker.run("grep", "-E", "^(Uid|Groups|CapEff|CapBnd|CapAmb|NoNewPrivs):", "/proc/self/status").stdout
    fields = dict(line.split(":\t") for line in status.splitlines())
    assert fields["Uid"].split()[0] == str(worker.account.pw_uid)
    assert fields["Groups"].split() == [str(grp.getgrnam("docker").gr_gid)]
    assert int(fields["CapEff"], 16) == int(fields["CapAmb"], 16) == int(fields["CapBnd"], 16) == 1 << CAPS["CAP_CHOWN"]
    assert fields["NoNewPrivs"].strip() == "1"
    # /tmp is private, and the worker's TMPDIR is the state dir's tmp.
    marker = Path("/tmp") / f"benchseal-unit-{uuid.uuid4().hex}"
    marker.write_text("host")
    try:
        assert worker.run("test", "-e", str(marker)).returncode == 1
    finally:
        marker.unlink()
    assert worker.environment()["TMPDIR"] == str(worker.state / "tmp")


def test_the_sandbox_socket_is_the_controllers_alone(unit_worker):
    worker, _ = unit_worker
    probe = [sys.executable, "-c", "import sys; from pipeline.infra.sandbox import engine as s; "
             "url = s.default_sandbox().url; info = s.engine_info(url); "
             "sys.exit(0 if info and s.engine_refusal(url, info) is None else 3)"]
    assert worker.run(*probe).returncode == 0
    # Another unprivileged user reaches neither the socket nor the engine's data.
    socket = sbx.default_sandbox().socket
    for path in (socket, sbx.default_sandbox().data_dir):
        assert subprocess.run(["runuser", "-u", "nobody", "--", "test", "-e", str(path)], check=False).returncode == 1


def test_an_oracle_run_under_the_unit_succeeds_and_leaves_nothing_it_cannot_remove(unit_worker):
    worker, info = unit_worker
    trust = info["trust"]
    done = worker.run(*shlex.split(worker._map(_one(worker.service, "ExecStart"))), "--once",
                      "--suites-dir", str(worker.state / "suites"), "--sigstore-url", str(trust.fulcio_url),
                      "--trusted-root", str(worker.state / "trusted_root.json"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with SqliteQueue(worker.state / "infra" / "queue.sqlite3") as q:
        record = q.get_run(info["run_id"])
        run_dir = q.run_dir(info["run_id"])
    assert record.state == "SUCCEEDED", f"{record.reason}\n{done.stderr[-4000:]}"
    assert record.grading is not None and record.grading.score == 1.0 and record.grading.counts.resolved == 3
    # Everything the sandbox wrote (as its user and sub-uids) is the worker's again: nothing the
    # worker's user cannot read or remove, and its temp dir is empty again.
    foreign = [p for p in run_dir.rglob("*") if p.lstat().st_uid != worker.account.pw_uid and not p.is_symlink()]
    assert foreign == []
    assert (run_dir / "artifacts" / "evidence" / "harbor").is_dir()
    assert list((worker.state / "tmp").iterdir()) == []
    removed = worker.run("rm", "-rf", str(run_dir / "batches"))
    assert removed.returncode == 0 and not (run_dir / "batches").exists(), removed.stderr


def test_reclaim_needs_cap_chown_and_takes_only_the_sandboxs_files(unit_worker):
    worker, _ = unit_worker
    first, _count = sbx.subid_range()
    target = worker.state / "tmp" / "foreign"
    target.mkdir()
    (target / "f").write_text("x")
    os.chown(target / "f", first + 999, first + 999)  # what container uid 1000 writes
    os.chown(target, worker.account.pw_uid, worker.account.pw_gid)
    reclaim = f"from pipeline.infra.sandbox import engine as sandbox; sandbox.reclaim(__import__('pathlib').Path({str(target)!r}))"
    try:
        done = subprocess.run(worker.argv(sys.executable, "-c", reclaim, capabilities=False), capture_output=True,
                              text=True, check=False, timeout=60, cwd=REPO_ROOT)
        assert done.returncode != 0 and "needs CAP_CHOWN" in done.stderr, done.stderr
        assert (target / "f").stat().st_uid == first + 999
        # With the unit's capability the same call takes it back.
        done = subprocess.run(worker.argv(sys.executable, "-c", reclaim), capture_output=True, text=True,
                              check=False, timeout=60, cwd=REPO_ROOT)
        assert done.returncode == 0 and (target / "f").stat().st_uid == worker.account.pw_uid, done.stderr
        # A hard link to a file of someone else's (root's here; the sandbox could make one where the
        # kernel's protected_hardlinks is off) is refused, never chowned to the worker.
        roots = worker.state / "roots-file"
        roots.write_text("root's")
        os.link(roots, target / "linked")
        done = subprocess.run(worker.argv(sys.executable, "-c", reclaim), capture_output=True, text=True,
                              check=False, timeout=60, cwd=REPO_ROOT)
        assert done.returncode != 0 and "owned by uid 0, neither the sandbox's nor this worker's" in done.stderr
        assert roots.stat().st_uid == 0
    finally:
        shutil.rmtree(target)
        (worker.state / "roots-file").unlink(missing_ok=True)


def test_a_worker_whose_dirs_the_sandbox_does_not_see_is_refused(unit_worker):
    worker, _ = unit_worker
    shared = [Path(p) for p in json.loads(sbx.default_sandbox().shared_record.read_text())["paths"]]
    outside = Path(tempfile.mkdtemp(prefix="benchseal-unit-", dir="/var/tmp"))
    assert not any(p == outside or p in outside.parents for p in shared)
    try:
        def worker_cli(**env: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(VENV_BIN / "benchseal"), "worker", "--once", "--db", str(env.pop("db"))],
                                  capture_output=True, text=True, check=False, timeout=120,
                                  env={**worker.environment(), **env}, cwd=REPO_ROOT)

        inside_db = worker.state / "refusals" / "queue.sqlite3"
        for db, tmpdir, unseen in [(inside_db, outside, outside), (outside / "queue.sqlite3", worker.state / "tmp", outside / "runs")]:
            done = worker_cli(db=str(db), TMPDIR=str(tmpdir))
            assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert f"does not see {unseen}" in done.stderr, done.stderr
        done = worker_cli(db=str(inside_db), TMPDIR=str(worker.state / "no-such-dir"))
        assert done.returncode == 2 and "TMPDIR=" in done.stderr and "not a writable directory" in done.stderr, done.stderr
    finally:
        shutil.rmtree(outside)
        shutil.rmtree(worker.state / "refusals", ignore_errors=True)
