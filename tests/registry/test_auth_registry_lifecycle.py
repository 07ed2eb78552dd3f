"""The authenticated registries the project starts: own config, own port, pid recorded, stopped by pid."""

from __future__ import annotations

import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.local import authregistry
from pipeline.local import registry as reg
from tests.registry.helpers import free_port


def test_htpasswd_registry_starts_with_bcrypt_and_stops_by_pid(tmp_path: Path) -> None:
    r = reg.Registry(address=f"127.0.0.1:{free_port()}", state=tmp_path)
    authregistry.start_htpasswd(r, {"alice": "pw-lifecycle-secret"})
    try:
        pid = int(r.pid_path.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert any(part.endswith(b"docker-registry") for part in cmdline) and str(r.config_path).encode() in cmdline
        assert not any(b"pw-lifecycle-secret" in part for part in cmdline)
        entry = (tmp_path / "htpasswd").read_text()
        assert entry.startswith("alice:$2") and "pw-lifecycle-secret" not in entry  # bcrypt, not the password
        assert stat.S_IMODE((tmp_path / "htpasswd").stat().st_mode) == 0o600
        assert stat.S_IMODE(r.config_path.stat().st_mode) == 0o600
        with pytest.raises(urllib.error.HTTPError) as challenge:
            urllib.request.urlopen(f"{r.url}/v2/", timeout=5)
        assert challenge.value.code == 401 and challenge.value.headers["WWW-Authenticate"].startswith("Basic")
        # a second registry on the same address is refused, not silently shared
        with pytest.raises(InfrastructureError, match="already answers"):
            authregistry.start_htpasswd(reg.Registry(address=r.address, state=tmp_path / "other"), {"bob": "x"})
    finally:
        assert authregistry.stop(r) == "stopped"
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()


def test_auth_registry_refuses_non_loopback_address(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"127\.0\.0\.1:PORT"):
        authregistry.start_htpasswd(reg.Registry(address="0.0.0.0:5999", state=tmp_path), {"alice": "x"})


def test_htpasswd_user_names_are_checked() -> None:
    with pytest.raises(ValidationError, match="user"):
        authregistry.htpasswd_line("a:b", "x")
