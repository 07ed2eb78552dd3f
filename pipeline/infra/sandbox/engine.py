"""The sandbox engine: a rootless Docker Engine the runner and every trial container run on.

The host's root engine is never handed to anything under test. This engine runs as an
unprivileged service user (``benchseal-sandbox``, with /etc/subuid and /etc/subgid ranges)
inside rootlesskit's user namespace, so container root is that user on the host and a
``Privileged`` container holds capabilities over the sandbox's namespaces only. Around it:

* network: rootlesskit starts in a network namespace of its own (root's ``unshare --net``,
  loopback only) with ``--net=host``, and its child runs ``unshare --net`` again, so the daemon
  and every container (``NetworkMode: host`` included) live in a network namespace owned by the
  sandbox's user namespace holding loopback and its own bridges only, and rootlesskit's own
  processes (which a privileged container can see and ptrace) hold no host network either: no
  route to the host's network or its 127.0.0.1 services, not even its socket tables. The model is reached through the worker's Unix-socket
  relay (a file, not a route).
* processes: its own PID (``--pidns``), IPC and UTS namespaces (``PidMode: host`` is the sandbox's
  PID namespace); each container a private cgroup namespace.
* limits: the daemon is root of that user namespace but not in dockerd's rootless mode (which drops
  every cgroup setting on cgroup v1): it manages, with the cgroupfs driver, the cgroups root made and
  delegated to it (``prepare_cgroups``), so each container's memory, CPU and pids limits are the
  kernel's; ``require_sandbox_engine`` refuses an engine that is not confined or cannot enforce them.
* files: the child pivots into a fresh root holding only the system directories, a minimal
  /dev, the host temp dir and benchseal's state home (where run dirs, secret files and
  sockets live, each granted to the service user by ``grant``); so a bind of ``/`` sees no
  other host path, and what it sees is checked against the service user's uid.

Lifecycle as the other local services: started by benchseal with its pid recorded, stopped
by that pid only when its command line is ours; ``status`` says whether it answers and is
rootless. Run as root (it creates the service user and bind-mounts in its own namespace).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import paths
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.polling import poll_until
from pipeline.infra.sandbox import disk
from pipeline.infra.sandbox.limits import enforcement_refusal

if TYPE_CHECKING:
    import docker

SERVICE_USER = "benchseal-sandbox"
SANDBOX_DIR_ENV = "BENCHSEAL_SANDBOX_DIR"
DEFAULT_DIR = Path("/var/lib/benchseal-sandbox")
SUBID_COUNT = 65536
PACKAGES = ("rootlesskit", "slirp4netns", "uidmap", "fuse-overlayfs", "acl", "e2fsprogs", "mount")

# Runs as root in the sandbox's user namespace (rootlesskit's child, after ``unshare --net``).
_CHILD = """\
#!/bin/sh
# benchseal sandbox engine: written by pipeline/infra/sandbox/engine.py (do not edit).
set -eu
rm -f /run/docker /run/containerd /run/xtables.lock
ip link set lo up
# A new root with only the system dirs, a minimal /dev and the shared paths, at their host paths.
R="$XDG_RUNTIME_DIR/root"
mkdir -p "$R"
mount -t tmpfs -o mode=755 benchseal-sandbox-root "$R"
for d in usr etc run sys proc; do mkdir -p "$R/$d"; mount --rbind "/$d" "$R/$d"; done
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$R/$l"
  elif [ -d "/$l" ]; then mkdir "$R/$l"; mount --rbind "/$l" "$R/$l"; fi
done
# No securityfs: the engine would load AppArmor profiles it cannot load from a user namespace.
if [ -d "$R/sys/kernel/security" ]; then mount -t tmpfs -o ro,mode=555,nosuid,nodev,noexec none "$R/sys/kernel/security"; fi
mkdir -p "$R/dev"
mount -t tmpfs -o mode=755,nosuid benchseal-sandbox-dev "$R/dev"
for n in null zero full random urandom tty fuse; do
  if [ -e "/dev/$n" ]; then touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; fi
done
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$R/dev/shm"
mount -t mqueue mqueue "$R/dev/mqueue" 2>/dev/null || true
ln -s /proc/self/fd "$R/dev/fd"
mkdir -p "$R/tmp"; chmod 1777 "$R/tmp"
for p in $BENCHSEAL_SANDBOX_SHARE; do mkdir -p "$R$p"; mount --rbind "$p" "$R$p"; done
mkdir -p "$R/.old"
cd "$R"
pivot_root . .old
umount -l /.old
rmdir /.old
cd /
# Not in dockerd's rootless mode, which drops every cgroup setting on cgroup v1: the engine is root of
# the user namespace and manages the cgroups root delegated to it (cgroupfs driver), so each container's
# --memory, --cpus and --pids-limit are the kernel's, below the ceilings root set on their parent.
exec env -u ROOTLESSKIT_STATE_DIR -u ROOTLESSKIT_PARENT_EUID -u ROOTLESSKIT_PARENT_EGID \\
  dockerd --host "unix://$XDG_RUNTIME_DIR/docker.sock" --data-root "$BENCHSEAL_SANDBOX_DATA" \\
  --exec-root "$XDG_RUNTIME_DIR/exec" --pidfile "$XDG_RUNTIME_DIR/docker.pid" --storage-driver overlay2 \\
  --config-file "$BENCHSEAL_SANDBOX_CONFIG" --rootless=false --exec-opt native.cgroupdriver=cgroupfs \\
  --cgroup-parent "$BENCHSEAL_SANDBOX_CGROUP" --default-cgroupns-mode private --oom-score-adjust 0
