"""The sandbox engine contains a fully unfiltered request (no engine proxy in front of it).

Each test sends the worst container the Engine API allows straight to the sandbox engine's
socket: Privileged, NetworkMode/PidMode/IpcMode/UTSMode host, CapAdd ALL, seccomp, AppArmor
and systempaths unconfined, a bind of the host's ``/``. What it must not reach: root-only host
files, host files outside the shared paths at all, host root as a file owner, host processes
(seeing or signalling them), host TCP services on loopback or any host address, host devices.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from pipeline.infra.sandbox import engine as sbx
from tests.fixtures.infra import base_in_sandbox, sandbox_engine

pytestmark = pytest.mark.needs_root("the sandbox engine is set up by root")

# The raw HostConfig, as a client that bypasses every filter would send it (MaskedPaths and
# ReadonlyPaths empty is what `docker run --security-opt systempaths=unconfined` sends).
HOSTILE: dict[str, Any] = {
    "Privileged": True,
    "NetworkMode": "host",
    "PidMode": "host",
    "IpcMode": "host",
    "UTSMode": "host",
    "CgroupnsMode": "host",
    "CapAdd": ["ALL"],
    "SecurityOpt": ["seccomp=unconfined", "apparmor=unconfined", "label=disable"],
    "MaskedPaths": [],
    "ReadonlyPaths": [],
    "Binds": ["/:/host:rw"],
}


@pytest.fixture(scope="module")
def sandbox_client() -> Iterator[docker.DockerClient]:
    client = sandbox_engine()  # started if needed
    yield client
    client.close()


@pytest.fixture(scope="module")
def image(sandbox_client: docker.DockerClient, base_refs: dict[str, Any]) -> str:
    """The project's base image (python3, coreutils), admitted on the host and copied by id."""
    return base_in_sandbox(sandbox_client, base_refs)


def _run(client: docker.DockerClient, image: str, script: str, **extra: Any) -> tuple[int, str]:
    host_config = {**HOSTILE, **extra}
    created = client.api.post(client.api._url("/containers/create"),
                              json={"Image": image, "Cmd": ["sh", "-c", script], "HostConfig": host_config})
    if created.status_code != 201:
        raise docker.errors.APIError(f"create: {created.status_code} {created.text.strip()}")
    container = client.containers.get(created.json()["Id"])
    try:
        container.start()
        code = int(container.wait(timeout=120)["StatusCode"])
        return code, container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)


def _py(code: str) -> str:
    return "python3 -c " + shlex.quote(code)


@pytest.fixture
def root_only_canary(tmp_path: Path) -> Iterator[Path]:
    """A 0600 root file in a 0700 root dir inside a shared path (the temp dir)."""
    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o700)
    canary = secret_dir / "canary"
    canary.write_text("CANARY-" + secrets.token_hex(8))
    canary.chmod(0o600)
    yield canary


@pytest.fixture
def outside_canary() -> Iterator[Path]:
    """A world-readable file outside every shared path: the sandbox must not even see it."""
    top = Path("/var/lib") / f"benchseal-canary-{secrets.token_hex(4)}"
    top.mkdir(mode=0o755)
    canary = top / "public"
    canary.write_text("PUBLIC-" + secrets.token_hex(8))
    canary.chmod(0o644)
    yield canary
    shutil.rmtree(top)


def test_root_only_and_outside_files_are_out_of_reach(sandbox_client, image, root_only_canary, outside_canary):
    script = (f"cat /host{root_only_canary}; ls /host{root_only_canary.parent}; cat /host{outside_canary}; "
              f"ls -d /host{outside_canary.parent}; cat /host/etc/shadow | head -c 20; "
              "ls /host/work /host/root /host/var/lib/docker 2>&1; ls /host/var/run/docker.sock /host/run/docker.sock")
    _code, out = _run(sandbox_client, image, script)
    assert root_only_canary.read_text() not in out
    assert outside_canary.read_text() not in out
    assert "Permission denied" in out  # the root-only file exists in the shared tree, but not for this uid
    assert f"{outside_canary.parent}': No such file" in out
    assert "root:" not in out
    # Docker's own data and the host engine's socket are not in its world.
    assert out.count("No such file or directory") >= 5, out


def test_files_written_on_a_bound_host_path_are_not_owned_by_host_root(sandbox_client, image, tmp_path):
    shared = tmp_path / "run"
    shared.mkdir(mode=0o700)
    (shared / "open").mkdir()
    (shared / "open").chmod(0o777)
    sbx.grant(shared)
    first, _count = sbx.subid_range()
    service = sbx.pwd.getpwnam(sbx.SERVICE_USER)
    script = (f"echo root > /host{shared}/as-root; chown 0:0 /host{shared}/as-root; "
              "setpriv --reuid=1000 --regid=1000 --clear-groups sh -c 'echo x > /open/u'; "
              # Writing where only host root may write: a root 0700 dir, the host's /etc (copied up: not the host's).
              f"echo x > /host{tmp_path}/not-granted 2>&1; echo pwned >> /host/etc/benchseal-sandbox-probe 2>&1; true")
    code, out = _run(sandbox_client, image, script, Binds=["/:/host:rw", f"{shared}/open:/open:rw"])
    assert code == 0, out
    as_root = (shared / "as-root").stat()
    assert (as_root.st_uid, as_root.st_gid) == (service.pw_uid, service.pw_gid)
    user_file = (shared / "open" / "u").stat()
    assert user_file.st_uid == first + 999  # container uid 1000 -> the 1000th subordinate uid
    assert not (tmp_path / "not-granted").exists()
    assert not Path("/etc/benchseal-sandbox-probe").exists()
    for path in shared.rglob("*"):
        assert path.stat().st_uid != 0


