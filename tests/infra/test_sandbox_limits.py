"""Declared limits hold in the sandbox engine, measured from inside its containers (issue 35, point 5).

Containers are created through the engine proxy in front of the real sandbox engine, as a trial's
are: memory (swap included), CPUs, processes and file size are the kernel's (cgroups through the
engine's cgroupfs driver, RLIMIT_FSIZE), and what a request leaves out the proxy adds. An engine
that cannot enforce them is refused when the worker starts: tested on a real rootless engine
without cgroups (rootless dockerd on this cgroup v1 host) and on the host's root engine.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from pipeline.core.errors import CheckFailed
from pipeline.core.polling import poll_until
from pipeline.infra.sandbox import engine as sbx
from pipeline.infra.sandbox.engine_proxy import LABEL, EnginePolicy, EngineProxy
from pipeline.infra.sandbox.limits import ContainerLimits, enforcement_refusal
from pipeline.runner.engine_env import _engine_error
from tests.fixtures.infra import base_in_sandbox, sandbox_engine

pytestmark = pytest.mark.needs_root("the sandbox engine is set up by root")
HOST_ENGINE = "unix:///var/run/docker.sock"
LIMITS = ContainerLimits(memory=64 << 20, pids=40, fsize=16 << 20)

# Forks until the kernel says no (or 500 children), then reports how many it had.
FORK_LOOP = """
import os, signal, time
kids = []
try:
    while len(kids) < 500:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    print("forked", len(kids))
except OSError as exc:
    print("stopped", len(kids), exc.errno)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
"""
# A 2 GiB sparse file: one byte at 2 GiB (what the hostile agent left in /app).
SPARSE = """
import os
try:
    with open("/tmp/sparse", "wb") as f:
        f.seek(2 << 30)
        f.write(b"x")
    print("written", os.stat("/tmp/sparse").st_size)
except OSError as exc:
    print("refused", exc.errno)
"""


@pytest.fixture(scope="module")
def sandbox_client() -> Iterator[docker.DockerClient]:
    client = sandbox_engine()  # started if needed
    yield client
    client.close()


@pytest.fixture(scope="module")
def image(sandbox_client: docker.DockerClient, base_refs: dict[str, Any]) -> str:
    return base_in_sandbox(sandbox_client, base_refs)


@pytest.fixture
def proxied(tmp_path: Path, sandbox_client: docker.DockerClient) -> Iterator[docker.DockerClient]:
    """A client of the engine proxy (policy ``LIMITS``) in front of the sandbox engine."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    policy = EnginePolicy(bind_roots=(run_dir,), limits=LIMITS)
    proxy = EngineProxy(tmp_path / "proxy.sock", policy, upstream=sbx.default_sandbox().url.removeprefix("unix://"))
    proxy.start()
    client = docker.DockerClient(base_url=f"unix://{tmp_path / 'proxy.sock'}", timeout=120)
    yield client
    client.close()
    proxy.stop()
    for container in sandbox_client.containers.list(all=True, filters={"label": f"{LABEL}={policy.token}"}):
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def _run(client: docker.DockerClient, image: str, script: str, **limits: Any) -> tuple[int, str, dict[str, Any]]:
    container = client.containers.create(image, ["python3", "-c", script], **limits)
    try:
        container.start()
        code = int(container.wait(timeout=120)["StatusCode"])
        container.reload()
        return code, container.logs().decode("utf-8", "replace"), container.attrs
    finally:
        container.remove(force=True)


def test_memory_past_the_declared_limit_is_oom_killed(proxied, image):
    code, out, attrs = _run(proxied, image, "b = bytearray(200 << 20); print('allocated')", mem_limit="64m")
    assert code == 137 and attrs["State"]["OOMKilled"] and "allocated" not in out
    assert attrs["HostConfig"]["MemorySwap"] == 64 << 20  # no swap past it either
    # Within the limit it runs: the bound is the declared one, not a refusal of everything.
    code, out, _ = _run(proxied, image, "b = bytearray(16 << 20); print('allocated')", mem_limit="64m")
    assert (code, out.strip()) == (0, "allocated")


