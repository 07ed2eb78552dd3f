"""Registry credentials and authentication, as ``docker login`` leaves them.

Credentials are looked up, for a registry host (and repository), in:

1. ``$REGISTRY_AUTH_FILE`` (containers-auth.json: ``auths`` keyed by ``host``
   or ``host/namespace[/repo]``, the most specific key wins; ``credHelpers``);
2. the Docker config, ``$DOCKER_CONFIG/config.json`` else ``~/.docker/config.json``:
   ``credHelpers[host]``, then ``credsStore``, then ``auths[host]`` (``auth`` =
   base64 ``user:password``, or ``identitytoken``).

Helpers run as ``docker-credential-<name> get`` with the server on stdin; no
secret is ever put in a process's arguments, a log line or an exception.

``AuthSession`` speaks the registry auth protocols over ``requests``: it pings
``/v2/`` once per host to learn the challenge, then sends Basic credentials or
a Bearer token for exactly the scopes each request needs (per repository,
``pull`` or ``pull,push``, plus ``pull`` on the source of a cross-repository
mount). Tokens are cached per scope set until ``expires_in`` runs out and are
fetched again once when the registry answers 401 anyway (expired or revoked).
Plain HTTP is allowed for loopback hosts only, for the registry and the token
realm alike.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import requests

from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError

_TIMEOUT = 60.0
_HELPER_TIMEOUT = 30.0
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DEFAULT_EXPIRES_IN = 60  # the token spec's default when a server omits expires_in
# Docker Hub's credentials live under this legacy key.
_DOCKER_HUB_KEY = "https://index.docker.io/v1/"
_DOCKER_HUB_HOSTS = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

Body = bytes | BinaryIO | Iterator[bytes] | None


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8`` and ``[::1]`` (with or without a port): the only hosts allowed plain HTTP.

    ``127.example.com`` or ``localhost.example.com`` are not loopback.
    """
    name = host
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def registry_url(host: str) -> str:
    if host in ("docker.io", "index.docker.io"):
        return "https://registry-1.docker.io"  # Docker Hub's API host behind its short name
    return f"{'http' if is_loopback(host) else 'https'}://{host}"


@dataclass(frozen=True)
class Credentials:
    """Username/password or an identity (refresh) token, and where they came from (never the secret)."""

    source: str
    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)

    def docker_auth_config(self) -> dict[str, str]:
        """The ``auth_config`` the Docker SDK sends in the X-Registry-Auth header (not argv)."""
        if self.identity_token:
            return {"identitytoken": self.identity_token}
        return {"username": self.username, "password": self.password}


def _normalize_key(key: str) -> str:
    """``https://ghcr.io/v2/`` -> ``ghcr.io``; ``host/ns/repo`` keeps its path (containers-auth.json)."""
    text = key.strip()
    if text == _DOCKER_HUB_KEY:
        return "docker.io"
    if "://" in text:
        parts = urlsplit(text)
        text = parts.netloc + parts.path
    text = text.rstrip("/")
    for suffix in ("/v1", "/v2"):
        text = text.removesuffix(suffix)
    host, _, rest = text.partition("/")
    if host in _DOCKER_HUB_HOSTS:
        host = "docker.io"
    return f"{host}/{rest}" if rest else host


def _host_key(host: str) -> str:
    return "docker.io" if host in _DOCKER_HUB_HOSTS else host


