"""The local OCI registry (CNCF distribution, Debian ``docker-registry``).

benchseal writes its own config (no auth, loopback only, storage under the
state dir), starts the registry with its pid recorded, and only ever stops the
process whose pid it recorded and whose command line names that config.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.polling import poll_until

DEFAULT_ADDRESS = "127.0.0.1:5055"

_CONFIG = """\
version: 0.1
log:
  level: {log_level}
  accesslog:
    disabled: {access_log_disabled}
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: {address}
{secret}  headers:
    X-Content-Type-Options: [nosniff]
"""


@dataclass(frozen=True)
class Registry:
    address: str
    state: Path

    @property
    def config_path(self) -> Path:
        return self.state / "config.yml"

    @property
    def pid_path(self) -> Path:
        return self.state / "registry.pid"

    @property
    def log_path(self) -> Path:
        return self.state / "registry.log"

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def default_registry() -> Registry:
    address = os.environ.get("BENCHSEAL_REGISTRY", DEFAULT_ADDRESS)
    host, _, port = address.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValidationError("BENCHSEAL_REGISTRY", "must be 127.0.0.1:PORT (the local registry listens on loopback only)", address)
    return Registry(address=address, state=paths.state_dir("registry"))


def config_text(registry: Registry, *, log_level: str = "warn", access_log: bool = True,
                secret: str | None = None, auth: str = "") -> str:
    """The one registry config: storage under ``<state>/data``, the registry's address, nosniff.

    A registry that demands credentials (pipeline.local.authregistry) adds its ``http.secret``
    and its ``auth:`` section (YAML text ending in a newline)."""
    return _CONFIG.format(log_level=log_level, access_log_disabled="false" if access_log else "true",
                          root=registry.state / "data", address=registry.address,
                          secret="" if secret is None else f"  secret: {secret}\n") + auth


def write_config(registry: Registry, text: str) -> None:
    """Create the storage directory and write ``text`` to ``config_path``: owner-only (an auth
    registry's config holds its secret), replaced atomically."""
    (registry.state / "data").mkdir(parents=True, exist_ok=True)
    atomic_write_text(registry.config_path, text, mode=0o600)


def answers(registry: Registry, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{registry.url}/v2/", timeout=timeout) as response:  # noqa: S310 - loopback URL we built
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _recorded_pid(registry: Registry) -> int | None:
    try:
        pid = int(registry.pid_path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return None
    # Only a process we started: docker-registry serving our config.
    if any(part.endswith(b"docker-registry") for part in cmdline) and str(registry.config_path).encode() in cmdline:
        return pid
    return None


def launch(registry: Registry) -> None:
    """Start ``docker-registry serve <config>`` in its own session, its pid recorded by the shell
    that execs it (so only that process is ever stopped)."""
    with registry.log_path.open("ab") as log:
        subprocess.Popen(
            ["setsid", "sh", "-c", 'echo $$ > "$1"; exec docker-registry serve "$2"', "sh",
             str(registry.pid_path), str(registry.config_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )


def start(registry: Registry, wait_seconds: float = 20.0) -> str:
    """Start the registry unless it already answers; return 'running' or 'started'."""
    if answers(registry):
        return "running"
    write_config(registry, config_text(registry))
    launch(registry)
    if poll_until(lambda: True if answers(registry, timeout=0.5) else None, timeout=wait_seconds, interval=0.2):
        return "started"
    raise InfrastructureError(f"registry on {registry.address} did not answer within {wait_seconds:.0f}s; see {registry.log_path}")


def stop(registry: Registry) -> str:
    """Stop the registry we started (by recorded pid); never touch another process."""
    pid = _recorded_pid(registry)
    if pid is None:
        return "not ours" if answers(registry) else "stopped"
    os.kill(pid, signal.SIGTERM)
    poll_until(lambda: True if not Path(f"/proc/{pid}").exists() else None, timeout=5.0, interval=0.1)
    registry.pid_path.unlink(missing_ok=True)
    return "stopped"


def status(registry: Registry) -> dict[str, object]:
    return {
        "address": registry.address,
        "answers": answers(registry),
        "pid": _recorded_pid(registry),
        "config": str(registry.config_path),
    }
