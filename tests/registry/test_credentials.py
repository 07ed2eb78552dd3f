"""Where credentials come from: Docker config, credential helpers, REGISTRY_AUTH_FILE.

Helpers are real executables on PATH (docker-credential-<name>), run the way
the Docker CLI runs them: ``get`` with the server on stdin.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.registry_auth import (
    AuthSession,
    Credentials,
    docker_auth_config,
    is_loopback,
    parse_challenge,
    registry_url,
    resolve_credentials,
)
from tests.registry.helpers import basic_entry, write_docker_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))


def _helper(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / f"docker-credential-{name}"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_config_means_anonymous() -> None:
    assert resolve_credentials("ghcr.io", "acme/runner") is None
    assert docker_auth_config("ghcr.io") == {}  # {} keeps the Docker SDK from looking on its own


def test_docker_config_auths_basic_identity_token_and_hub_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = write_docker_config(
        tmp_path / "docker",
        {
            "auths": {
                "https://ghcr.io": basic_entry("acme-bot", "ghp_secret:with:colons"),
                "registry.example.com:5000": {"identitytoken": "refresh-xyz"},
                "https://index.docker.io/v1/": basic_entry("hubuser", "hubpw"),
                "empty.example.com": {},
            }
        },
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    ghcr = resolve_credentials("ghcr.io", "acme/runner")
    assert ghcr is not None and (ghcr.username, ghcr.password) == ("acme-bot", "ghp_secret:with:colons")
    assert "ghp_secret" not in repr(ghcr) and "ghp_secret" not in str(ghcr)
    other = resolve_credentials("registry.example.com:5000")
    assert other is not None and other.identity_token == "refresh-xyz"
    assert docker_auth_config("registry.example.com:5000") == {"identitytoken": "refresh-xyz"}
    hub = resolve_credentials("registry-1.docker.io", "library/debian")
    assert hub is not None and hub.username == "hubuser"
    assert resolve_credentials("empty.example.com") is None
    assert resolve_credentials("ghcr.io.evil.example") is None  # no prefix matching of hosts


def test_cred_helper_gets_server_on_stdin_never_in_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "helper-calls"
    _helper(
        tmp_path / "bin",
        "benchtest",
        f'server=$(cat); printf "%s|%s\\n" "$*" "$server" >> {log}\n'
        'printf \'{"ServerURL":"%s","Username":"helper-user","Secret":"helper-secret"}\' "$server"\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    directory = write_docker_config(tmp_path / "docker", {"auths": {"ghcr.io": {}}, "credHelpers": {"ghcr.io": "benchtest"}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    found = resolve_credentials("ghcr.io", "acme/runner")
    assert found is not None and (found.username, found.password) == ("helper-user", "helper-secret")
    assert found.source == "docker-credential-benchtest"
    assert log.read_text() == "get|ghcr.io\n"  # argv is just "get"; the server came on stdin


def test_creds_store_token_user_and_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _helper(
        tmp_path / "bin",
        "store",
        'server=$(cat)\ncase "$server" in\n'
        '  tok.example.com) echo \'{"ServerURL":"tok.example.com","Username":"<token>","Secret":"idtok"}\';;\n'
        '  *) echo "credentials not found in native keychain"; exit 1;;\nesac\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    directory = write_docker_config(tmp_path / "docker", {"credsStore": "store"})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    found = resolve_credentials("tok.example.com")
    assert found is not None and found.identity_token == "idtok" and not found.password
    assert resolve_credentials("other.example.com") is None


def test_failing_or_missing_helper_is_an_error_without_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _helper(tmp_path / "bin", "broken", 'cat >/dev/null; echo "leaked-helper-output s3cr3t" >&2; exit 3\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    directory = write_docker_config(tmp_path / "docker", {"credHelpers": {"a.example.com": "broken", "b.example.com": "absent"}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    with pytest.raises(InfrastructureError) as broken:
        resolve_credentials("a.example.com")
    assert "exited 3" in str(broken.value) and "s3cr3t" not in str(broken.value)
    with pytest.raises(InfrastructureError, match=r"docker-credential-absent .* not on PATH"):
        resolve_credentials("b.example.com")


def test_helper_name_cannot_be_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = write_docker_config(tmp_path / "docker", {"credHelpers": {"a.example.com": "../../bin/sh"}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    with pytest.raises(ValidationError) as exc:
        resolve_credentials("a.example.com")
    assert exc.value.exit_code == 2 and "credHelpers" in exc.value.diagnostics()


def test_registry_auth_file_wins_and_most_specific_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = write_docker_config(tmp_path / "docker", {"auths": {"ghcr.io": basic_entry("docker-user", "docker-pw")}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(
        json.dumps(
            {
                "auths": {
                    "ghcr.io/acme": basic_entry("acme-org", "org-pw"),
                    "ghcr.io/acme/runner": basic_entry("acme-runner", "runner-pw"),
                    "quay.io": basic_entry("quay-user", "quay-pw"),
                }
            }
        )
    )
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file))
    runner = resolve_credentials("ghcr.io", "acme/runner")
    api = resolve_credentials("ghcr.io", "acme/api")
    other = resolve_credentials("ghcr.io", "someone/else")
    assert runner is not None and runner.username == "acme-runner"
    assert api is not None and api.username == "acme-org"
    assert resolve_credentials("ghcr.io", "acme/runnerx") is not None
    assert resolve_credentials("ghcr.io", "acme/runnerx").username == "acme-org"  # type: ignore[union-attr]
    # Nothing for that repository in the auth file: the Docker config still answers.
    assert other is not None and other.username == "docker-user"
    assert resolve_credentials("quay.io", "x/y").username == "quay-user"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("not json", "REGISTRY_AUTH_FILE"),
        ("[]", "REGISTRY_AUTH_FILE"),
        (json.dumps({"auths": {"ghcr.io": {"auth": "%%%not-base64"}}}), "auth"),
        (json.dumps({"auths": {"ghcr.io": {"auth": "bm9jb2xvbg=="}}}), "auth"),  # "nocolon"
        (json.dumps({"auths": {"ghcr.io": "a string"}}), "auths"),
        (json.dumps({"auths": []}), "REGISTRY_AUTH_FILE"),
    ],
)
def test_malformed_auth_file_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, field: str) -> None:
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(content)
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file))
    with pytest.raises(ValidationError) as exc:
        resolve_credentials("ghcr.io", "acme/runner")
    assert exc.value.exit_code == 2 and field in exc.value.diagnostics()


def test_missing_registry_auth_file_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "absent.json"))
    with pytest.raises(ValidationError, match="REGISTRY_AUTH_FILE"):
        resolve_credentials("ghcr.io")


def test_credentials_repr_shows_no_secret() -> None:
    creds = Credentials(source="auths['x']", username="u", password="pw-very-secret", identity_token="")
    tok = Credentials(source="s", identity_token="tok-very-secret")
    assert "very-secret" not in repr(creds) + str(creds) + repr(tok)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:5055", True),
        ("localhost:5000", True),
        ("127.1.2.3", True),
        ("[::1]:5000", True),
        ("127.evil.example:5000", False),
        ("localhost.evil.example:5000", False),
        ("ghcr.io", False),
        ("10.0.0.1:5000", False),
    ],
)
def test_plain_http_only_for_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert registry_url(host).startswith("http://" if loopback else "https://")


def test_docker_hub_short_name_uses_its_api_host() -> None:
    assert registry_url("docker.io") == "https://registry-1.docker.io"


def test_parse_challenge_with_quoted_commas() -> None:
    challenge = parse_challenge('Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:acme/a:pull,push"')
    assert challenge is not None and challenge.scheme == "bearer"
    assert challenge.params == {"realm": "https://ghcr.io/token", "service": "ghcr.io", "scope": "repository:acme/a:pull,push"}
    assert parse_challenge('Basic realm="r"') == type(challenge)("basic", {"realm": "r"})
    assert parse_challenge("Negotiate abc") is None


class _Challenger(BaseHTTPRequestHandler):
    realm = "http://203.0.113.9/token"

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="{self.realm}",service="x"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def challenger() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Challenger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_token_realm_over_plain_http_off_loopback_is_refused(challenger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = write_docker_config(tmp_path / "docker", {"auths": {challenger: basic_entry("u", "never-sent-pw")}})
    monkeypatch.setenv("DOCKER_CONFIG", str(directory))
    with pytest.raises(CheckFailed, match="not https") as exc:
        AuthSession(challenger).request("GET", f"http://{challenger}/v2/x/manifests/latest", ["repository:x:pull"])
    assert "never-sent-pw" not in str(exc.value)
