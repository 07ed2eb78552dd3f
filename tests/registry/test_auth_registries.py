"""Push, SBOM read and engine pull against real registries that demand credentials.

Two Debian ``docker-registry`` instances started by the project code: one with
htpasswd (bcrypt) auth, one with token auth trusting a local token server that
signs ES256 JWTs. Nothing here is mocked: the registry checks the passwords and
the token signatures, scopes and expiry itself.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed
from pipeline.evidence.sbom import read_image
from pipeline.imaging.oci import sha256_digest
from pipeline.imaging.push import Registry
from tests.registry.helpers import (
    AuthRegistry,
    assert_no_secret,
    basic_entry,
    push_tiny,
    tiny_image,
    write_docker_config,
)

# --- htpasswd ------------------------------------------------------------------------------


def test_htpasswd_right_credentials_push_read_by_digest(htpasswd_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    docker_login(htpasswd_registry.address, "alice", htpasswd_registry.users["alice"])
    image = tiny_image()
    client = Registry(htpasswd_registry.address)
    digest = push_tiny(client, "authtest/basic", image)
    assert digest == image.digest == sha256_digest(image.manifest)
    assert client.stats.bytes_uploaded == len(image.layer) + len(image.config)
    # an unchanged push moves no bytes
    again = Registry(htpasswd_registry.address)
    assert push_tiny(again, "authtest/basic", image) == digest
    assert (again.stats.bytes_uploaded, again.stats.blobs_skipped) == (0, 2)
    # the SBOM reader reads it by digest through the same credentials
    contents = read_image(f"{htpasswd_registry.address}/authtest/basic@{digest}")
    assert contents.manifest == image.manifest and contents.layers == (image.layer_digest,)


def test_htpasswd_without_credentials_says_so(htpasswd_registry: AuthRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    with pytest.raises(CheckFailed, match="needs credentials and none were found"):
        Registry(htpasswd_registry.address).manifest_digest("authtest/basic", "latest")


def test_htpasswd_wrong_password_is_a_clear_error_without_secret(htpasswd_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    docker_login(htpasswd_registry.address, "alice", "wrong-" + htpasswd_registry.users["alice"])
    with pytest.raises(CheckFailed) as exc:
        push_tiny(Registry(htpasswd_registry.address), "authtest/basic", tiny_image())
    message = exc.value.diagnostics()
    assert "rejected the credentials from auths[" in message and exc.value.exit_code == 1
    assert_no_secret(message, htpasswd_registry)
    assert "wrong-" not in message


# --- token auth ----------------------------------------------------------------------------


def test_token_push_mount_and_read_with_per_repository_scopes(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    server = token_registry.server
    assert server is not None
    docker_login(token_registry.address, "alice", token_registry.users["alice"])
    image = tiny_image()
    client = Registry(token_registry.address)
    before = len(server.issued)
    digest = push_tiny(client, "authtest/src", image)
    assert digest == image.digest
    # cross-repository mount: one token with pull on the source and pull,push on the target
    mounted = Registry(token_registry.address)
    assert push_tiny(mounted, "authtest/dst", image, mount_from="authtest/src") == digest
    assert (mounted.stats.blobs_mounted, mounted.stats.bytes_uploaded) == (1, len(image.config))
    requested = [issued.requested for issued in server.issued[before:]]
    assert ("repository:authtest/dst:pull,push", "repository:authtest/src:pull") in requested
    granted = {issued.granted for issued in server.issued[before:] if "repository:authtest/src:pull" in issued.requested}
    assert granted == {(("authtest/dst", ("pull", "push")), ("authtest/src", ("pull",)))}
    # unchanged push: 0 bytes
    again = Registry(token_registry.address)
    assert push_tiny(again, "authtest/dst", image) == digest and again.stats.bytes_uploaded == 0
    contents = read_image(f"{token_registry.address}/authtest/dst@{digest}")
    assert contents.manifest == image.manifest


def test_token_identity_token_and_access_token_answers(token_registry: AuthRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = token_registry.server
    assert server is not None
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    directory = write_docker_config(tmp_path / "docker", {"auths": {token_registry.address: {"identitytoken": token_registry.identity_token}}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    image = tiny_image()
    assert push_tiny(Registry(token_registry.address), "authtest/idt", image) == image.digest
    # a server that answers GET with access_token only (OAuth2 style) works too
    monkeypatch.setenv("DOCKER_CONFIG", str(write_docker_config(tmp_path / "d2", {"auths": {token_registry.address: basic_entry("alice", token_registry.users["alice"])}})))
    server.answer_field = "access_token"
    assert Registry(token_registry.address).manifest_digest("authtest/idt", image.digest) == image.digest


def test_token_wrong_password_is_a_clear_error_without_secret(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    wrong = "wrong-" + token_registry.users["alice"]
    docker_login(token_registry.address, "alice", wrong)
    with pytest.raises(CheckFailed) as exc:
        push_tiny(Registry(token_registry.address), "authtest/x", tiny_image())
    message = exc.value.diagnostics()
    assert "token server rejected the credentials from auths[" in message
    assert_no_secret(message, token_registry)
    assert wrong not in message


def test_token_missing_push_scope_is_a_clear_error(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    docker_login(token_registry.address, "alice", token_registry.users["alice"])
    image = tiny_image()
    push_tiny(Registry(token_registry.address), "authtest/readonly", image)
    docker_login(token_registry.address, "reader", token_registry.users["reader"])
    # reading works with pull only ...
    assert Registry(token_registry.address).manifest_digest("authtest/readonly", image.digest) == image.digest
    # ... pushing does not, and says what is missing
    with pytest.raises(CheckFailed) as exc:
        push_tiny(Registry(token_registry.address), "authtest/readonly", tiny_image())
    message = exc.value.diagnostics()
    assert "do not grant repository:authtest/readonly:pull,push" in message
    assert_no_secret(message, token_registry)
    # a repository outside the user's grants: not even pull
    with pytest.raises(CheckFailed, match="do not grant repository:other/repo:pull"):
        Registry(token_registry.address).manifest_digest("other/repo", "latest")


def test_token_expiry_refreshes_before_use(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    server = token_registry.server
    assert server is not None
    docker_login(token_registry.address, "alice", token_registry.users["alice"])
    server.valid_for = 3  # the registry rejects the token 3 s after issue; the answer says so
    client = Registry(token_registry.address)
    push_tiny(client, "authtest/expiry", tiny_image())
    fetched = client.auth.tokens_fetched
    time.sleep(3.5)
    push_tiny(client, "authtest/expiry", tiny_image())
    assert client.auth.tokens_fetched > fetched
    assert client.auth.retried_after_401 == 0  # refreshed from expires_in, not after a refusal


def test_token_expired_early_is_refreshed_on_401_and_the_upload_resent(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    server = token_registry.server
    assert server is not None
    docker_login(token_registry.address, "alice", token_registry.users["alice"])
    server.valid_for, server.reported_expires_in = 3, 3600  # the answer lies: the client only learns from the 401
    client = Registry(token_registry.address)
    client.push_blob("authtest/expiry2", *_blob(b"first"))
    assert client.auth.tokens_fetched == 1
    time.sleep(3.5)
    data = os.urandom(300_000)
    opened: list[int] = []

    def open_data() -> io.BytesIO:
        opened.append(1)
        return io.BytesIO(data)

    client.push_blob("authtest/expiry2", sha256_digest(data), len(data), open_data)
    assert (client.auth.tokens_fetched, client.auth.retried_after_401) == (2, 1)
    assert client.stats.bytes_uploaded == 5 + len(data)
    assert Registry(token_registry.address).has_blob("authtest/expiry2", sha256_digest(data))


def _blob(data: bytes) -> tuple[str, int, object]:
    return sha256_digest(data), len(data), lambda: data


# --- the worker's pull through the Docker Engine ---------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["htpasswd", "token"])
def test_worker_pull_by_digest_with_auth_config(kind: str, request: pytest.FixtureRequest, docker_login) -> None:  # type: ignore[no-untyped-def]
    import docker

    from pipeline.infra.worker.loop import InfraFailure, pull_by_digest

    target: AuthRegistry = request.getfixturevalue(f"{kind}_registry")
    docker_login(target.address, "alice", target.users["alice"])
    image = tiny_image()
    digest = push_tiny(Registry(target.address), "authtest/pull", image)
    ref = ImageRef(f"{target.address}/authtest/pull", digest)
    client = docker.from_env(timeout=120)
    try:
        image_id = pull_by_digest(client, ref)
        assert client.images.get(ref.ref).id == image_id
        client.images.remove(image_id, force=True)
        # wrong credentials: the engine is refused, and the failure names no secret
        docker_login(target.address, "alice", "wrong-" + target.users["alice"])
        with pytest.raises(InfraFailure) as exc:
            pull_by_digest(client, ref)
        assert_no_secret(str(exc.value), target)
    finally:
        try:
            client.images.remove(ref.ref, force=True)
        except docker.errors.ImageNotFound:
            pass
        client.close()


def test_token_answer_without_a_token_fails_closed(token_registry: AuthRegistry, docker_login) -> None:  # type: ignore[no-untyped-def]
    server = token_registry.server
    assert server is not None
    docker_login(token_registry.address, "alice", token_registry.users["alice"])
    server.answer_field = "jwt"  # neither "token" nor "access_token"
    with pytest.raises(CheckFailed, match="neither token nor access_token"):
        Registry(token_registry.address).manifest_digest("authtest/x", "latest")


@pytest.mark.docker
def test_ensure_local_pulls_with_registry_auth_file(htpasswd_registry: AuthRegistry, docker_login, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import docker

    from pipeline.imaging.build import ensure_local

    docker_login(htpasswd_registry.address, "alice", htpasswd_registry.users["alice"])
    image = tiny_image()
    digest = push_tiny(Registry(htpasswd_registry.address), "authtest/ensure", image)
    ref = ImageRef(f"{htpasswd_registry.address}/authtest/ensure", digest)
    # Only a containers-auth.json (as podman/skopeo login write it) holds the credentials now.
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"auths": {f"{htpasswd_registry.address}/authtest": basic_entry("alice", htpasswd_registry.users["alice"])}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file))
    client = docker.from_env()
    try:
        ensure_local(ref)
        assert ref.ref in client.images.get(ref.ref).attrs["RepoDigests"]
    finally:
        try:
            client.images.remove(ref.ref, force=True)
        except docker.errors.ImageNotFound:
            pass
        client.close()