@pytest.fixture
def host_marker_process() -> Iterator[subprocess.Popen[bytes]]:
    marker = f"benchseal-marker-{secrets.token_hex(6)}"
    proc = subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 600"])
    yield proc
    proc.kill()
    proc.wait()


def test_host_processes_are_invisible_and_unsignalable(sandbox_client, image, host_marker_process):
    host_pids = [os.getpid(), host_marker_process.pid, int(Path("/proc/1/stat").read_text().split()[0])]
    dockerd = Path(__file__).resolve().parents[2] / ".benchseal" / "dockerd.pid"
    if dockerd.is_file():
        host_pids.append(int(dockerd.read_text()))
    script = ("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; "
              + "; ".join(f"kill -9 {pid} 2>&1" for pid in host_pids if pid != 1)
              + f"; {_py('import os; print(\"NS\", os.readlink(\"/proc/1/ns/pid\"))')}")
    _code, out = _run(sandbox_client, image, script)
    assert "benchseal-marker-" not in out
    # (Other sandbox containers may mention pytest paths: only this host process's exact argv counts.)
    ours_argv = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert ours_argv.strip() not in out and "dockerd --host unix:///var/run/docker.sock" not in out
    assert host_marker_process.poll() is None  # still alive
    ours = os.readlink("/proc/self/ns/pid")
    assert f"NS {ours}" not in out


@pytest.fixture
def host_tcp_servers() -> Iterator[list[tuple[str, int]]]:
    """A listening socket on host 127.0.0.1 and on every other host IPv4 address."""
    done = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    addresses = ["127.0.0.1"] + [a["local"] for link in json.loads(done.stdout) for a in link.get("addr_info", [])
                                 if a.get("local") and not a["local"].startswith("127.")]
    servers = []
    hits: list[str] = []
    for address in addresses:
        sock = socket.socket()
        sock.bind((address, 0))
        sock.listen(8)
        servers.append(sock)

        def accept(s: socket.socket = sock) -> None:
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                hits.append(str(s.getsockname()))
                conn.close()
        threading.Thread(target=accept, daemon=True).start()
    yield [s.getsockname() for s in servers]
    for sock in servers:
        sock.close()
    assert not hits, f"the sandbox reached host sockets {hits}"


@pytest.mark.parametrize("network_mode", ["host", "bridge"])
def test_host_network_is_unreachable(sandbox_client, image, host_tcp_servers, network_mode):
    targets = json.dumps([list(t) for t in host_tcp_servers]
                         + [["127.0.0.1", 5055], ["10.0.2.2", 80], ["172.17.0.1", 2375]])
    probe = ("import json, socket\n"
             f"for host, port in json.loads({targets!r}):\n"
             "    try:\n"
             "        socket.create_connection((host, port), timeout=2).close(); print('REACHED', host, port)\n"
             "    except OSError as exc:\n"
             "        print('blocked', host, port, exc.errno)\n"
             "print(open('/proc/net/route').read())\n"
             # Every network namespace it can see (its own, and through /proc/PID/net those of the
             # sandbox's own processes, rootlesskit's included): no host listener in any socket table.
             "import glob\n"
             "for table in glob.glob('/proc/[0-9]*/net/tcp') + glob.glob('/proc/[0-9]*/net/tcp6'):\n"
             "    try:\n"
             "        print(table, open(table).read())\n"
             "    except OSError:\n"
             "        pass\n")
    _code, out = _run(sandbox_client, image, _py(probe), NetworkMode=network_mode)
    assert "REACHED" not in out, out
    assert out.count("blocked") == len(host_tcp_servers) + 3
    for _host, port in host_tcp_servers:
        assert f":{port:04X} 00000000:0000 0A" not in out, f"a host listener on {port} shows in a socket table"
    assert ":13BF 00000000:0000 0A" not in out  # the host registry's 5055
    # The only interfaces are the sandbox's own: no host uplink in its routing table (in bridge mode
    # the container's own veth end is called eth0 too, so this holds for host mode).
    for link in [] if network_mode != "host" else json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout):
        if link["ifname"] not in ("lo", "docker0") and not link["ifname"].startswith("veth"):
            assert f"\n{link['ifname']}\t" not in out


def test_host_devices_and_raw_disk_are_out_of_reach(sandbox_client, image):
    dev = os.stat("/").st_dev
    major, minor = os.major(dev), os.minor(dev)
    script = (f"mknod /tmp/disk b {major} {minor} 2>&1; head -c 4096 /tmp/disk > /dev/null 2>&1 && echo READ-DISK; "
              "ls /host/dev; for k in /host/dev/kmsg /dev/kmsg /dev/mem; do head -c 1 $k 2>/dev/null | grep -q . && echo READ-$k; done; "
              "mount -t proc proc /mnt 2>&1 && cat /mnt/1/cmdline; echo; "
              "echo 1 > /host/proc/sys/kernel/sysrq 2>&1 && echo SYSCTL-WRITTEN; true")
    _code, out = _run(sandbox_client, image, script)
    assert "READ-" not in out and "SYSCTL-WRITTEN" not in out, out
    assert "kvm" not in out and "kmsg" not in out.split("\n")[1:3]
    # A device request for the host's disk or kmsg fails: the sandbox's /dev does not hold them.
    for path in ("/dev/kmsg", "/dev/mem"):
        with pytest.raises(docker.errors.APIError):
            _run(sandbox_client, image, "true",
                 Devices=[{"PathOnHost": path, "PathInContainer": "/dev/x", "CgroupPermissions": "rwm"}])
