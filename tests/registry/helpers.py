"""Real authenticated registries for the registry-auth tests (fixtures re-exported by conftest.py).

Each is the Debian ``docker-registry`` started by pipeline.local.authregistry
with its own config, port and storage under the test's temp dir, and stopped
by its recorded pid. Passwords are random per session so that scanning
argv/outputs for them means something.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import secrets
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.imaging.oci import LAYER_TYPE, canonical_bytes, descriptor, manifest_bytes, sha256_digest
from pipeline.local import authregistry
from pipeline.local import registry as reg
from pipeline.local.tokenserver import TokenServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free loopback port for the block; yields ``127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wait_listening(port: int, what: str, *, alive: Callable[[], bool] = lambda: True, timeout: float = 30.0) -> None:
    """Until something accepts on 127.0.0.1:``port``; fails naming ``what`` when ``alive`` says its process
    died or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert alive() and time.monotonic() < deadline, f"{what} did not start listening on 127.0.0.1:{port}"
            time.sleep(0.1)


@dataclass
class AuthRegistry:
    registry: reg.Registry
    users: dict[str, str]
    server: TokenServer | None = None
    identity_token: str = ""

    @property
    def address(self) -> str:
        return self.registry.address

    @property
    def secrets(self) -> list[str]:
        """Every secret that must never show up in argv, logs, outputs or errors."""
        values = [*self.users.values()]
        values += [base64.b64encode(f"{u}:{p}".encode()).decode() for u, p in self.users.items()]
        if self.identity_token:
            values.append(self.identity_token)
        return values


@pytest.fixture(scope="session")
def htpasswd_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthRegistry]:
    state = tmp_path_factory.mktemp("htpasswd-registry")
    users = {"alice": "pw-" + secrets.token_urlsafe(18)}
    r = reg.Registry(address=f"127.0.0.1:{free_port()}", state=state)
    authregistry.start_htpasswd(r, users)
    try:
        yield AuthRegistry(r, users)
    finally:
        authregistry.stop(r)


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthRegistry]:
    state = tmp_path_factory.mktemp("token-registry")
    users = {"alice": "pw-" + secrets.token_urlsafe(18), "reader": "pw-" + secrets.token_urlsafe(18)}
    server = TokenServer(state / "token-server")
    server.add_user("alice", users["alice"], {"authtest/*": {"pull", "push"}, "benchseal/*": {"pull", "push"}})
    server.add_user("reader", users["reader"], {"authtest/*": {"pull"}})
    identity = "idt-" + secrets.token_urlsafe(24)
    server.add_identity_token(identity, "alice")
    server.start()
    r = reg.Registry(address=f"127.0.0.1:{free_port()}", state=state / "registry")
    try:
        authregistry.start_token(r, server)
        yield AuthRegistry(r, users, server, identity)
    finally:
        authregistry.stop(r)
        server.stop()


@pytest.fixture(autouse=True)
def _token_server_defaults(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests may bend the shared token server (lifetimes, answer field); restore it after each."""
    yield
    if "token_registry" in request.fixturenames:
        server: TokenServer | None = request.getfixturevalue("token_registry").server
        if server is not None:
            server.valid_for, server.reported_expires_in, server.answer_field = 300, None, "token"


def write_docker_config(directory: Path, config: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    return directory


def basic_entry(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def docker_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``docker_login(address, user, password)``: a Docker config as `docker login` writes it, in use."""
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)

    def login(address: str, user: str, password: str) -> Path:
        directory = write_docker_config(tmp_path / f"docker-{secrets.token_hex(4)}", {"auths": {address: basic_entry(user, password)}})
        monkeypatch.setenv("DOCKER_CONFIG", str(directory))
        return directory

    return login


@dataclass(frozen=True)
class TinyImage:
    manifest: bytes
    config: bytes
    layer: bytes
    layer_digest: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)


def tiny_image(text: str | None = None) -> TinyImage:
    """A one-layer OCI image the engine can pull (unique content per call)."""
    raw = io.BytesIO()
    content = (text or secrets.token_hex(16)).encode()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime, info.mode = len(content), 0, 0o644
        tar.addfile(info, io.BytesIO(content))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = canonical_bytes(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["/hello.txt"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]},
        }
    )
    digest = sha256_digest(layer)
    return TinyImage(manifest_bytes(config, [descriptor(LAYER_TYPE, digest, len(layer))]), config, layer, digest)


def push_tiny(client, repository: str, image: TinyImage, mount_from: str | None = None) -> str:  # type: ignore[no-untyped-def]
    client.push_blob(repository, image.layer_digest, len(image.layer), lambda: io.BytesIO(image.layer), mount_from=mount_from)
    client.push_blob(repository, sha256_digest(image.config), len(image.config), lambda: image.config)
    return str(client.put_manifest(repository, image.digest, image.manifest))


def assert_no_secret(text: str, registry: AuthRegistry) -> None:
    for value in registry.secrets:
        assert value not in text, "a secret leaked"


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
