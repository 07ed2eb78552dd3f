"""Registries that demand credentials, as ghcr.io or Docker Hub do, run locally.

The Debian ``docker-registry`` (distribution 2.8) with the config pipeline.local.registry
builds (``config_text``, ``write_config``) plus an http secret and an ``auth`` section, its own
port and storage, started with its pid recorded and stopped by that pid only (the same rules as
pipeline.local.registry, whose launch() and stop() it reuses):

- ``start_htpasswd``: ``auth.htpasswd`` with bcrypt entries made by
  ``htpasswd -iBn USER`` (apache2-utils), the password on stdin, never in argv;
- ``start_token``: ``auth.token`` pointing at a token server
  (pipeline.local.tokenserver) whose signing certificate is the root bundle.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request

from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.polling import poll_until
from pipeline.local import registry as reg
from pipeline.local.tokenserver import TokenServer


def _answers(registry: reg.Registry, timeout: float = 0.5) -> bool:
    """Up and speaking the API: 200, or 401 with a challenge."""
    try:
        with urllib.request.urlopen(f"{registry.url}/v2/", timeout=timeout) as response:  # noqa: S310 - loopback URL we built
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code == 401 and "WWW-Authenticate" in exc.headers
    except (urllib.error.URLError, OSError):
        return False


def _start(registry: reg.Registry, auth_yaml: str, wait_seconds: float) -> None:
    host, _, port = registry.address.rpartition(":")
    if host != "127.0.0.1" or not port.isdigit():
        raise ValidationError("address", "must be 127.0.0.1:PORT", registry.address)
    if _answers(registry):
        raise InfrastructureError(f"something already answers on {registry.address}")
    # The settings this registry always ran with (level info, no access log), its secret and auth section.
    reg.write_config(registry, reg.config_text(registry, log_level="info", access_log=False,
                                               secret=os.urandom(16).hex(), auth=auth_yaml))
    reg.launch(registry)
    if poll_until(lambda: True if _answers(registry) else None, timeout=wait_seconds, interval=0.2):
        return
    reg.stop(registry)
    raise InfrastructureError(f"registry on {registry.address} did not answer within {wait_seconds:.0f}s; see {registry.log_path}")


def htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd entry; the password goes to ``htpasswd -i`` on stdin."""
    if not user or ":" in user or "\n" in user:
        raise ValidationError("user", "must be non-empty without ':' or newlines", user)
    try:
        done = subprocess.run(["htpasswd", "-iBn", user], input=password, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise InfrastructureError("htpasswd not found: install apache2-utils (scripts/setup.sh does)") from None
    line = done.stdout.strip()
    if done.returncode != 0 or not line.startswith(f"{user}:$2"):
        raise InfrastructureError(f"htpasswd -B failed for user {user!r} (exit {done.returncode})")
    return line


def start_htpasswd(registry: reg.Registry, users: dict[str, str], wait_seconds: float = 20.0) -> None:
    registry.state.mkdir(parents=True, exist_ok=True)
    path = registry.state / "htpasswd"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(htpasswd_line(u, p) + "\n" for u, p in users.items()))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    _start(registry, f"auth:\n  htpasswd:\n    realm: benchseal\n    path: {path}\n", wait_seconds)


def start_token(registry: reg.Registry, server: TokenServer, wait_seconds: float = 20.0) -> None:
    """Start a registry that trusts tokens from ``server`` (already started)."""
    auth = (
        "auth:\n  token:\n"
        f"    realm: {server.realm}\n"
        f"    service: {server.service}\n"
        f"    issuer: {server.issuer}\n"
        f"    rootcertbundle: {server.cert_path}\n"
    )
    _start(registry, auth, wait_seconds)


def stop(registry: reg.Registry) -> str:
    return reg.stop(registry)