def test_a_container_that_declares_nothing_gets_the_policys_bounds(proxied, image):
    code, out, attrs = _run(proxied, image, "b = bytearray(200 << 20); print('allocated')")
    assert code == 137 and attrs["State"]["OOMKilled"]
    host = attrs["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (64 << 20, 1_000_000_000, 40)
    assert host["Ulimits"] == [{"Name": "fsize", "Soft": 16 << 20, "Hard": 16 << 20}]
    # Measured by the kernel from inside: the cgroup's own files (the container's cgroup namespace).
    code, out, _ = _run(proxied, image, "print(open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip(), "
                        "open('/sys/fs/cgroup/pids/pids.max').read().strip())")
    assert out.split() == ["100000", "40"]


def test_a_fork_loop_stops_at_the_process_bound(proxied, image):
    code, out, _ = _run(proxied, image, FORK_LOOP)
    assert code == 0, out
    verb, count, errno = out.split()
    assert verb == "stopped" and errno == "11" and 30 <= int(count) < 40  # EAGAIN at the bound (python is one)


def test_a_sparse_file_counts_by_its_apparent_size(proxied, image):
    code, out, _ = _run(proxied, image, SPARSE)
    assert (code, out.split()) == (0, ["refused", "27"])  # EFBIG: 2 GiB apparent is past the 16 MiB bound
    # A process exec'd later (as the agent's and the verifier's are) has the same bound.
    container = proxied.containers.create(image, ["sleep", "60"])
    try:
        container.start()
        code, output = container.exec_run(["sh", "-c", "truncate -s 2G /tmp/big 2>/dev/null; echo $?; stat -c %s /tmp/big"], demux=False)
        assert output.split()[0] == b"153" and output.split()[-1] == b"0"  # killed by SIGXFSZ (128 + 25); the file stays empty
    finally:
        container.remove(force=True)


def test_asking_past_a_ceiling_or_lifting_a_limit_later_is_refused(proxied, image):
    with pytest.raises(docker.errors.APIError, match="PidsLimit 100000 is above the sandbox's bound 40"):
        proxied.containers.create(image, ["true"], pids_limit=100000)
    with pytest.raises(docker.errors.APIError, match="only one fsize rlimit"):
        proxied.containers.create(image, ["true"], ulimits=[docker.types.Ulimit(name="nproc", soft=9, hard=9)])
    container = proxied.containers.create(image, ["sleep", "60"])
    try:
        with pytest.raises(docker.errors.APIError, match="limits cannot be changed"):
            container.update(mem_limit="1g")
        for body in ({"PidsLimit": 0}, {"pidslimit": -1}, {"NanoCpus": 2_000_000_000}):  # (0 and -1: no bound)
            answer = proxied.api.post(proxied.api._url("/containers/{0}/update", container.id), json=body)
            assert answer.status_code == 403 and "limits cannot be changed" in answer.text
        container.reload()
        assert (container.attrs["HostConfig"]["Memory"], container.attrs["HostConfig"]["PidsLimit"]) == (64 << 20, 40)
    finally:
        container.remove(force=True)


def test_a_chmod_of_a_parent_mid_batch_does_not_cut_the_engine_off_the_batch(tmp_path, sandbox_client, image):
    """What the hostile corpus's honest control lost two trials to: its verifier containers' creates were answered
    400 ``stat <batch>/agent: permission denied``, as another pytest session had chmodded the temp root 0700 (the
    grant's ACL entry stays, the mask disables it). The proxy gives the grant back before it forwards a request."""
    s = sbx.default_sandbox()
    run_dir = tmp_path / "run"
    batch = run_dir / "batches" / "0000-batch"
    (batch / "agent").mkdir(parents=True)
    sbx.grant(batch, s)
    mount = docker.types.Mount("/opt/benchseal/agent", str(batch / "agent"), type="bind", read_only=True)
    for keep in (False, True):
        policy = EnginePolicy(bind_roots=(run_dir,), limits=LIMITS, reachable=(batch,) if keep else (),
                              reachable_by=sbx.service_uid(s.user) if keep else None)
        proxy = EngineProxy(tmp_path / f"proxy-{keep}.sock", policy,
                            upstream=s.url.removeprefix("unix://")).start()
        client = docker.DockerClient(base_url=f"unix://{tmp_path / f'proxy-{keep}.sock'}", timeout=120)
        try:
            tmp_path.chmod(0o700)  # pytest's chmod of its temp root, mid-batch
            if not keep:  # the engine's answer without the proxy's care, and the cause the trial's reason keeps
                with pytest.raises(docker.errors.APIError) as refused:
                    client.containers.create(image, ["true"], mounts=[mount])
                assert refused.value.status_code == 400, refused.value
                said = _engine_error(refused.value)
                assert said.startswith("APIError: the engine answered 400: invalid mount config") and said.endswith(
                    f"{batch / 'agent'}: permission denied"), said
                continue
            container = client.containers.create(image, ["true"], mounts=[mount])
            container.start()
            assert container.wait(timeout=120)["StatusCode"] == 0
        finally:
            client.close()
            proxy.stop()
            for made in sandbox_client.containers.list(all=True, filters={"label": f"{LABEL}={policy.token}"}):
                with contextlib.suppress(docker.errors.APIError):
                    made.remove(force=True)


# --- engines that cannot enforce them are refused --------------------------------------------

@pytest.fixture(scope="module")
def rootless_without_cgroups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real rootless Docker engine (dockerd's rootless mode under rootlesskit, as the service user):
    on this cgroup v1 host it runs "without cgroups"."""
    account = pwd.getpwnam(sbx.SERVICE_USER)
    base = Path(tmp_path_factory.mktemp("rootless", numbered=True))
    for path in (base, base / "run", base / "data"):
        path.mkdir(exist_ok=True)
        os.chown(path, account.pw_uid, account.pw_gid)
        path.chmod(0o700)
    sbx._traverse(base, account.pw_uid)
    socket = base / "run" / "docker.sock"
    env = {"PATH": os.environ["PATH"], "HOME": str(base), "XDG_RUNTIME_DIR": str(base / "run")}
    daemon = (f"rm -f /run/docker /run/containerd /run/xtables.lock; ip link set lo up; exec dockerd --host unix://{socket} --data-root {base}/data "
              f"--exec-root {base}/run/exec --pidfile {base}/run/docker.pid")
    started = subprocess.Popen(
        ["unshare", "--net", "--", "setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups",
         "rootlesskit", "--net=host", "--copy-up=/etc", "--copy-up=/run", f"--state-dir={base}/run/rk",
         "unshare", "--net", "--", "sh", "-c", daemon],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"unix://{socket}"
        assert poll_until(lambda: sbx.engine_info(url, timeout=2.0), timeout=60, interval=0.3), "no rootless engine"
        yield url
    finally:
        os.killpg(started.pid, signal.SIGTERM)  # the session we started (rootlesskit and its children)
        started.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def test_the_decision_on_each_real_engine_here(rootless_without_cgroups):
    rootless = sbx.engine_info(rootless_without_cgroups)
    assert rootless is not None and "name=rootless" in str(rootless["SecurityOptions"])
    assert "without cgroups (CgroupDriver none, cgroup v1)" in str(enforcement_refusal(rootless))
    assert sbx.confinement_refusal(rootless_without_cgroups) is None  # confined, but enforcing nothing
    host = sbx.engine_info(HOST_ENGINE)
    assert host is not None and enforcement_refusal(host) is None
    assert "runs as root on this host" in str(sbx.confinement_refusal(HOST_ENGINE))
    sbx.start()
    ours = sbx.engine_info(sbx.default_sandbox().url)
    assert ours is not None and enforcement_refusal(ours) is None
    assert sbx.confinement_refusal(sbx.default_sandbox().url) is None
    sbx.require_sandbox_engine(sbx.default_sandbox().url)


def test_the_worker_refuses_an_engine_without_cgroups_in_one_line(tmp_path, rootless_without_cgroups):
    with pytest.raises(CheckFailed, match="cannot enforce a trial's declared limits: it runs without cgroups"):
        sbx.require_sandbox_engine(rootless_without_cgroups)
    done = subprocess.run([str(Path(sys.executable).with_name("benchseal")), "worker", "--once", "--db",
                           str(tmp_path / "q.sqlite3"), "--sandbox-engine", rootless_without_cgroups],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "runs without cgroups" in done.stderr and "--memory, --cpus and --pids-limit" in done.stderr
