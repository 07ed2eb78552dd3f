"""Push to an OCI registry over its HTTP API (distribution spec), from Python.

Blobs: HEAD in the target repository -> skip when present; else try a
cross-repository mount (the base layer already lives in the base image's repository, PREFIX + base);
else POST an upload and PUT the whole blob with ``?digest=``. Manifests: PUT
the exact bytes; the registry's ``Docker-Content-Digest`` must equal the
sha256 of those bytes, or the push fails with CheckFailed. Every uploaded
byte is counted, so "an unchanged push uploads nothing" is checkable.

Credentials (Docker config, credential helpers, REGISTRY_AUTH_FILE) and the
Basic / Bearer-token handshake come from pipeline.core.registry_auth; each request
names its scopes (``pull`` or ``pull,push`` per repository, ``pull`` on a
mount source). Plain HTTP only for loopback registries (127.0.0.0/8, localhost).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin

import requests

from pipeline.core.digests import ImageRef, validate_digest, validate_name
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.registry_auth import AuthSession, scope
from pipeline.imaging.oci import ACCEPT, MANIFEST_TYPE, sha256_digest

_TIMEOUT = 60.0
_TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def validate_oci_tag(tag: str) -> str:
    """OCI tag grammar: ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``."""
    if not (0 < len(tag) <= 128) or tag[0] in ".-" or not set(tag) <= _TAG_CHARS:
        raise ValidationError("tag", "must match [A-Za-z0-9_][A-Za-z0-9._-]{0,127}", tag)
    return tag


@dataclass
class PushStats:
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    blobs_skipped: int = 0
    blobs_mounted: int = 0
    manifests_put: int = 0
    uploaded: list[str] = field(default_factory=list)


class Registry:
    """A client for one registry host (``host:port``), authenticated as ``docker login`` left it.

    Credentials and the Basic/Bearer handshake live in pipeline.core.registry_auth;
    every request names the repository scopes it needs.
    """

    def __init__(self, host: str) -> None:
        validate_name(f"{host}/x", "registry")
        self.host = host
        self.auth = AuthSession(host, timeout=_TIMEOUT)
        self.base = self.auth.base
        self.stats = PushStats()

    def _request(self, method: str, url: str, scopes: Sequence[str], **kwargs: Any) -> requests.Response:
        return self.auth.request(method, url, scopes, **kwargs)

    # --- reading -------------------------------------------------------------

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """HEAD a manifest; the registry's Docker-Content-Digest, or None when absent."""
        r = self._request("HEAD", f"{self.base}/v2/{repository}/manifests/{reference}", [scope(repository)], headers={"Accept": ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise InfrastructureError(f"registry {self.host}: HEAD manifest {repository}:{reference} -> {r.status_code}")
        return r.headers.get("Docker-Content-Digest")

    def has_manifest(self, ref: ImageRef) -> bool:
        return self.manifest_digest(ref.repository, ref.digest) == ref.digest

    def get_manifest(self, repository: str, digest: str) -> bytes:
        r = self._request("GET", f"{self.base}/v2/{repository}/manifests/{digest}", [scope(repository)], headers={"Accept": ACCEPT})
        if r.status_code != 200:
            raise InfrastructureError(f"registry {self.host}: GET manifest {repository}@{digest} -> {r.status_code}")
        if sha256_digest(r.content) != digest:
            raise CheckFailed(f"registry {self.host}: manifest {repository}@{digest} does not hash to its digest")
        return r.content

    def has_blob(self, repository: str, digest: str, scopes: Sequence[str] = ()) -> bool:
        r = self._request("HEAD", f"{self.base}/v2/{repository}/blobs/{digest}", scopes or [scope(repository)])
        return r.status_code == 200

    def get_blob(self, repository: str, digest: str) -> bytes:
        r = self._request("GET", f"{self.base}/v2/{repository}/blobs/{digest}", [scope(repository)])
        if r.status_code != 200 or sha256_digest(r.content) != digest:
            raise CheckFailed(f"registry {self.host}: blob {repository}@{digest} missing or corrupt ({r.status_code})")
        return r.content

    def open_blob(self, repository: str, digest: str) -> Iterator[bytes]:
        r = self._request("GET", f"{self.base}/v2/{repository}/blobs/{digest}", [scope(repository)], stream=True)
        if r.status_code != 200:
            raise InfrastructureError(f"registry {self.host}: GET blob {repository}@{digest} -> {r.status_code}")
        return r.iter_content(1 << 20)

    # --- writing -------------------------------------------------------------

    def push_blob(
        self,
        repository: str,
        digest: str,
        size: int,
        open_data: Callable[[], BinaryIO | bytes | Iterator[bytes]],
        mount_from: str | None = None,
    ) -> None:
        """Make ``digest`` present in ``repository``; upload only when it is not there already."""
        validate_digest(digest, "blob digest")
        # One token for the whole upload: push on the target, pull on the mount source.
        scopes = [scope(repository, push=True)]
        if mount_from and mount_from != repository:
            scopes.append(scope(mount_from))
        if self.has_blob(repository, digest, scopes):
            self.stats.blobs_skipped += 1
            return
        url = f"{self.base}/v2/{repository}/blobs/uploads/"
        if mount_from and mount_from != repository:
            r = self._request("POST", url, scopes, params={"mount": digest, "from": mount_from})
            if r.status_code == 201:
                self.stats.blobs_mounted += 1
                return
        else:
            r = self._request("POST", url, scopes)
        if r.status_code != 202 or "Location" not in r.headers:
            raise InfrastructureError(f"registry {self.host}: start upload to {repository} -> {r.status_code}")
        location = urljoin(self.base + "/", r.headers["Location"])
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        # open_data is called per attempt: a retry after a token expired re-sends from the start.
        r = self._request(
            "PUT",
            location,
            scopes,
            data=open_data,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        if r.status_code != 201:
            raise InfrastructureError(f"registry {self.host}: upload {digest} to {repository} -> {r.status_code} {r.text[:200]}")
        if r.headers.get("Docker-Content-Digest", digest) != digest:
            raise CheckFailed(f"registry {self.host}: stored blob digest {r.headers['Docker-Content-Digest']} != {digest}")
        self.stats.blobs_uploaded += 1
        self.stats.bytes_uploaded += size
        self.stats.uploaded.append(digest)

    def push_file_blob(self, repository: str, digest: str, path: Path, mount_from: str | None = None) -> None:
        self.push_blob(repository, digest, path.stat().st_size, lambda: path.open("rb"), mount_from)

    def put_manifest(self, repository: str, reference: str, manifest: bytes, media_type: str = MANIFEST_TYPE) -> str:
        """PUT ``manifest`` under ``reference`` (a digest or a tag); return the confirmed digest."""
        expected = "sha256:" + hashlib.sha256(manifest).hexdigest()
        r = self._request(
            "PUT",
            f"{self.base}/v2/{repository}/manifests/{reference}",
            [scope(repository, push=True)],
            data=manifest,
            headers={"Content-Type": media_type},
        )
        if r.status_code != 201:
            raise InfrastructureError(f"registry {self.host}: PUT manifest {repository}:{reference} -> {r.status_code} {r.text[:300]}")
        confirmed = r.headers.get("Docker-Content-Digest")
        if confirmed != expected:
            raise CheckFailed(
                f"registry {self.host}: Docker-Content-Digest {confirmed!r} for {repository}:{reference} "
                f"is not the sha256 of the manifest bytes pushed ({expected})"
            )
        self.stats.manifests_put += 1
        return confirmed
