"""Declared limits in the sandbox: whether an engine enforces them, and what every container carries.

Memory, CPU and process bounds are the kernel's cgroups, applied per container by the engine's
own cgroup driver; a file-size bound is the ``fsize`` rlimit (RLIMIT_FSIZE: a write past it fails
with EFBIG, and a sparse file counts by its apparent size). An engine whose cgroup driver is
``none`` (rootless Docker on cgroup v1) accepts ``--memory`` and ``--pids-limit`` and enforces
neither: ``enforcement_refusal`` says so from its ``GET /info``, and the worker refuses to start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pipeline.infra.sandbox.engine_refusal import Refused

# Each trial container's bound on processes (the pids cgroup; a fork past it fails with EAGAIN).
TRIAL_PIDS = 1024
# A file's largest size in a container when its task declares no storage_mb (RLIMIT_FSIZE, bytes).
DEFAULT_FSIZE = 1 << 30
# What `GET /info` must report for --memory, --memory-swap, --cpus and --pids-limit to hold.
_NEEDED = (("MemoryLimit", "memory"), ("PidsLimit", "pids"), ("CpuCfsQuota", "CPU quota"))


def enforcement_refusal(info: dict[str, Any]) -> str | None:
    """Why the engine that answered ``info`` cannot enforce a container's declared limits (None: it can)."""
    driver = str(info.get("CgroupDriver") or "none")
    if driver == "none":
        return (f"it runs without cgroups (CgroupDriver none, cgroup v{info.get('CgroupVersion') or '?'}), so "
                "--memory, --cpus and --pids-limit are accepted and not enforced")
    missing = [what for key, what in _NEEDED if info.get(key) is not True]
    if missing:
        return f"its cgroups ({driver} driver) cannot limit {', '.join(missing)}"
    return None


@dataclass(frozen=True)
class ContainerLimits:
    """What the engine proxy gives a container created without a limit, and the most it lets one ask for."""

    memory: int = 2048 << 20  # bytes (Harbor's default task memory)
    nano_cpus: int = 1_000_000_000
    pids: int = TRIAL_PIDS
    fsize: int = DEFAULT_FSIZE
    max_memory: int = 0  # 0: this host's memory
    max_nano_cpus: int = 0  # 0: this host's CPUs
    max_fsize: int = 64 << 30

    def ceilings(self) -> tuple[int, int]:
        memory = self.max_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return memory, self.max_nano_cpus or (os.cpu_count() or 1) * 1_000_000_000


def _ulimits(value: Any, where: str) -> int | None:
    """The fsize a create body's ``Ulimits`` asks for (None: none); any other rlimit is refused."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise Refused(f"{where}: expected a list")
    asked: int | None = None
    for i, item in enumerate(value):
        if not isinstance(item, dict) or {k.lower() for k in item} != {"name", "soft", "hard"}:
            raise Refused(f"{where}[{i}]: expected {{Name, Soft, Hard}}")
        fields = {k.lower(): v for k, v in item.items()}
        if fields["name"] != "fsize" or asked is not None:
            raise Refused(f"{where}[{i}]: only one fsize rlimit is allowed")
        soft, hard = fields["soft"], fields["hard"]
        if any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in (soft, hard)) or soft != hard:
            raise Refused(f"{where}[{i}]: fsize needs Soft == Hard, a positive number of bytes")
        asked = int(soft)
    return asked


def check_ulimits(value: Any, where: str) -> Any:
    """The engine-body checker of ``HostConfig.Ulimits`` (``engine_bodies``): one fsize rlimit or none."""
    _ulimits(value, where)
    return value


def enforce(host: dict[str, Any], limits: ContainerLimits) -> None:
    """Give the canonical ``HostConfig`` of a container create its bounds: memory (swap included),
    CPUs, processes and file size, each the request's own when it names one within the ceiling,
    the policy's when it names none; a request above a ceiling is refused."""
    max_memory, max_cpus = limits.ceilings()
    if host.get("CpuQuota") or host.get("CpuPeriod"):
        raise Refused("HostConfig.CpuQuota/CpuPeriod: give the CPU bound as NanoCpus")
    memory = int(host.get("Memory") or 0) or limits.memory
    cpus = int(host.get("NanoCpus") or 0) or limits.nano_cpus
    asked_pids = int(host.get("PidsLimit") or 0)
    pids = asked_pids if asked_pids > 0 else limits.pids
    fsize = _ulimits(host.get("Ulimits"), "HostConfig.Ulimits") or limits.fsize
    for name, value, ceiling in (("Memory", memory, max_memory), ("NanoCpus", cpus, max_cpus),
                                 ("PidsLimit", pids, limits.pids), ("Ulimits fsize", fsize, limits.max_fsize)):
        if value > ceiling:
            raise Refused(f"HostConfig.{name} {value} is above the sandbox's bound {ceiling}")
    host.update({"Memory": memory, "MemorySwap": memory, "NanoCpus": cpus, "PidsLimit": pids,
                 "Ulimits": [{"Name": "fsize", "Soft": fsize, "Hard": fsize}]})
    for key in ("CpuQuota", "CpuPeriod", "KernelMemory"):
        host.pop(key, None)