"""


@dataclass(frozen=True)
class Sandbox:
    """Where one sandbox engine keeps its records (root-owned) and its engine (service-user-owned)."""

    base: Path
    user: str = SERVICE_USER

    @property
    def engine_dir(self) -> Path:
        return self.base / "engine"

    @property
    def runtime_dir(self) -> Path:
        return self.engine_dir / "run"

    @property
    def data_dir(self) -> Path:
        return self.engine_dir / "data"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def disk_file(self) -> Path:
        """The file holding the engine's own file system, mounted on its data root (``disk``)."""
        return self.base / disk.DISK_FILE

    @property
    def child_path(self) -> Path:
        return self.base / "child.sh"

    @property
    def pid_path(self) -> Path:
        return self.base / "sandbox.pid"

    @property
    def log_path(self) -> Path:
        return self.base / "sandbox.log"

    @property
    def rootlesskit_state(self) -> Path:
        return self.runtime_dir / "rootlesskit"

    @property
    def config_path(self) -> Path:
        """The engine's daemon.json (root writes it; the engine's own dir, so the engine sees it)."""
        return self.engine_dir / "daemon.json"

    @property
    def cgroup_name(self) -> str:
        """The cgroup (below each hierarchy's root) that root makes for this engine and its containers."""
        if self.base == DEFAULT_DIR:
            return SERVICE_USER
        return f"{SERVICE_USER}-{hashlib.sha256(str(self.base).encode()).hexdigest()[:12]}"

    @property
    def shared_record(self) -> Path:
        """The host paths the running engine sees (written by ``start``, root-owned)."""
        return self.base / "shared.json"

    @classmethod
    def at(cls, url: str) -> Sandbox:
        """The sandbox whose engine socket is ``unix://PATH`` (``<base>/engine/run/docker.sock``)."""
        socket = Path(url.removeprefix("unix://"))
        found = cls(base=socket.parents[2]) if url.startswith("unix:///") and len(socket.parents) > 3 else None
        if found is None or found.socket != socket:
            raise CheckFailed(f"{url} is not the socket of a benchseal sandbox engine (<dir>/engine/run/docker.sock)")
        return found


def default_sandbox() -> Sandbox:
    configured = os.environ.get(SANDBOX_DIR_ENV)
    base = Path(configured) if configured else DEFAULT_DIR
    if not base.is_absolute():
        raise UsageError(f"${SANDBOX_DIR_ENV} must be an absolute path, not {configured!r}")
    return Sandbox(base=base)


def temp_dir() -> Path:
    """This process's temp dir: ``$TMPDIR`` exactly when it is set (Python's tempfile would fall back
    to /tmp in silence when it is missing, and the sandbox would not see what is made there)."""
    configured = os.environ.get("TMPDIR")
    chosen = Path(tempfile.gettempdir()).resolve()
    if configured and chosen != Path(configured).resolve():
        raise UsageError(f"TMPDIR={configured}: not a writable directory (create it, owned by this user)")
    return chosen


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    """``path`` is one of ``roots`` or below one of them."""
    return any(path == root or root in path.parents for root in roots)


def shared_paths() -> list[Path]:
    """Host paths the sandbox engine sees (at the same paths): the temp dir and benchseal's state home."""
    out: list[Path] = []
    for path in (temp_dir(), paths.home()):
        if not _inside(path, out):
            out = [p for p in out if path not in p.parents] + [path]
    return out


# --- service user ---------------------------------------------------------------

def subid_start(files: Iterable[Path], user: str) -> int | None:
    """The first id after every range in ``files`` (at least 100000); None when ``user`` has one."""
    end = 100000
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.strip().split(":")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                continue
            if parts[0] == user:
                return None
            end = max(end, int(parts[1]) + int(parts[2]))
    return end


