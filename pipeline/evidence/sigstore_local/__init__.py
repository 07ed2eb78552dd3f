"""The private Sigstore instance on 127.0.0.1 (Node server built on @sigstore/mock).

``server.js`` serves Fulcio (with CT log), Rekor v1 and v2, an RFC 3161 TSA and an
OIDC token minter on one loopback port, and writes ``trusted_root.json`` and one
client trust config per Rekor API version into its state directory. This module
starts it with its pid recorded, stops only that pid, and mints identity tokens.

State: ``pipeline.paths.state_dir("sigstore")`` unless a directory is given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline import paths
from pipeline.errors import InfrastructureError, ValidationError

SERVER_JS = Path(__file__).with_name("server.js")
LOCAL_ISSUER = "https://oidc.benchseal.invalid"
LOCAL_IDENTITY = "https://benchseal.invalid/signers/local"


@dataclass(frozen=True)
class LocalInstance:
    """A running local instance, as its ``instance.json`` describes it."""

    state: Path
    pid: int
    url: str
    trusted_root: Path
    signing_config: Path  # ClientTrustConfig (trusted root + signing config), Rekor v1
    signing_config_rekor2: Path  # the same with Rekor v2
    issuer: str
    identity: str
    token_url: str

    def client_trust_config(self, rekor_version: int = 1) -> Path:
        if rekor_version not in (1, 2):
            raise ValidationError("rekor_version", "must be 1 or 2", rekor_version)
        return self.signing_config if rekor_version == 1 else self.signing_config_rekor2


def default_state() -> Path:
    return paths.state_dir("sigstore")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise InfrastructureError("node is not installed (run `make setup`)")
    return node


def _pid_path(state: Path) -> Path:
    return state / "server.pid"


def _read_instance(state: Path) -> LocalInstance | None:
    try:
        data = json.loads((state / "instance.json").read_text())
        configs = data["client_trust_config"]
        return LocalInstance(
            state=state,
            pid=int(data["pid"]),
            url=str(data["url"]),
            trusted_root=Path(data["trusted_root"]),
            signing_config=Path(configs["1"]),
            signing_config_rekor2=Path(configs["2"]),
            issuer=str(data["issuer"]),
            identity=str(data["identity"]),
            token_url=str(data["token_url"]),
        )
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None


def _ours(state: Path, pid: int) -> bool:
    """True when ``pid`` is the node server we started for ``state``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return str(SERVER_JS).encode() in cmdline and str(state).encode() in cmdline


def _answers(instance: LocalInstance, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{instance.url}/healthz", timeout=timeout) as response:  # noqa: S310 - loopback URL
            return bool(json.loads(response.read()).get("pid") == instance.pid)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running(state: Path | None = None) -> LocalInstance | None:
    """The instance serving ``state``, or None when none answers."""
    state = state or default_state()
    instance = _read_instance(state)
    if instance is not None and _ours(state, instance.pid) and _answers(instance):
        return instance
    return None


def ensure_running(state: Path | None = None, *, port: int = 0, wait_seconds: float = 30.0) -> LocalInstance:
    """Return the running instance for ``state``; start one (pid recorded) if none answers.

    A new start generates new keys, so bundles made by an earlier instance verify
    only against that instance's trusted_root.json (keep it with the release).
    """
    state = (state or default_state()).resolve()
    state.mkdir(parents=True, exist_ok=True)
    found = running(state)
    if found is not None:
        return found
    (state / "instance.json").unlink(missing_ok=True)
    log = (state / "server.log").open("ab")
    try:
        process = subprocess.Popen(
            [_node(), str(SERVER_JS), "--state", str(state), "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            cwd=str(paths.REPO_ROOT),
        )
    finally:
        log.close()
    _pid_path(state).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise InfrastructureError(f"local Sigstore server exited with {process.returncode}; see {state / 'server.log'}")
        instance = _read_instance(state)
        if instance is not None and instance.pid == process.pid and _answers(instance, timeout=0.5):
            return instance
        time.sleep(0.1)
    process.kill()
    raise InfrastructureError(f"local Sigstore server did not answer within {wait_seconds:.0f}s; see {state / 'server.log'}")


def stop(state: Path | None = None) -> str:
    """Stop the server we started for ``state`` (by recorded pid); never another process."""
    state = (state or default_state()).resolve()
    try:
        pid = int(_pid_path(state).read_text().strip())
    except (FileNotFoundError, ValueError):
        return "stopped"
    if not _ours(state, pid):
        _pid_path(state).unlink(missing_ok=True)
        return "stopped"
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not _ours(state, pid):
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    _pid_path(state).unlink(missing_ok=True)
    return "stopped"


def status(state: Path | None = None) -> dict[str, object]:
    state = (state or default_state()).resolve()
    instance = running(state)
    return {
        "state": str(state),
        "answers": instance is not None,
        "pid": instance.pid if instance else None,
        "url": instance.url if instance else None,
        "trusted_root": str(instance.trusted_root) if instance else None,
    }


def mint_token(instance: LocalInstance, *, subject: str | None = None, claims: dict[str, object] | None = None,
               ttl_seconds: int = 600) -> str:
    """An ES256 identity token from the instance's OIDC issuer (accepted by its Fulcio only)."""
    body = json.dumps({"sub": subject, "claims": claims or {}, "ttl_seconds": ttl_seconds}).encode()
    request = urllib.request.Request(instance.token_url, data=body, method="POST",  # noqa: S310 - loopback URL
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback URL
            return str(json.loads(response.read())["token"])
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        raise InfrastructureError(f"local OIDC issuer at {instance.token_url} did not mint a token: {exc}") from None
