"""Keyless Sigstore signing (sigstore-python) of release artifacts.

Production: ``ambient_signer()`` takes the ambient GitHub Actions OIDC token
(``permissions: id-token: write``) and signs against the public-good instance.
Local and tests: ``pipeline.local.signing.local_signer()`` signs against the private instance on
127.0.0.1 (``pipeline.local.sigstore``).

Bundles use Rekor v1 unless asked otherwise: cosign 2.5 (Debian 12's and 13's package, which
consumers may have) cannot verify Rekor v2 entries; the cosign 3.1 setup installs can.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from sigstore import dsse
from sigstore.errors import Error as SigstoreError
from sigstore.hashes import Hashed
from sigstore.models import ClientTrustConfig
from sigstore.oidc import IdentityToken, detect_credential
from sigstore.sign import SigningContext
from sigstore_models.common.v1 import HashAlgorithm

from pipeline.core.contracts import GITHUB_ISSUER
from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_text, sha256_file

BUNDLE_SUFFIX = ".sigstore.json"


def bundle_path(path: Path) -> Path:
    return path.with_name(path.name + BUNDLE_SUFFIX)


@dataclass
class Signer:
    """Signs files into ``<file>.sigstore.json`` (bundle v0.3) and statements into DSSE bundles.

    ``token`` returns a fresh OIDC identity token; the signing certificate is cached
    by sigstore-python and renewed with a new token when it expires.
    """

    trust_config: ClientTrustConfig
    token: Callable[[], str]
    identity: str
    issuer: str
    trusted_root: Path | None = None  # where a verifier finds the matching root (None: public-good)
    rekor_version: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _context: Any = field(default=None, repr=False)
    _signer_cm: Any = field(default=None, repr=False)
    _signer: Any = field(default=None, repr=False)
    _renew_at: float = field(default=0.0, repr=False)

    def _current(self) -> Any:
        if self._context is None:
            self.trust_config.force_tlog_version = self.rekor_version
            self._context = SigningContext.from_trust_config(self.trust_config)
        # Fulcio certificates live 10 minutes; renew well before expiry.
        if self._signer is None or time.monotonic() >= self._renew_at:
            self.close()
            try:
                self._signer_cm = self._context.signer(IdentityToken(self.token()), cache=True)
                self._signer = self._signer_cm.__enter__()
            except Exception as exc:
                raise InfrastructureError(f"could not obtain a signing certificate: {type(exc).__name__}: {exc}") from None
            self._renew_at = time.monotonic() + 300
        return self._signer

    def close(self) -> None:
        if self._signer_cm is not None:
            self._signer_cm.__exit__(None, None, None)
        self._signer_cm = None
        self._signer = None

    def sign_file(self, path: Path) -> Path:
        """Sign ``path`` (streamed hash) into ``<path>.sigstore.json``; return the bundle path."""

        hashed = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(sha256_file(path)))
        return self._sign_into_bundle(path, lambda signer: signer.sign_artifact(hashed))

    def sign_statement(self, statement_path: Path) -> Path:
        """Sign the in-toto statement in ``statement_path`` (exact bytes) as a DSSE bundle."""

        try:
            statement = dsse.Statement(statement_path.read_bytes())
        except SigstoreError as exc:
            raise ValidationError(str(statement_path), f"not an in-toto v1 statement: {exc}") from None
        return self._sign_into_bundle(statement_path, lambda signer: signer.sign_dsse(statement))

    def _sign_into_bundle(self, subject: Path, sign: Callable[[Any], Any]) -> Path:
        # One signing session at a time; anything sigstore raises becomes an InfrastructureError.
        with self._lock:
            try:
                bundle = sign(self._current())
            except InfrastructureError:
                raise
            except Exception as exc:
                raise InfrastructureError(f"signing {subject.name} failed: {type(exc).__name__}: {exc}") from None
        out = bundle_path(subject)
        atomic_write_text(out, bundle.to_json())
        return out


def certificate_identity(token: str) -> tuple[str, str]:
    """(identity, issuer) that Fulcio will certify for ``token``: for GitHub Actions tokens the
    job's workflow ref as a URL (what cosign's --certificate-identity matches), else ``sub``."""

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise InfrastructureError(f"the OIDC token is not a JWT: {exc}") from None
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise InfrastructureError("the OIDC token has no issuer")
    if issuer == GITHUB_ISSUER:
        ref = claims.get("job_workflow_ref")
        if not isinstance(ref, str) or not ref:
            raise InfrastructureError("the GitHub Actions OIDC token has no job_workflow_ref claim")
        return f"https://github.com/{ref}", issuer
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise InfrastructureError("the OIDC token has no subject")
    return subject, issuer


def ambient_signer(*, identity: str | None = None, trust_config: ClientTrustConfig | None = None,
                   trusted_root: Path | None = None) -> Signer:
    """A keyless signer using the ambient GitHub Actions OIDC token, public-good instance.

    ``trust_config``/``trusted_root`` replace the public-good instance (tests run the
    whole ambient-credential path against the private instance this way).
    """

    def token() -> str:
        try:
            raw = detect_credential()
        except Exception as exc:
            raise InfrastructureError(f"ambient OIDC credential: {exc}") from None
        if raw is None:
            raise InfrastructureError("no ambient OIDC credential (GitHub Actions needs `permissions: id-token: write`)")
        return raw

    first = token()
    try:
        IdentityToken(first)
    except Exception as exc:
        raise InfrastructureError(f"the ambient OIDC token is not usable for Sigstore: {exc}") from None
    certified, issuer = certificate_identity(first)
    tokens = iter([first])
    return Signer(
        trust_config=trust_config or ClientTrustConfig.production(),
        token=lambda: next(tokens, None) or token(),
        identity=identity or certified,
        issuer=issuer,
        trusted_root=trusted_root,
        rekor_version=1,
    )


def private_trust_config(url: str, trusted_root: Path) -> ClientTrustConfig:
    """The client trust config of a private instance named explicitly (``--sigstore-url`` and
    ``--trusted-root``, loopback only): its Fulcio, Rekor v1 and TSA at ``url``, trusting
    ``trusted_root``. What the ambient signer uses in place of public-good in tests."""
    signing = private_signing_config(url)
    try:
        root = json.loads(trusted_root.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError("--trusted-root", f"must be a readable trusted_root.json ({exc})", str(trusted_root)) from None
    config = {"mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json", "trustedRoot": root,
              "signingConfig": signing}
    return ClientTrustConfig.from_json(json.dumps(config))


def private_signing_config(url: str) -> dict[str, Any]:
    """The signing config (v0.2) of a private instance at ``url`` (loopback only): its Fulcio, Rekor v1
    and TSA. sigstore-python's (inside :func:`private_trust_config`) and cosign's ``--signing-config``."""
    if not re.fullmatch(r"http://127\.0\.0\.1:\d{1,5}", url):
        raise ValidationError("--sigstore-url", "a private instance must be http://127.0.0.1:PORT", url)

    def service(path: str) -> dict[str, object]:
        return {"url": url + path, "majorApiVersion": 1, "validFor": {"start": "2020-01-01T00:00:00Z"},
                "operator": "benchseal.local"}

    return {
        "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
        "caUrls": [service("")], "oidcUrls": [service("/oidc")], "rekorTlogUrls": [service("/rekor")],
        "rekorTlogConfig": {"selector": "ANY"}, "tsaUrls": [service("/tsa/api/v1/timestamp")],
        "tsaConfig": {"selector": "ANY"},
    }


def default_signer() -> Signer:
    """The production signer: the ambient GitHub Actions OIDC credential, public-good Sigstore.

    There is no fallback. Outside Actions (no ``ACTIONS_ID_TOKEN_REQUEST_URL``) this fails; the
    private test instance is reached only by asking for it (``--signer local``, ``release --local``).
    """

    if os.environ.get("GITHUB_ACTIONS") != "true" or not os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL"):
        raise InfrastructureError(
            "no ambient OIDC credential: production signing runs in GitHub Actions with `permissions: id-token: write`"
            " (the private test instance is used only with --signer local or release --local)"
        )
    return ambient_signer()
