"""The engine proxy's JSON bodies: decoded as the engine's Go decoder maps them, checked, forwarded canonical.

The whitelists of container create (``_CREATE``), exec create/start, container update and
volume create live here; ``engine_proxy.EngineProxy`` applies them (and adds what needs the
engine or the host: resolved bind sources, labels, the network it forces).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pipeline.infra.sandbox.engine_refusal import Refused
from pipeline.infra.sandbox.limits import check_ulimits

# --- JSON bodies: decoded as the engine's Go decoder does, forwarded canonical ----------
#
# encoding/json matches an object key to a struct field case-insensitively (and, for a
# non-ASCII key, through Unicode folding: U+212A KELVIN SIGN is "k", U+017F LONG S is "s"),
# the last of two keys for one field wins (nested objects are merged, maps extended), null
# into a string/bool/number is a no-op and unknown keys are ignored. The proxy does not
# re-implement those merges: it refuses a non-ASCII key and any two keys for one field or
# map entry, maps every key to its field's canonical name, checks each field against a
# whitelist (a field it does not know is refused unless its value is the zero value, which
# is then dropped) and forwards the body it re-serialised, so what it checked is what the
# engine decodes.

Checker = Callable[[Any, str], Any]
_DROP = object()  # a checker's answer: leave the field out of the canonical body


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Refused(f"duplicate JSON key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise Refused(f"JSON constant {name} is not allowed")


def _load_json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError):
        raise Refused(f"{what}: body is not JSON") from None


def _is_zero(value: Any) -> bool:
    return value is None or value is False or (value == 0 and not isinstance(value, bool)) or value in ("", [], {})


def _canon(obj: Any, schema: dict[str, Checker], where: str) -> dict[str, Any]:
    """``obj`` with every key renamed to its schema field and every value checked; Refused otherwise."""
    if not isinstance(obj, dict):
        raise Refused(f"{where}: expected a JSON object")
    fields = {name.lower(): name for name in schema}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if not key.isascii():
            raise Refused(f"{where}.{key}: a non-ASCII key is not allowed (the engine folds some to ASCII)")
        name = fields.get(key.lower())
        if name is None:
            if value is None or value is False or value == "" or (value == 0 and not isinstance(value, bool)):
                continue  # the engine's default: leaving it out changes nothing
            raise Refused(f"{where}.{key} is not allowed (not a field the proxy knows to be safe)")
        if name in out or f"\0{name}" in out:
            raise Refused(f"{where}.{key}: two keys for one field (the engine would merge them)")
        checked = schema[name](value, f"{where}.{name}")
        out[name if checked is not _DROP else f"\0{name}"] = checked
    return {name: value for name, value in out.items() if not name.startswith("\0")}


def _zero(value: Any, where: str) -> Any:
    if not _is_zero(value):
        raise Refused(f"{where} is not allowed (only its zero value)")
    return _DROP


def _never(reason: str) -> Checker:
    def check(value: Any, where: str) -> Any:
        if not _is_zero(value):
            raise Refused(f"{where}: {reason}")
        return _DROP
    return check


def _absent(value: Any, where: str) -> Any:
    if value is not None:  # MaskedPaths: [] unmasks /proc/kcore and the rest: only absent is safe
        raise Refused(f"{where} is not allowed (any value, even empty, changes the engine's defaults)")
    return _DROP


def _typed(*types: type, nullable: bool = True) -> Checker:
    def check(value: Any, where: str) -> Any:
        if value is None and nullable:
            return _DROP
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            raise Refused(f"{where}: expected {'/'.join(t.__name__ for t in types)}")
        return value
    return check


def _int_range(low: int, high: int) -> Checker:
    def check(value: Any, where: str) -> Any:
        if value is None:
            return _DROP
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Refused(f"{where}: expected an integer in [{low}, {high}]")
        return value
    return check


def _one_of(*allowed: str) -> Checker:
    def check(value: Any, where: str) -> Any:
        if value is None:
            return _DROP
        if value not in allowed:
            raise Refused(f"{where}={value!r} is not allowed (allowed: {', '.join(map(repr, allowed))})")
        return value
    return check


def _list_of(item: Checker) -> Checker:
    def check(value: Any, where: str) -> Any:
        if value is None:
            return _DROP
        if not isinstance(value, list):
            raise Refused(f"{where}: expected a list")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return check


def _map_of(item: Checker) -> Checker:
    def check(value: Any, where: str) -> Any:
        if value is None:
            return _DROP
        if not isinstance(value, dict):
            raise Refused(f"{where}: expected an object")
        return {str(k): item(v, f"{where}[{k!r}]") for k, v in value.items()}
    return check


def _struct(schema: dict[str, Checker]) -> Checker:
    def check(value: Any, where: str) -> Any:
        return _DROP if value is None else _canon(value, schema, where)
    return check


def _empty_object(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise Refused(f"{where}: expected an object")
    return {}  # map[string]struct{}: the engine reads no member of it


def _str_slice(value: Any, where: str) -> Any:
    """strslice.StrSlice: a string or a list of strings."""
    return value if isinstance(value, str) else _STRS(value, where)


_STR = _typed(str)
_BOOL = _typed(bool)
_INT = _int_range(-(2**63), 2**63 - 1)
_NONNEG = _int_range(0, 2**63 - 1)
_STRS = _list_of(_typed(str, nullable=False))
_STRMAP = _map_of(_typed(str, nullable=False))
_LOG_OPTS = frozenset({"max-size", "max-file", "compress", "mode", "max-buffer-size"})
_NO_NEW_PRIVILEGES = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
_TMPFS_OPTION = re.compile(r"(rw|ro|noexec|exec|nosuid|nodev|size=[0-9]+[kmgKMG%]?|mode=[0-7]{3,4}|uid=[0-9]+|"
                           r"gid=[0-9]+|nr_inodes=[0-9]+[kmgKMG]?)")


def _log_config(value: Any, where: str) -> Any:
    spec = _canon(value, {"Type": _one_of("", "json-file", "local", "none"), "Config": _STRMAP}, where)
    unknown = sorted(set(spec.get("Config") or {}) - _LOG_OPTS)
    if unknown:
        raise Refused(f"{where}.Config {', '.join(unknown)} is not allowed")
    return spec


def _tmpfs(value: Any, where: str) -> Any:
    spec = _STRMAP(value, where)
    for target, options in (spec if spec is not _DROP else {}).items():
        bad = [o for o in options.split(",") if o and not _TMPFS_OPTION.fullmatch(o)]
        if not target.startswith("/") or bad:
            raise Refused(f"{where}[{target!r}]: tmpfs option {', '.join(bad) or 'target'} is not allowed")
    return spec


_RESOURCES: dict[str, Checker] = {
    "CpuShares": _NONNEG, "Memory": _NONNEG, "NanoCpus": _NONNEG, "CgroupParent": _zero,
    "BlkioWeight": _int_range(0, 1000), "BlkioWeightDevice": _zero, "BlkioDeviceReadBps": _zero,
    "BlkioDeviceWriteBps": _zero, "BlkioDeviceReadIOps": _zero, "BlkioDeviceWriteIOps": _zero,
    "CpuPeriod": _NONNEG, "CpuQuota": _INT, "CpuRealtimePeriod": _zero, "CpuRealtimeRuntime": _zero,
    "CpusetCpus": _STR, "CpusetMems": _STR, "Devices": _zero, "DeviceCgroupRules": _zero,
    "DeviceRequests": _zero, "KernelMemory": _NONNEG, "KernelMemoryTCP": _zero, "MemoryReservation": _NONNEG,
    "MemorySwap": _int_range(-1, 2**63 - 1), "MemorySwappiness": _int_range(-1, 100), "OomKillDisable": _zero,
    "PidsLimit": _INT, "Ulimits": check_ulimits, "CpuCount": _zero, "CpuPercent": _zero, "IOMaximumIOps": _zero,
    "IOMaximumBandwidth": _zero,
}
_RESTART = _struct({"Name": _one_of("", "no"), "MaximumRetryCount": _zero})
_MOUNT: dict[str, Checker] = {
    "Type": _one_of("bind", "volume", "tmpfs"), "Source": _STR, "Target": _STR, "ReadOnly": _BOOL,
    "Consistency": _one_of("", "default", "consistent", "cached", "delegated"),
    "BindOptions": _struct({"Propagation": _one_of("", "private", "rprivate"), "NonRecursive": _BOOL,
                            "CreateMountpoint": _BOOL}),  # (creates a missing source, which is under the roots)
    "VolumeOptions": _struct({"NoCopy": _BOOL, "Labels": _STRMAP, "DriverConfig": _zero}),
    "TmpfsOptions": _struct({"SizeBytes": _NONNEG, "Mode": _int_range(0, 0o7777)}),
}
_HOST_CONFIG: dict[str, Checker] = {
    "Binds": _STRS, "ContainerIDFile": _zero, "LogConfig": _log_config, "NetworkMode": _one_of("", "default", "none"),
    "PortBindings": _zero, "RestartPolicy": _RESTART, "AutoRemove": _BOOL, "VolumeDriver": _zero,
    "VolumesFrom": _zero, "ConsoleSize": _list_of(_NONNEG), "CapAdd": _zero, "CapDrop": _STRS,
    "CgroupnsMode": _one_of("", "private"), "Dns": _STRS, "DnsOptions": _STRS, "DnsSearch": _STRS,
    "ExtraHosts": _STRS, "GroupAdd": _STRS, "IpcMode": _one_of("", "private", "none", "shareable"), "Cgroup": _zero,
    "Links": _zero, "OomScoreAdj": _int_range(0, 1000), "PidMode": _zero, "Privileged": _never("privileged containers are not allowed"),
    "PublishAllPorts": _zero, "ReadonlyRootfs": _BOOL, "SecurityOpt": _list_of(_one_of(*_NO_NEW_PRIVILEGES)),
    "StorageOpt": _zero, "Tmpfs": _tmpfs, "UTSMode": _zero, "UsernsMode": _zero,
    "ShmSize": _int_range(0, 8 << 30), "Sysctls": _zero, "Runtime": _one_of("", "runc"),
    "Isolation": _one_of("", "default"), "Mounts": _list_of(_struct(_MOUNT)), "MaskedPaths": _absent,
    "ReadonlyPaths": _absent, "Init": _BOOL, **_RESOURCES,
}
_HEALTHCHECK = _struct({"Test": _STRS, "Interval": _NONNEG, "Timeout": _NONNEG, "StartPeriod": _NONNEG,
                        "StartInterval": _NONNEG, "Retries": _NONNEG})
# The create body is ContainerConfigWrapper: container.Config's fields, HostConfig, NetworkingConfig; the
# engine ALSO reads a deprecated embedded HostConfig from the top level, which is not in this list (refused).
_CREATE: dict[str, Checker] = {
    "Hostname": _STR, "Domainname": _STR, "User": _STR, "AttachStdin": _BOOL, "AttachStdout": _BOOL,
    "AttachStderr": _BOOL, "ExposedPorts": _map_of(_empty_object), "Tty": _BOOL, "OpenStdin": _BOOL,
    "StdinOnce": _BOOL, "Env": _STRS, "Cmd": _str_slice, "Healthcheck": _HEALTHCHECK, "ArgsEscaped": _BOOL,
    "Image": _STR, "Volumes": _map_of(_empty_object), "WorkingDir": _STR, "Entrypoint": _str_slice,
    "NetworkDisabled": _BOOL, "MacAddress": _STR, "OnBuild": _zero, "Labels": _STRMAP, "StopSignal": _STR,
    "StopTimeout": _INT, "Shell": _STRS, "HostConfig": _struct(_HOST_CONFIG),
    "NetworkingConfig": lambda value, where: _DROP,  # replaced by the proxy's own network
}
_EXEC: dict[str, Checker] = {
    "User": _STR, "Privileged": _never("privileged exec is not allowed"), "Tty": _BOOL, "ConsoleSize": _list_of(_NONNEG), "AttachStdin": _BOOL,
    "AttachStderr": _BOOL, "AttachStdout": _BOOL, "Detach": _BOOL, "DetachKeys": _STR, "Env": _STRS,
    "WorkingDir": _STR, "Cmd": _str_slice,
    "Container": lambda value, where: _DROP,  # the Python SDK sends it; the engine reads the id from the path
}
_EXEC_START: dict[str, Checker] = {"Detach": _BOOL, "Tty": _BOOL, "ConsoleSize": _list_of(_NONNEG)}
_VOLUME: dict[str, Checker] = {"Name": _STR, "Driver": _one_of("", "local"), "DriverOpts": _zero, "Labels": _STRMAP,
                               "ClusterVolumeSpec": _zero}
_UPDATE: dict[str, Checker] = {**_RESOURCES, "RestartPolicy": _RESTART}


# Labels are how benchseal's worker and this proxy mark what they own (``benchseal.*``, ``dev.benchseal.*``):
# a runner sets none of them, on anything (any case, any spelling that contains the name).
_RESERVED_LABEL = re.compile(r"benchseal", re.IGNORECASE)


def check_labels(labels: Any, where: str) -> dict[str, str]:
    """``labels`` (a JSON object of strings) holding no key of benchseal's namespace; Refused otherwise."""
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise Refused(f"{where}: expected an object of strings")
    reserved = sorted(k for k in labels if _RESERVED_LABEL.search(k))
    if reserved:
        raise Refused(f"{where} {reserved[0]!r}: labels naming benchseal are the worker's and the proxy's own")
    return dict(labels)


def _dump(spec: dict[str, Any]) -> bytes:
    return json.dumps(spec).encode()
