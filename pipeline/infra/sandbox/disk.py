"""The sandbox engine's disk: its data root on a file system of its own, of a fixed size (a loop mount).

Why: RLIMIT_FSIZE (``limits``) bounds one file, and a trial may write many; the agent under test may try
to exhaust resources. Everything a container writes lands in the engine's data root (overlay2's upper
dirs), and the per-container quota overlay2 offers (``--storage-opt size``) needs xfs project quotas,
which a user namespace cannot set. So root gives the whole engine one ext4 file system kept in a file
and mounted on its data root: when the containers fill it they get ENOSPC, and the host's own disk
(the queue, the runs' evidence and logs, the worker's state, other services) keeps its space. Found by
the hostile corpus: a disk attack's 1 GiB writes filled the host disk when it had 5 GiB free.

The rule:

* the file is ``<sandbox dir>/engine-data.ext4`` (root's, 0600), made at the first ``start`` and kept
  across restarts (images stay warm); its size is ``$BENCHSEAL_SANDBOX_DISK_GIB``, else half the free
  space of the file system that holds it, at most ``DEFAULT_MAX_GIB``; below ``MIN_GIB`` start is
  refused in one line naming the variable;
* it is sparse and mounted with ``discard``: the host holds what the engine uses, freed again as the
  engine deletes (an image removed, a container gone); its loop device reads and writes it with direct
  I/O, so no page of it is cached twice (a container's memory cgroup would be charged for both);
* the engine's data from before it had a file system of its own is removed when the file is made (its
  images come back by id, task images are rebuilt), never anything else;
* ``stop`` unmounts it once the engine is gone; a size changed later applies to a new file (stop,
  remove the file, start).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import InfrastructureError, UsageError

DISK_ENV = "BENCHSEAL_SANDBOX_DISK_GIB"
DISK_FILE = "engine-data.ext4"
DEFAULT_MAX_GIB = 64
MIN_GIB = 8
_GIB = 1 << 30


@dataclass(frozen=True)
class DiskState:
    """What ``status`` reports of the engine's disk."""

    own: bool  # the data root is the mount of the sandbox's own file
    size_gib: float
    free_gib: float


def _mounted_source(point: Path) -> str | None:
    """The source device of the mount at ``point`` (from /proc/self/mountinfo), or None."""
    target, found = str(point), None
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:  # the last mount on a point is the one seen there
            fields = line.split()
            if len(fields) > 9 and fields[4] == target:
                found = fields[fields.index("-") + 2]
    return found


def _backing_file(device: str) -> str | None:
    """The file a loop device (``/dev/loopN``) reads, from sysfs, or None."""
    name = Path(device).name
    if not name.startswith("loop"):
        return None
    try:
        return Path(f"/sys/block/{name}/loop/backing_file").read_text(encoding="utf-8").strip()
    except OSError:
        return None


def is_own_mount(data_dir: Path, disk_file: Path) -> bool:
    """Whether ``data_dir`` is a mount of ``disk_file`` (through a loop device)."""
    source = _mounted_source(data_dir)
    return source is not None and _backing_file(source) == str(disk_file)


def chosen_size(holder: Path) -> int:
    """The size (bytes) of a new disk file in ``holder``: ``$BENCHSEAL_SANDBOX_DISK_GIB``, else half the free
    space there, at most DEFAULT_MAX_GIB; UsageError below MIN_GIB."""
    configured = os.environ.get(DISK_ENV)
    if configured:
        try:
            gib = float(configured)
        except ValueError:
            raise UsageError(f"${DISK_ENV}={configured!r}: not a number of GiB") from None
        size = int(gib * _GIB)
    else:
        size = min(shutil.disk_usage(holder).free // 2, DEFAULT_MAX_GIB * _GIB)
    if size < MIN_GIB * _GIB:
        raise UsageError(f"${DISK_ENV}: the sandbox engine's disk would be {size / _GIB:.1f} GiB, below the "
                         f"{MIN_GIB} GiB it needs (free space on {holder}, or set ${DISK_ENV})")
    return size


def _run(*argv: str) -> str:
    """Run a system tool; its stdout, stripped, or InfrastructureError naming the tool and what it said."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InfrastructureError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def mount_data_root(data_dir: Path, disk_file: Path, uid: int, gid: int, size: int | None = None) -> None:
    """Give the engine's ``data_dir`` its own file system (module docstring), owned by ``uid``:``gid``, 0700.
    Called by root with the engine stopped; a mount of ``disk_file`` already there is kept. ``size`` (bytes)
    of a new file: default ``chosen_size``."""
    if not is_own_mount(data_dir, disk_file):
        if os.path.ismount(data_dir):
            raise InfrastructureError(f"{data_dir} is a mount of something else than {disk_file}: unmount it first")
        if not disk_file.exists():
            size = size or chosen_size(disk_file.parent)
            # The engine's data from before it had a disk of its own: it would lie hidden under the mount.
            for entry in data_dir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            fresh = disk_file.with_name(f".{disk_file.name}.new")
            fresh.unlink(missing_ok=True)
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size)  # sparse: the host holds only what is written
            finally:
                os.close(fd)
            _run("mkfs.ext4", "-q", "-F", "-m", "0", "-L", "benchseal-sbx",
                 "-E", f"root_owner={uid}:{gid},nodiscard", str(fresh))
            os.replace(fresh, disk_file)
        # Direct I/O on the file: its pages are not cached a second time (under the file system's own cache),
        # where the kernel would charge them to the memory cgroup of the container reading, on top of its own.
        device = _run("losetup", "--find", "--show", "--direct-io=on", str(disk_file))
        try:
            _run("mount", "-o", "discard", device, str(data_dir))
        finally:
            # Detached now if the mount failed, else when it is unmounted (the kernel's autoclear of a busy device).
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
    os.chown(data_dir, uid, gid)
    os.chmod(data_dir, 0o700)


def unmount_data_root(data_dir: Path, disk_file: Path) -> None:
    """Unmount the engine's own file system (the engine is gone); the file stays. Busy: left for the next start."""
    if is_own_mount(data_dir, disk_file):
        subprocess.run(["umount", str(data_dir)], capture_output=True, check=False)


def state(data_dir: Path, disk_file: Path) -> DiskState:
    usage = shutil.disk_usage(data_dir)
    return DiskState(own=is_own_mount(data_dir, disk_file), size_gib=round(usage.total / _GIB, 1),
                     free_gib=round(usage.free / _GIB, 1))