def _load_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValidationError(what, "file does not exist", str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(what, f"must be a readable JSON file ({type(exc).__name__})", str(path)) from None
    if not isinstance(data, dict):
        raise ValidationError(what, "must be a JSON object", str(path))
    return data


def _entry_credentials(entry: object, where: str) -> Credentials | None:
    if not isinstance(entry, dict):
        raise ValidationError(where, "must be an object")
    token = entry.get("identitytoken") or ""
    if not isinstance(token, str):
        raise ValidationError(f"{where}.identitytoken", "must be a string")
    raw = entry.get("auth") or ""
    if not isinstance(raw, str):
        raise ValidationError(f"{where}.auth", "must be a base64 string")
    username, password = entry.get("username") or "", entry.get("password") or ""
    if raw:
        try:
            decoded = base64.b64decode(raw, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise ValidationError(f"{where}.auth", "must be base64 of 'user:password'") from None
        username, sep, password = decoded.partition(":")
        if not sep:
            raise ValidationError(f"{where}.auth", "must be base64 of 'user:password'")
    if not isinstance(username, str) or not isinstance(password, str):
        raise ValidationError(where, "username and password must be strings")
    if token:
        return Credentials(source=where, username=username, identity_token=token)
    if username or password:
        return Credentials(source=where, username=username, password=password)
    return None  # an empty entry: docker login with a credsStore leaves these


def _helper_credentials(helper: str, server: str, where: str) -> Credentials | None:
    if not isinstance(helper, str) or not _HELPER_NAME.fullmatch(helper):
        raise ValidationError(where, "must name a credential helper: [A-Za-z0-9][A-Za-z0-9._-]*", helper)
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        raise InfrastructureError(f"credential helper docker-credential-{helper} (from {where}) is not on PATH")
    try:
        done = subprocess.run(
            [program, "get"], input=server, capture_output=True, text=True, timeout=_HELPER_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfrastructureError(f"credential helper docker-credential-{helper} failed to run: {type(exc).__name__}") from None
    if done.returncode != 0:
        if "credentials not found" in (done.stdout + done.stderr).lower():
            return None
        # The helper's output is not shown: it is not ours to trust not to hold a secret.
        raise InfrastructureError(f"credential helper docker-credential-{helper} exited {done.returncode} for {server}")
    try:
        answer = json.loads(done.stdout)
        username, secret = answer["Username"], answer["Secret"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise CheckFailed(f"credential helper docker-credential-{helper} gave no {{Username, Secret}} JSON for {server}") from None
    if not isinstance(username, str) or not isinstance(secret, str):
        raise CheckFailed(f"credential helper docker-credential-{helper}: Username and Secret must be strings")
    source = f"docker-credential-{helper}"
    if username == "<token>":
        return Credentials(source=source, identity_token=secret)
    return Credentials(source=source, username=username, password=secret)


def _server_for_helper(host: str, keys: Sequence[str]) -> str:
    """The server string the helper stored at login: the config's own key for the host, else the host."""
    for key in keys:
        if _normalize_key(key) == host:
            return key
    return _DOCKER_HUB_KEY if host == "docker.io" else host


def _from_auth_file(path: Path, host: str, repository: str) -> Credentials | None:
    data = _load_json(path, "REGISTRY_AUTH_FILE")
    helpers = data.get("credHelpers", {})
    auths = data.get("auths", {})
    if not isinstance(helpers, dict) or not isinstance(auths, dict):
        raise ValidationError("REGISTRY_AUTH_FILE", "auths and credHelpers must be objects", str(path))
    target = f"{host}/{repository}" if repository else host
    best: tuple[int, str] | None = None
    for key in auths:
        norm = _normalize_key(key)
        if target == norm or target.startswith(norm + "/"):
            if best is None or len(norm) > best[0]:
                best = (len(norm), key)
    if best is not None:
        found = _entry_credentials(auths[best[1]], f"REGISTRY_AUTH_FILE auths[{best[1]!r}]")
        if found is not None:
            return found
    for key, helper in helpers.items():
        if _normalize_key(key) == host:
            return _helper_credentials(helper, host, f"REGISTRY_AUTH_FILE credHelpers[{key!r}]")
    return None


def docker_config_path() -> Path:
    configured = os.environ.get("DOCKER_CONFIG")
    return (Path(configured) if configured else Path.home() / ".docker") / "config.json"


def _from_docker_config(path: Path, host: str) -> Credentials | None:
    data = _load_json(path, "docker config")
    helpers = data.get("credHelpers", {})
    auths = data.get("auths", {})
    store = data.get("credsStore", "")
    if not isinstance(helpers, dict) or not isinstance(auths, dict):
        raise ValidationError(f"docker config {path}", "auths and credHelpers must be objects")
    server = _server_for_helper(host, list(auths) + list(helpers))
    for key, helper in helpers.items():
        if _normalize_key(key) == host:
            return _helper_credentials(helper, server, f"credHelpers[{key!r}] in {path}")
    if store:
        return _helper_credentials(store, server, f"credsStore in {path}")
    for key, entry in auths.items():
        if _normalize_key(key) == host:
            return _entry_credentials(entry, f"auths[{key!r}] in {path}")
    return None


def resolve_credentials(host: str, repository: str = "") -> Credentials | None:
    """Credentials for ``host`` (and ``repository``), or None for anonymous access."""
    key = _host_key(host)
    auth_file = os.environ.get("REGISTRY_AUTH_FILE")
    if auth_file:
        found = _from_auth_file(Path(auth_file), key, repository)
        if found is not None:
            return found
    config = docker_config_path()
    if config.is_file():
        return _from_docker_config(config, key)
    return None


def docker_auth_config(host: str, repository: str = "") -> dict[str, str]:
    """auth_config for the Docker SDK's pull: the same credentials, ``{}`` for anonymous.

    ``{}`` rather than None: None would make the SDK look credentials up on its own.
    """
    found = resolve_credentials(host, repository)
    return {} if found is None else found.docker_auth_config()


# --- the protocol ---------------------------------------------------------------------------


def scope(repository: str, push: bool = False) -> str:
    return f"repository:{repository}:{'pull,push' if push else 'pull'}"


_PARAM = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" | "bearer"
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """The first Basic or Bearer challenge of a WWW-Authenticate header."""
    match = re.match(r"\s*(\w+)\s*(.*)", header or "", re.S)
    if match is None:
        return None
    scheme = match.group(1).lower()
    if scheme not in ("basic", "bearer"):
        return None
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(match.group(2))}
    return Challenge(scheme, params)


@dataclass
class _Token:
    value: str
    expires_at: float


class AuthSession:
    """An HTTP session for one registry host that authenticates each request for its scopes."""

    def __init__(self, host: str, timeout: float = _TIMEOUT) -> None:
        self.host = host
        self.base = registry_url(host)
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # never send registry traffic (or credentials) through a proxy
        self._challenge: Challenge | None = None
        self._pinged = False
        self._creds: dict[str, Credentials | None] = {}
        self._tokens: dict[tuple[str, ...], _Token] = {}
        self._lock = threading.Lock()
        self.tokens_fetched = 0
        self.retried_after_401 = 0  # tokens refused by the registry (expired, revoked) and fetched again

    # -- credentials and tokens --

    def credentials(self, repository: str = "") -> Credentials | None:
        if repository not in self._creds:
            self._creds[repository] = resolve_credentials(self.host, repository)
        return self._creds[repository]

    def _send(self, method: str, url: str, headers: dict[str, str], data: Body, **kwargs: Any) -> requests.Response:
        try:
            return self.session.request(method, url, headers=headers, data=data, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            # requests' messages hold the URL only; credentials travel in headers.
            raise InfrastructureError(f"registry {self.host}: {method} {urlsplit(url).path}: {type(exc).__name__}: {exc}") from None

    def _ping(self) -> None:
        if self._pinged:
            return
        r = self._send("GET", f"{self.base}/v2/", {}, None)
        if r.status_code == 401:
            self._challenge = parse_challenge(r.headers.get("WWW-Authenticate", ""))
            if self._challenge is None:
                raise CheckFailed(f"registry {self.host} asks for authentication with a scheme benchseal does not speak")
            if self._challenge.scheme == "bearer":
                self._check_realm(self._challenge.params.get("realm", ""))
        # Anything else: no challenge known yet; a later 401 on a repository can still teach one.
        self._pinged = True

    def _check_realm(self, realm: str) -> None:
        parts = urlsplit(realm)
        if parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.netloc)):
            return
        raise CheckFailed(
            f"registry {self.host}: token realm {realm!r} is not https (plain HTTP only on loopback); credentials not sent"
        )

    def _fetch_token(self, scopes: tuple[str, ...], repository: str) -> _Token:
        challenge = self._challenge
        if challenge is None:
            raise CheckFailed(f"registry {self.host}: no Bearer challenge to answer")
        realm = challenge.params.get("realm", "")
        self._check_realm(realm)
        service = challenge.params.get("service", "")
        creds = self.credentials(repository)
        params: list[tuple[str, str]] = [("service", service)] if service else []
        params += [("scope", s) for s in scopes]
        try:
            if creds is not None and creds.identity_token:
                # OAuth2 refresh-token grant, as the Docker CLI does with an identity token.
                form = [("grant_type", "refresh_token"), ("refresh_token", creds.identity_token), ("client_id", "benchseal"), *params]
                r = self.session.post(realm, data=form, timeout=self.timeout)
            else:
                auth = (creds.username, creds.password) if creds is not None else None
                if creds is not None:
                    params.append(("account", creds.username))
                r = self.session.get(realm, params=params, auth=auth, timeout=self.timeout)
        except requests.RequestException as exc:
            raise InfrastructureError(f"registry {self.host}: token server {urlsplit(realm).netloc} unreachable: {type(exc).__name__}") from None
        who = "anonymous access" if creds is None else f"the credentials from {creds.source}"
        if r.status_code in (401, 403):
            raise CheckFailed(
                f"registry {self.host}: the token server rejected {who} (HTTP {r.status_code}); "
                f"run docker login {self.host} or fix {creds.source if creds else 'the Docker config'}"
            )
        if r.status_code != 200:
            raise InfrastructureError(f"registry {self.host}: token request -> HTTP {r.status_code}")
        try:
            body = r.json()
        except ValueError:
            raise CheckFailed(f"registry {self.host}: the token server did not answer JSON") from None
        value = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(value, str) or not value:
            raise CheckFailed(f"registry {self.host}: the token server's answer has neither token nor access_token")
        expires_in = body.get("expires_in", _DEFAULT_EXPIRES_IN)
        if not isinstance(expires_in, int | float) or isinstance(expires_in, bool) or expires_in <= 0:
            expires_in = _DEFAULT_EXPIRES_IN
        # Refresh a little early: the token must still be valid when the registry reads it.
        margin = min(10.0, expires_in / 5)
        self.tokens_fetched += 1
        return _Token(value, time.monotonic() + expires_in - margin)

    def _auth_header(self, scopes: tuple[str, ...], repository: str, fresh: bool) -> dict[str, str]:
        challenge = self._challenge
        if challenge is None:
            return {}
        if challenge.scheme == "basic":
            creds = self.credentials(repository)
            if creds is None:
                return {}
            if creds.identity_token:
                raise CheckFailed(f"registry {self.host} wants Basic auth but {creds.source} holds only an identity token")
            raw = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            return {"Authorization": f"Basic {raw}"}
        key = tuple(sorted(scopes))
        with self._lock:
            token = self._tokens.get(key)
            if fresh or token is None or time.monotonic() >= token.expires_at:
                token = self._fetch_token(key, repository)
                self._tokens[key] = token
        return {"Authorization": f"Bearer {token.value}"}

    # -- requests --

    def request(
        self,
        method: str,
        url: str,
        scopes: Sequence[str],
        *,
        headers: dict[str, str] | None = None,
        data: Body | Callable[[], Body] = None,
        **kwargs: Any,
    ) -> requests.Response:
        """Send ``method url`` authenticated for ``scopes``; a 401 gets one retry with a fresh token.

        ``data`` may be a callable returning a fresh body, so a streamed upload can be sent again.
        A 401 or 403 that persists raises CheckFailed naming the repository and the access wanted.
        """
        self._ping()
        repository = _repository_of(scopes[0]) if scopes else ""
        parts = urlsplit(url)
        if (parts.scheme, parts.netloc) != tuple(urlsplit(self.base)[:2]):
            # An upload Location on another host (a storage redirect) gets no credentials.
            scopes = ()
            own_host = False
        else:
            own_host = True
        response: requests.Response | None = None
        for attempt in range(2):
            body = data() if callable(data) else data
            try:
                auth = self._auth_header(tuple(scopes), repository, fresh=attempt > 0) if own_host else {}
                sent = {**(headers or {}), **auth}
                response = self._send(method, url, sent, body, **kwargs)
            finally:
                close = getattr(body, "close", None)
                if close is not None and body is not data:
                    close()
            if response.status_code != 401 or not own_host:
                break
            if self._challenge is None:
                # /v2/ was open but this repository is not: learn the challenge here.
                self._challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
                if self._challenge is None:
                    break
                if self._challenge.scheme == "bearer":
                    self._check_realm(self._challenge.params.get("realm", ""))
            elif self._challenge.scheme != "bearer" or attempt > 0:
                break
            if not callable(data) and data is not None and not isinstance(data, bytes):
                break  # a consumed stream cannot be sent again
            response.close()
            if attempt == 0:
                self.retried_after_401 += 1
        if response is None:
            raise InfrastructureError(f"registry {self.host}: {method} {urlsplit(url).path}: no response")
        if response.status_code in (401, 403):
            self._raise_denied(response, method, url, scopes, repository)
        return response

    def _raise_denied(self, response: requests.Response, method: str, url: str, scopes: Sequence[str], repository: str) -> None:
        creds = self.credentials(repository)
        challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        wanted = ", ".join(scopes) or "access"
        what = f"{method} {urlsplit(url).path}"
        if creds is None and response.status_code == 401:
            raise CheckFailed(
                f"registry {self.host}: {what} needs credentials and none were found for it "
                f"(docker login {self.host}, or REGISTRY_AUTH_FILE)"
            )
        source = creds.source if creds is not None else "anonymous access"
        if response.status_code == 403 or (challenge is not None and challenge.params.get("error") == "insufficient_scope"):
            raise CheckFailed(f"registry {self.host}: {what}: the credentials from {source} do not grant {wanted}")
        raise CheckFailed(f"registry {self.host}: {what}: the registry rejected the credentials from {source} (HTTP 401)")


def _repository_of(scope_text: str) -> str:
    parts = scope_text.split(":")
    return parts[1] if len(parts) == 3 else ""
