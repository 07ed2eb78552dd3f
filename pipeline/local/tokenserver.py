"""A small Docker token server (distribution's token-auth protocol) on 127.0.0.1.

It is what ghcr.io or Docker Hub's auth service are to their registries,
reduced to what benchseal's tests and demo need:

- ``GET /token?service=S&scope=repository:NAME:ACTIONS...`` with optional Basic
  credentials, answered ``{"token", "expires_in", "issued_at"}``;
- ``POST /token`` (OAuth2 form: ``grant_type=password`` or ``refresh_token``
  with an identity token), answered ``{"access_token", ...}``;
- bad credentials get 401 and nothing else; the access granted is the
  intersection of what was asked and the user's grants (the spec's rule: a
  token server never fails for a missing permission, it grants less).

Tokens are JWTs signed with ES256 (P-256). The header carries ``kid`` as the
libtrust fingerprint of the key, which is how distribution 2.8 finds the key
among the certificates of ``auth.token.rootcertbundle``, and ``x5c`` with the
self-signed certificate in that bundle. Distribution accepts a token until 60 s
after its ``exp`` (clock leeway); ``valid_for`` is the real lifetime, so ``exp``
is set that much earlier.
"""

from __future__ import annotations

import base64
import datetime as dt
import fnmatch
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

REGISTRY_LEEWAY = 60  # distribution's registry/auth/token.Leeway


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def libtrust_key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """libtrust's fingerprint: sha256 of the DER SubjectPublicKeyInfo, 240 bits, base32 in 12 groups of 4."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    text = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(text[i : i + 4] for i in range(0, len(text), 4))


def _hash_secret(secret: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, 100_000)


@dataclass
class Issued:
    subject: str
    requested: tuple[str, ...]
    granted: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass
class TokenServer:
    """Start with ``start()``; ``realm`` and ``cert_path`` then go into the registry's config."""

    state: Path
    service: str = "benchseal-registry"
    issuer: str = "benchseal-token-server"
    valid_for: int = 300
    reported_expires_in: int | None = None  # what the answer claims; None: the truth (valid_for)
    answer_field: str = "token"  # GET answers carry "token" or, like some servers, only "access_token"
    issued: list[Issued] = field(default_factory=list)
    _users: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    _identity_tokens: dict[bytes, str] = field(default_factory=dict)
    _grants: dict[str, list[tuple[str, frozenset[str]]]] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_user(self, name: str, password: str, grants: dict[str, set[str]]) -> None:
        """``grants``: repository glob -> actions, e.g. ``{"acme/*": {"pull", "push"}}``."""
        salt = os.urandom(16)
        self._users[name] = (salt, _hash_secret(password, salt))
        self._grants[name] = [(pattern, frozenset(actions)) for pattern, actions in grants.items()]

    def add_identity_token(self, token: str, user: str) -> None:
        self._identity_tokens[hashlib.sha256(token.encode()).digest()] = user

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def cert_path(self) -> Path:
        return self.state / "token-signing-cert.pem"

    @property
    def realm(self) -> str:
        if self._server is None:
            raise RuntimeError("token server not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "benchseal token signer")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        tmp = self.cert_path.with_suffix(".tmp")
        tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        os.replace(tmp, self.cert_path)
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._kid = libtrust_key_id(self._key.public_key())
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="token-server").start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- tokens -------------------------------------------------------------------------

    def authenticate(self, username: str, password: str) -> bool:
        stored = self._users.get(username)
        if stored is None:
            _hash_secret(password, b"0" * 16)  # same work for unknown users
            return False
        salt, digest = stored
        return hmac.compare_digest(_hash_secret(password, salt), digest)

    def user_for_identity_token(self, token: str) -> str | None:
        return self._identity_tokens.get(hashlib.sha256(token.encode()).digest())

    def grant(self, subject: str, scopes: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        """(repository, actions) granted: what was asked for, cut to what the subject may do."""
        access: list[tuple[str, tuple[str, ...]]] = []
        for text in scopes:
            kind, _, rest = text.partition(":")
            repo, _, actions = rest.rpartition(":")
            if kind != "repository" or not repo:
                continue
            allowed: set[str] = set()
            for pattern, granted in self._grants.get(subject, []):
                if fnmatch.fnmatchcase(repo, pattern):
                    allowed |= granted
            given = tuple(sorted(set(actions.split(",")) & allowed))
            if given:
                access.append((repo, given))
        return access

    def sign(self, subject: str, access: list[tuple[str, tuple[str, ...]]]) -> tuple[str, int]:
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "kid": self._kid, "x5c": [self._x5c]}
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "aud": self.service,
            "iat": now,
            "nbf": now - 1,
            "exp": now + self.valid_for - REGISTRY_LEEWAY,
            "jti": secrets.token_hex(16),
            "access": [{"type": "repository", "name": name, "actions": list(actions)} for name, actions in access],
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")  # JWS wants raw r||s, not DER
        expires_in = self.valid_for if self.reported_expires_in is None else self.reported_expires_in
        return f"{signing_input}.{_b64url(signature)}", expires_in


def _handler(server: TokenServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # no request log: query strings are not needed anywhere
            pass

        def _reply(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", f'Basic realm="{server.service}"')
            self.end_headers()
            self.wfile.write(data)

        def _denied(self) -> None:
            self._reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})

        def _issue(self, subject: str, service: str, scopes: list[str], field_name: str) -> None:
            if service != server.service:
                self._reply(400, {"errors": [{"code": "INVALID_REQUEST", "message": "unknown service"}]})
                return
            access = server.grant(subject, scopes)
            token, expires_in = server.sign(subject, access)
            with server._lock:
                server.issued.append(Issued(subject, tuple(scopes), tuple(access)))
            issued_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._reply(200, {field_name: token, "expires_in": expires_in, "issued_at": issued_at})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/token":
                self._reply(404, {})
                return
            query = parse_qs(url.query)
            subject = ""
            header = self.headers.get("Authorization", "")
            if header:
                scheme, _, raw = header.partition(" ")
                try:
                    username, sep, password = base64.b64decode(raw, validate=True).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    sep = ""
                if scheme.lower() != "basic" or not sep or not server.authenticate(username, password):
                    self._denied()
                    return
                subject = username
            self._issue(subject, (query.get("service") or [""])[0], query.get("scope", []), server.answer_field)

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/token":
                self._reply(404, {})
                return
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            grant = (form.get("grant_type") or [""])[0]
            subject: str | None = None
            if grant == "refresh_token":
                subject = server.user_for_identity_token((form.get("refresh_token") or [""])[0])
            elif grant == "password":
                username, password = (form.get("username") or [""])[0], (form.get("password") or [""])[0]
                subject = username if server.authenticate(username, password) else None
            if subject is None:
                self._denied()
                return
            scopes = [s for value in form.get("scope", []) for s in value.split(" ") if s]
            self._issue(subject, (form.get("service") or [""])[0], scopes, "access_token")

    return Handler