def append_line(path: Path, line: str) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    text = old + ("" if not old or old.endswith("\n") else "\n") + line + "\n"
    tmp = path.with_name(f".{path.name}.benchseal-new")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def ensure_user(user: str = SERVICE_USER) -> pwd.struct_passwd:
    """The service user (a system account without a login shell) with subordinate uid and gid ranges."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", "/usr/sbin/nologin", user], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise InfrastructureError(f"useradd {user} failed: {done.stderr.strip()}") from None
        account = pwd.getpwnam(user)
    subuid, subgid = Path("/etc/subuid"), Path("/etc/subgid")
    start = subid_start((subuid, subgid), user)
    if start is not None:
        for path in (subuid, subgid):
            append_line(path, f"{user}:{start}:{SUBID_COUNT}")
    for path in (subuid, subgid):
        if subid_start((path,), user) is not None:
            raise CheckFailed(f"{path}: {user} has no subordinate id range")
    return account


def subid_range(user: str = SERVICE_USER) -> tuple[int, int]:
    """(first, count) of the service user's subordinate uids."""
    for line in Path("/etc/subuid").read_text(encoding="utf-8").splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] == user:
            return int(parts[1]), int(parts[2])
    raise CheckFailed(f"/etc/subuid: {user} has no subordinate id range")


def missing_tools() -> list[str]:
    return [tool for tool in ("rootlesskit", "newuidmap", "newgidmap", "dockerd", "unshare", "ip", "setpriv", "setfacl", "getfacl",
                              "mkfs.ext4", "losetup", "mount", "umount")
            if shutil.which(tool) is None]


# --- access for the service user ---------------------------------------------------

def _user_acl_bits(path: Path, uid: int) -> int:
    """The effective rwx bits of ``uid``'s named entry in ``path``'s access ACL (0 when it has none), read
    with Debian's getfacl in the ACL long text form (acl(5)): ``user:<uid>:rwx``."""
    done = subprocess.run(["getfacl", "--physical", "--numeric", "--omit-header", "--", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InfrastructureError(f"getfacl {path}: {done.stderr.strip() or 'failed'}")
    for line in done.stdout.splitlines():
        entry, _, comment = line.partition("#")  # "user:1001:rwx\t#effective:r-x": what the mask lets through
        fields = entry.split()
        if fields and fields[0].startswith(f"user:{uid}:"):
            perms = fields[0].rsplit(":", 1)[1]
            if comment.startswith("effective:"):
                perms = "".join(char for char in perms if char in comment.removeprefix("effective:"))
            return sum(bit for char, bit in (("r", 4), ("w", 2), ("x", 1)) if char in perms)
    return 0


def _add_user_acl(path: Path, uid: int, perm: int) -> None:
    """Add the rwx bits ``perm`` to ``uid``'s entry in ``path``'s access ACL (bits it already has
    stay), with Debian's setfacl: the owner and mode stay, the mask widens to let the entry
    through, and ``--physical`` follows no symlink."""
    had = _user_acl_bits(path, uid)
    bits = had | perm
    if bits == had:
        return  # nothing to add (and no ownership of ``path`` needed to add nothing)
    text = "".join(char if bits & bit else "-" for char, bit in (("r", 4), ("w", 2), ("x", 1)))
    done = subprocess.run(["setfacl", "--physical", "-m", f"u:{uid}:{text}", "--", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InfrastructureError(f"setfacl {path}: {done.stderr.strip() or 'failed'}")


def grant(path: Path, sandbox: Sandbox | None = None, *, keep: tuple[str, ...] = ()) -> None:
    """Let the sandbox engine (the service user, container root there) use ``path``: its parents get
    search permission for that uid alone, ``path`` itself an ACL entry rwx for it (its owner and mode
    stay: 0700 is still private to everyone else), everything under it is chowned to it (modes kept,
    so a 0400 secret stays 0400), except the entries ``keep`` names directly under ``path`` (and what is
    under them): those stay the worker's, for the sandbox to read only as far as their modes let others."""
    account = pwd.getpwnam((sandbox or default_sandbox()).user)
    path = Path(os.path.abspath(path))
    _traverse(path.parent, account.pw_uid)
    if path.is_symlink():
        raise CheckFailed(f"{path}: a sandbox path must not be a symlink")
    _add_user_acl(path, account.pw_uid, 0o7)
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            if root == str(path):
                dirs[:] = [name for name in dirs if name not in keep]
                files = [name for name in files if name not in keep]
            for name in dirs + files:
                os.lchown(Path(root, name), account.pw_uid, account.pw_gid)


def service_uid(user: str) -> int:
    """The uid of the sandbox's service user ``user`` (``keep_reachable``'s)."""
    return pwd.getpwnam(user).pw_uid


def keep_reachable(path: Path, uid: int) -> list[Path]:
    """``grant``'s access to ``path`` for ``uid``, given back where a chmod took it away since; returns what it fixed.

    A named ACL entry counts only through the ACL mask, which is the mode's group bits: any chmod of ``path`` or
    of a parent to 0700 (an operator's, or pytest's of its temp root whenever another session starts) leaves the
    entry in place but ineffective, and the engine then answers a container create or start binding something
    under ``path`` with 400 ``stat ...: permission denied``. Called before each request the engine proxy forwards
    (``EnginePolicy.reachable``): one lstat per component when nothing changed; getfacl/setfacl only where
    the mask lost the bits ``grant`` gave (search on the parents, rwx on ``path``)."""
    path = Path(os.path.abspath(path))
    fixed: list[Path] = []
    for target, perm in [*((p, 0o1) for p in reversed(path.parents)), (path, 0o7)]:
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return fixed  # gone (the batch ended): nothing left to keep
        if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
            continue  # never followed (grant refused it); the uid's own
        if perm == 0o1 and st.st_mode & 0o001:
            continue  # searchable by everyone: grant added nothing here
        if (st.st_mode >> 3) & perm == perm:
            continue  # the mask still lets grant's entry through
        _add_user_acl(target, uid, perm)
        fixed.append(target)
    return fixed


def reclaim(path: Path, sandbox: Sandbox | None = None) -> None:
    """Take back a tree the sandbox engine worked in: every entry under ``path`` (``path`` too) that
    the sandbox's ids own becomes this process's user's again, directories owner-rwx and files
    owner-rw, setuid/setgid bits gone.

    Container root there is the service user and other container users are its subordinate ids,
    so what a batch leaves behind (a 0700 directory of uid 100999, a 0000 file) is otherwise
    neither readable nor removable by an unprivileged worker. Nothing is followed: links are left
    as they are, and every other entry is checked and changed through an ``O_PATH | O_NOFOLLOW``
    descriptor of what was opened (never by name again, which a racing process could swap). What
    is already the worker's is never changed. An entry of any other owner (a hard link the sandbox
    made to someone else's file, where the kernel's protected_hardlinks is off) is never chowned:
    that is a refusal. A worker that is not root needs CAP_CHOWN for this (deploy/benchseal-worker.service
    grants it as its one ambient capability)."""
    uid, gid = os.geteuid(), os.getegid()
    owner = (sandbox or default_sandbox()).user
    try:
        first, count = subid_range(owner)
        sandbox_ids = {pwd.getpwnam(owner).pw_uid, *range(first, first + count)}
    except (KeyError, OSError) as exc:
        raise InfrastructureError(f"the sandbox's user {owner} or its id range is not there ({exc})") from None

    def take(entry: str) -> None:
        try:
            fd = os.open(entry, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # gone since the listing
        try:
            info = os.fstat(fd)
            if info.st_uid == uid:
                # Already the worker's (made by it, or taken back before): never changed, so a name a
                # racing process swapped for a link to, say, a setuid binary of a root worker is left be.
                return
            if info.st_uid not in sandbox_ids:
                raise CheckFailed(f"{entry}: owned by uid {info.st_uid}, neither the sandbox's nor this worker's: "
                                  "left as it is")
            if stat.S_ISLNK(info.st_mode):
                # Never followed, and removable through its (reclaimed) directory: its owner does not
                # matter, and a chown by name could reach what a racing process put there instead.
                return
            handle = f"/proc/self/fd/{fd}"  # the inode that was opened, whatever the name points at now
            os.chown(handle, uid, gid)
            if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
                wanted = (info.st_mode & 0o777) | (0o700 if stat.S_ISDIR(info.st_mode) else 0o600)
                if stat.S_IMODE(info.st_mode) != wanted:
                    os.chmod(handle, wanted)
        except PermissionError as exc:
            raise InfrastructureError(
                f"{entry}: cannot take back what the sandbox engine wrote ({exc.strerror}); a worker that is not "
                "root needs CAP_CHOWN (deploy/benchseal-worker.service: AmbientCapabilities=CAP_CHOWN)") from None
        finally:
            os.close(fd)

    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        return
    take(str(path))
    if not path.is_dir() or path.is_symlink():
        return
    for root, dirs, files in os.walk(path):
        # Top-down: each subdirectory is made ours and listable before the walk descends into it.
        for name in dirs + files:
            take(os.path.join(root, name))


def controller_uid(sandbox: Sandbox, user: str) -> int:
    """The uid of a user that may drive the engine: an existing, unprivileged user, not the engine's own."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise UsageError(f"--controller: no user {user!r} on this host") from None
    if uid == 0 or user == sandbox.user:
        raise UsageError(f"--controller: {user!r} must be an unprivileged user other than {sandbox.user}")
    return uid


def allow_controller(sandbox: Sandbox, uid: int) -> None:
    """Let ``uid`` (the worker's service user) use the engine's socket: search permission on the two
    directories above it and read/write on the socket, each an ACL entry for that uid alone (the
    engine's data stays 0700 to it)."""
    for directory in (sandbox.engine_dir, sandbox.runtime_dir):
        _add_user_acl(directory, uid, 0o1)
    _add_user_acl(sandbox.socket, uid, 0o6)


# --- process ------------------------------------------------------------------------

def _ours(sandbox: Sandbox, pid: int) -> bool:
    """``pid`` is this sandbox's engine: rootlesskit with our child script (not its re-executed child)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(part.endswith(b"rootlesskit") for part in cmdline[:1]) and str(sandbox.child_path).encode() in cmdline


def _recorded_pid(sandbox: Sandbox) -> int | None:
    try:
        pid = int(sandbox.pid_path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    # Only a process we started: rootlesskit with our state dir and our child script.
    return pid if _ours(sandbox, pid) else None


def _unrecorded_engines(sandbox: Sandbox) -> list[int]:
    """This sandbox's engines whose pid is not the recorded one (a start whose record another start
    overwrote): they hold its data root's lock, so no new engine could start beside them."""
    recorded = _recorded_pid(sandbox)
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and int(entry.name) != recorded and _ours(sandbox, int(entry.name))]


def _terminate(sandbox: Sandbox, pid: int, wait_seconds: float) -> None:
    """SIGTERM to ``pid`` while it is this sandbox's engine; SIGKILL if it outlives ``wait_seconds``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    gone = poll_until(lambda: True if not _ours(sandbox, pid) else None, timeout=wait_seconds, interval=0.2)
    if not gone and _ours(sandbox, pid):
        os.kill(pid, signal.SIGKILL)


def engine_info(url: str, timeout: float = 5.0) -> dict[str, object] | None:
    """``GET /info`` of the engine at ``unix://PATH``; None when it does not answer."""
    # The runner image's CLI registers this module's verbs and ships no Docker SDK (test_app_entry.py).
    # lazy: the Docker SDK (with requests) costs 158 ms to import
    import docker
    import docker.errors
    import requests

    if not url.startswith("unix://") or not os.path.exists(url.removeprefix("unix://")):
        return None
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
    except docker.errors.DockerException:
        return None
    try:
        info = client.info()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return None
    finally:
        client.close()
    return info if isinstance(info, dict) else None


def confinement_refusal(url: str) -> str | None:
    """Why the engine listening at ``unix://PATH`` is not confined to a user namespace (None: it is).

    Asked of the kernel, not of the engine: the listener's credentials on its socket (SO_PEERCRED,
    translated to this process's namespaces), then, when its process is visible here, its uid map."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(5.0)
            conn.connect(url.removeprefix("unix://"))
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError as exc:
        return f"its socket cannot be asked who listens on it ({exc.strerror or exc})"
    if uid == 0:
        return "it runs as root on this host (uid 0), not as an unprivileged user in a user namespace"
    try:
        mapping = Path(f"/proc/{pid}/uid_map").read_text(encoding="ascii").split() if pid > 0 else []
    except OSError:
        mapping = []  # not visible from this process's PID namespace: its host uid is not root, as above
    if mapping[:3] == ["0", "0", "4294967295"]:
        return f"it runs as uid {uid} in the host's user namespace, not in a user namespace of its own"
    return None


def engine_refusal(url: str, info: dict[str, object]) -> str | None:
    """Why the engine at ``url`` (which answered ``info``) may not run anything under test (None: it may)."""
    confinement = confinement_refusal(url)
    if confinement is not None:
        return confinement
    refusal = enforcement_refusal(info)
    if refusal is not None:
        return f"it cannot enforce a trial's declared limits: {refusal}"
    return disk_refusal(url, info)


def disk_refusal(url: str, info: dict[str, object]) -> str | None:
    """Why the engine's data root is not bounded (None: it is its sandbox's own file system, ``disk``)."""
    root, own = info.get("DockerRootDir"), Sandbox.at(url)
    if not isinstance(root, str) or Path(root) != own.data_dir or not disk.is_own_mount(own.data_dir, own.disk_file):
        return (f"its data root {root} is not the file system in {own.disk_file} (a trial could fill the host's "
                "disk)")
    return None


def require_sandbox_engine(url: str) -> None:
    """Fail closed: the engine at ``url`` must answer, run confined to a user namespace, and enforce
    a container's memory, CPU and process limits."""
    info = engine_info(url)
    if info is None:
        raise InfrastructureError(f"the sandbox engine {url} does not answer (start it: benchseal sandbox start)")
    refusal = engine_refusal(url, info)
    if refusal is not None:
        raise CheckFailed(f"the sandbox engine {url} is refused: {refusal} (restart it as root: benchseal sandbox "
                          "stop && benchseal sandbox start)")


def require_sees(url: str, needed: Iterable[Path]) -> None:
    """Fail closed unless the sandbox engine at ``url`` sees every path in ``needed`` at its host path
    (each under a path its ``start`` shared): a worker's temp dir or state home outside them would
    hand the runner binds of directories the engine cannot see."""
    record = Sandbox.at(url).shared_record
    try:
        shared = [Path(p) for p in json.loads(record.read_text(encoding="utf-8"))["paths"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckFailed(f"{record}: no record of the paths the sandbox engine sees (restart it: "
                          "benchseal sandbox stop && benchseal sandbox start)") from None
    for path in needed:
        path = path.resolve()
        if not _inside(path, shared):
            raise CheckFailed(f"the sandbox engine {url} does not see {path} (it shares "
                              f"{', '.join(map(str, shared))}): give the worker a TMPDIR and BENCHSEAL_HOME "
                              "inside them, or start the sandbox with the worker's BENCHSEAL_HOME and TMPDIR")


def answers(sandbox: Sandbox) -> bool:
    """Ours answers, confined and enforcing limits."""
    info = engine_info(sandbox.url, timeout=3.0)
    return info is not None and engine_refusal(sandbox.url, info) is None


# --- cgroups: delegated by root, managed by the engine -------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
CEILING_PIDS = 32768  # all of one engine's containers together (each has its own, smaller bound)
CEILING_MEMORY_SHARE = 0.9  # of this host's memory, for all of one engine's containers together


def _cgroup_write(path: Path, value: str) -> None:
    try:
        path.write_text(value, encoding="ascii")
    except OSError as exc:
        raise InfrastructureError(f"{path}: cannot write {value!r} ({exc.strerror}): the sandbox engine cannot "
                                  "be given cgroups to limit its containers") from None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy, by its controllers (``/proc/self/cgroup``; "" is cgroup v2)."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            out[controller] = path
    return out


def prepare_cgroups(sandbox: Sandbox, account: pwd.struct_passwd) -> tuple[str, list[Path]]:
    """Make the engine's cgroups below this process's own: ``<name>/`` (where the engine runs; on
    cgroup v2 its leaf ``<name>/engine``) and ``<name>/docker``, which the service user owns so its
    engine makes one cgroup per container there (dockerd's cgroupfs driver), while the limit files
    of ``docker`` stay root's: the ceilings of all its containers together. Returns (the engine's
    ``--cgroup-parent``, the ``cgroup.procs`` files the engine's first process joins)."""
    uid, gid = account.pw_uid, account.pw_gid
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text(encoding="ascii").splitlines()]
    own = _own_cgroups()
    memory_ceiling = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * CEILING_MEMORY_SHARE)
    if any(m[1] == str(CGROUP_ROOT) and m[2] == "cgroup2" for m in mounts if len(m) > 2):
        # cgroup v2 (a systemd host: deploy/benchseal-sandbox.service delegates its cgroup): no process may
        # stay in a cgroup whose controllers are enabled for its children, so this process moves to the leaf.
        top = CGROUP_ROOT / own.get("", "/").lstrip("/") / sandbox.cgroup_name
        engine, docker = top / "engine", top / "docker"
        for directory in (top, engine, docker):
            directory.mkdir(parents=True, exist_ok=True)
        _cgroup_write(engine / "cgroup.procs", str(os.getpid()))
        parent_procs = top.parent / "cgroup.procs"
        for pid in parent_procs.read_text(encoding="ascii").split() if top.parent != CGROUP_ROOT else []:
            _cgroup_write(engine / "cgroup.procs", pid)
        available = (top.parent / "cgroup.controllers").read_text(encoding="ascii").split()
        wanted = " ".join(f"+{c}" for c in ("cpu", "cpuset", "io", "memory", "pids") if c in available)
        for directory in ([top.parent] if top.parent != CGROUP_ROOT else []) + [top, docker]:
            _cgroup_write(directory / "cgroup.subtree_control", wanted)
        _cgroup_write(docker / "memory.max", str(memory_ceiling))
        _cgroup_write(docker / "pids.max", str(CEILING_PIDS))
        # The engine moves its containers' processes between its leaf and docker/: top's cgroup.procs.
        for path in (docker, engine, top / "cgroup.procs", *(docker / f for f in (
                "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"))):
            os.chown(path, uid, gid)
        return f"/{docker.relative_to(CGROUP_ROOT)}", [engine / "cgroup.procs"]
    hierarchies = [Path(m[1]) for m in mounts if len(m) > 3 and m[2] == "cgroup" and m[1].startswith(f"{CGROUP_ROOT}/")]
    if not hierarchies:
        raise InfrastructureError(f"no cgroup hierarchy is mounted under {CGROUP_ROOT}: the sandbox engine cannot "
                                  "limit its containers")
    joins: list[Path] = []
    for hierarchy in hierarchies:
        options = next(m[3] for m in mounts if len(m) > 3 and m[1] == str(hierarchy)).split(",")
        key = next((own_key for own_key in own if own_key and own_key in options), None)
        top = hierarchy / (own.get(key, "/") if key else "/").lstrip("/") / sandbox.cgroup_name
        docker = top / "docker"
        docker.mkdir(parents=True, exist_ok=True)
        if (hierarchy / "cpuset.cpus").exists():  # a new cpuset cgroup has no CPUs until given its parent's
            for name in ("cpuset.cpus", "cpuset.mems"):
                for directory in (top, docker):
                    if not (directory / name).read_text(encoding="ascii").strip():
                        _cgroup_write(directory / name, (directory.parent / name).read_text(encoding="ascii").strip())
        if (docker / "memory.limit_in_bytes").exists():
            _cgroup_write(docker / "memory.limit_in_bytes", str(memory_ceiling))
            if (docker / "memory.memsw.limit_in_bytes").exists():
                _cgroup_write(docker / "memory.memsw.limit_in_bytes", str(memory_ceiling))
        if (docker / "pids.max").exists():
            _cgroup_write(docker / "pids.max", str(CEILING_PIDS))
        for path in (docker, docker / "cgroup.procs", docker / "tasks"):
            os.chown(path, uid, gid)
        joins.append(top / "cgroup.procs")
    # Relative: below the engine's own cgroup in each hierarchy (runc resolves it from its own cgroup).
    return "docker", joins


def _prepare_dirs(sandbox: Sandbox, account: pwd.struct_passwd) -> None:
    sandbox.base.mkdir(parents=True, exist_ok=True)
    os.chown(sandbox.base, 0, 0)
    os.chmod(sandbox.base, 0o755)  # noqa: S103 - records only; the engine dirs below are 0700
    for path in (sandbox.engine_dir, sandbox.runtime_dir, sandbox.data_dir):
        path.mkdir(exist_ok=True)
        os.chown(path, account.pw_uid, account.pw_gid)
        os.chmod(path, 0o700)
    # Root-owned, so the service user cannot change what runs in its namespace.
    tmp = sandbox.child_path.with_name(".child.sh.new")
    tmp.write_text(_CHILD, encoding="utf-8")
    os.chmod(tmp, 0o755)  # noqa: S103 - a script the service user runs and must not change
    os.replace(tmp, sandbox.child_path)
    # The engine's own key where it always was (rootless mode put it under $HOME/.config), no /etc/docker.
    config = {"deprecated-key-path": str(sandbox.engine_dir / ".config" / "docker" / "key.json")}
    atomic_write_text(sandbox.config_path, json.dumps(config) + "\n")
    os.chmod(sandbox.config_path, 0o644)


def start(sandbox: Sandbox | None = None, wait_seconds: float = 60.0, controllers: Iterable[str] = ()) -> str:
    """Start the sandbox engine unless ours already answers; return 'running' or 'started'. Each of
    ``controllers`` (an unprivileged worker's user) may then use its socket (``allow_controller``)."""
    sandbox = sandbox or default_sandbox()
    if os.geteuid() != 0:
        raise UsageError("benchseal sandbox start must run as root (it creates the service user and its namespaces)")
    uids = [controller_uid(sandbox, user) for user in controllers]
    sandbox.base.mkdir(parents=True, exist_ok=True)
    # One start at a time (tests and units start it concurrently): the second finds the first's engine.
    with (sandbox.base / "start.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(sandbox, uids, wait_seconds)


def _start_locked(sandbox: Sandbox, uids: list[int], wait_seconds: float) -> str:
    if _recorded_pid(sandbox) is not None and answers(sandbox):
        for uid in uids:
            allow_controller(sandbox, uid)
        return "running"
    # Ours but refused (an engine of an earlier kind, in rootless mode, enforces no limit here), not
    # answering, or unrecorded: stopped before a new one starts on the same data root.
    stop(sandbox)
    for pid in _unrecorded_engines(sandbox):
        _terminate(sandbox, pid, 30.0)
    missing = missing_tools()
    if missing:
        raise InfrastructureError(f"the sandbox engine needs {', '.join(missing)} (apt packages: {' '.join(PACKAGES)})")
    account = ensure_user(sandbox.user)
    _prepare_dirs(sandbox, account)
    disk.mount_data_root(sandbox.data_dir, sandbox.disk_file, account.pw_uid, account.pw_gid)
    cgroup_parent, cgroup_joins = prepare_cgroups(sandbox, account)
    share = shared_paths()
    for path in share:
        _traverse(path, account.pw_uid)
    # Leftovers of an engine that died: its runtime dir (sockets, pid files, the pivot root).
    for entry in sandbox.runtime_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    atomic_write_text(sandbox.shared_record, json.dumps({"paths": [str(p) for p in share]}) + "\n")
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(sandbox.engine_dir),
        "USER": sandbox.user,
        "XDG_RUNTIME_DIR": str(sandbox.runtime_dir),
        "BENCHSEAL_SANDBOX_DATA": str(sandbox.data_dir),
        # The engine's own dir too: its socket must be where the host looks for it.
        "BENCHSEAL_SANDBOX_SHARE": " ".join(str(p) for p in [sandbox.engine_dir, *share]),
        "BENCHSEAL_SANDBOX_CONFIG": str(sandbox.config_path),
        "BENCHSEAL_SANDBOX_CGROUP": cgroup_parent,
    }
    if any(" " in str(p) for p in share):
        raise UsageError(f"sandbox shared paths must not contain spaces: {share}")
    # Outer network namespace (root's, loopback only): rootlesskit's own processes are in it too, so
    # a privileged container that can ptrace or read /proc of the sandbox's pid 1 (rootlesskit's
    # child) finds no host network there either. The daemon's is the inner one (``unshare --net``
    # in the child), owned by the sandbox's user namespace, where it may create its bridges.
    argv = ["unshare", "--net", "--",
            "setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups",
            "rootlesskit", "--net=host", "--pidns", "--ipcns", "--utsns",
            "--copy-up=/etc", "--copy-up=/run", "--propagation=rslave",
            f"--state-dir={sandbox.rootlesskit_state}",
            "unshare", "--net", "--", str(sandbox.child_path)]
    with sandbox.log_path.open("ab") as log:
        # The shell records its own pid, then execs setpriv, which execs rootlesskit: one pid throughout.
        # It joins the engine's cgroups first (as root: the files are root's), so everything it starts is there.
        joins = 'for f in $BENCHSEAL_SANDBOX_CGROUPS; do echo $$ > "$f" || exit 1; done; '
        env["BENCHSEAL_SANDBOX_CGROUPS"] = " ".join(str(path) for path in cgroup_joins)
        subprocess.Popen(["setsid", "sh", "-c", joins + 'echo $$ > "$1"; shift; exec "$@"', "sh", str(sandbox.pid_path),
                          *argv],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
                         cwd=str(sandbox.engine_dir))
    if poll_until(lambda: True if answers(sandbox) else None, timeout=wait_seconds, interval=0.3):
        for uid in uids:
            allow_controller(sandbox, uid)
        return "started"
    stop(sandbox)  # nothing left running that the next start would have to find
    raise InfrastructureError(f"the sandbox engine did not answer within {wait_seconds:.0f}s; see {sandbox.log_path}")


def _traverse(path: Path, uid: int) -> None:
    """Let ``uid`` reach ``path`` (search permission on it and its parents; no listing, no reading)."""
    for target in [*reversed(path.parents), path]:
        st = os.lstat(target)
        if stat.S_ISLNK(st.st_mode):
            raise CheckFailed(f"{target}: a symlink on the way to a sandbox path")
        if not st.st_mode & 0o001 and st.st_uid != uid:
            _add_user_acl(target, uid, 0o1)


def stop(sandbox: Sandbox | None = None, wait_seconds: float = 30.0) -> str:
    """Stop the sandbox engine we started (by recorded pid); never touch another process."""
    sandbox = sandbox or default_sandbox()
    pid = _recorded_pid(sandbox)
    if pid is None:
        if engine_info(sandbox.url, timeout=3.0) is not None:
            return "not ours"
    else:
        _terminate(sandbox, pid, wait_seconds)
        sandbox.pid_path.unlink(missing_ok=True)
    disk.unmount_data_root(sandbox.data_dir, sandbox.disk_file)  # busy (an engine we did not start): kept
    return "stopped"


def status(sandbox: Sandbox | None = None) -> dict[str, object]:
    sandbox = sandbox or default_sandbox()
    info = engine_info(sandbox.url, timeout=3.0)
    return {
        "socket": str(sandbox.socket),
        "answers": info is not None,
        "confined": info is not None and confinement_refusal(sandbox.url) is None,
        "limits": info is not None and enforcement_refusal(info) is None,
        "pid": _recorded_pid(sandbox),
        "user": sandbox.user,
        **({"disk_own": False} if not sandbox.data_dir.is_dir() else _disk_status(sandbox)),
    }


def _disk_status(sandbox: Sandbox) -> dict[str, object]:
    found = disk.state(sandbox.data_dir, sandbox.disk_file)
    return {"disk_own": found.own, "disk_gib": found.size_gib, "disk_free_gib": found.free_gib}


# --- images -----------------------------------------------------------------------------

def copy_image(source: docker.DockerClient, target: docker.DockerClient, image_id: str) -> str:
    """Give ``target`` (the sandbox engine) the image ``image_id`` of ``source`` (the host engine, where
    it was pulled by digest and its signatures checked); return the id, which must come out the same.

    An image id is the sha256 of the image config, which names every layer by its diff id, and the
    engine checks each loaded layer against it: the sandbox runs exactly the admitted bytes.
    (``docker load`` leaves RepoDigests empty, so the sandbox refers to images by id.)"""
    # The runner image's CLI registers this module's verbs and ships no Docker SDK (test_app_entry.py).
    # lazy: the Docker SDK (with requests) costs 158 ms to import
    import docker
    import docker.errors
    import requests

    if not image_id.startswith("sha256:") or len(image_id) != 71:
        raise CheckFailed(f"image id {image_id!r} is not sha256:<64 hex>")
    try:
        if target.images.get(image_id).id == image_id:
            return image_id
    except docker.errors.ImageNotFound:
        pass
    try:
        stream = source.api.get_image(image_id)
        target.api.load_image(stream)
        loaded: str = target.images.get(image_id).id
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise InfrastructureError(f"copying image {image_id} into the sandbox engine failed: {exc}") from None
    if loaded != image_id:
        raise CheckFailed(f"the sandbox engine loaded {loaded} for image {image_id}")
    return loaded
