"""Sigstore bundles attached to an image as OCI referrers, laid out as cosign's BUNDLE_SPEC has it.

One mechanism for every attestation benchseal attaches to an image (the images' SLSA provenance and
SBOM, pipeline.attest.images; the runner's test result, pipeline.attest.testresult): a blob holding the
bundle, an OCI image manifest with ``artifactType`` and its one layer
``application/vnd.dev.sigstore.bundle.v0.3+json``, the empty config, ``subject`` = the image manifest,
and the annotations ``dev.sigstore.bundle.content`` / ``dev.sigstore.bundle.predicateType``. This is
what ``cosign attest --new-bundle-format`` writes and what ``cosign verify-attestation
--new-bundle-format``, ``gh attestation verify oci://... --bundle-from-oci`` and ``cosign tree`` read.

A registry with the OCI referrers API indexes the manifest itself (it answers the manifest PUT with
``OCI-Subject``); one without (distribution 2.8, Debian's ``docker-registry``) gets the referrers tag
schema's fallback index, the tag ``sha256-<hex>`` of the image digest, read and extended (never two
entries for one manifest) by one writer of the digest's tags at a time (pipeline.attest.taglock).
go-containerregistry (inside cosign and gh) falls back to that tag on a 404 from the referrers API.

The manifest is a function of the bundle (its ``created`` annotation is the log entry's integrated
time), so attaching a bundle again pushes nothing new.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

from pipeline.attest.taglock import digest_tags_locked
from pipeline.core.digests import ImageRef
from pipeline.core.errors import CheckFailed, InfrastructureError
from pipeline.core.registry_auth import AuthSession, scope

__all__ = ["BUNDLE_MEDIA_TYPE", "Attached", "attach_bundle", "referrer_manifest"]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
_MANIFEST_ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX, "application/vnd.docker.distribution.manifest.v2+json",
                              "application/vnd.docker.distribution.manifest.list.v2+json"])


@dataclass(frozen=True)
class Attached:
    """What ``attach_bundle`` left in the registry."""

    runner: str  # the image the bundle is about, by digest
    manifest: str  # the referrer manifest's digest
    fallback_tag: str | None  # the referrers tag schema's index (None: the registry's referrers API indexed it)
    added: bool  # False: the index already listed it (an attach that had run before)

    def to_json_dict(self) -> dict[str, Any]:
        return {"runner": self.runner, "manifest": self.manifest, "fallback_tag": self.fallback_tag,
                "added": self.added}


def _created(bundle: bytes) -> str | None:
    """The bundle's first log entry's integrated time (RFC 3339, UTC), the attestation's creation time."""
    entries = json.loads(bundle).get("verificationMaterial", {}).get("tlogEntries") or []
    try:
        seconds = int(entries[0]["integratedTime"])
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _annotations(bundle: bytes, predicate_type: str) -> dict[str, str]:
    created = _created(bundle)
    return {"dev.sigstore.bundle.content": "dsse-envelope", "dev.sigstore.bundle.predicateType": predicate_type,
            **({"org.opencontainers.image.created": created} if created else {})}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def referrer_manifest(bundle: bytes, subject: dict[str, Any], predicate_type: str) -> bytes:
    """The OCI manifest that attaches ``bundle`` (a DSSE bundle of a ``predicate_type`` statement) to
    the image ``subject`` (an OCI descriptor): compact JSON with sorted keys (its digest names it)."""
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_CONFIG, "digest": _digest(EMPTY_JSON), "size": len(EMPTY_JSON)},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "digest": _digest(bundle), "size": len(bundle)}],
        "subject": subject, "annotations": _annotations(bundle, predicate_type),
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


class _Repository:
    """The few distribution-API calls attaching needs, authenticated as ``docker login`` left it
    (``pipeline.core.registry_auth``; plain HTTP only for loopback registries)."""

    def __init__(self, registry: str, repository: str) -> None:
        self.auth = AuthSession(registry)
        self.host, self.repository = registry, repository
        self.url = f"{self.auth.base}/v2/{repository}"

    def _request(self, method: str, url: str, push: bool = False, **kwargs: Any) -> Any:
        return self.auth.request(method, url, [scope(self.repository, push=push)], **kwargs)

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """The manifest's bytes and media type, None when there is none (404)."""
        r = self._request("GET", f"{self.url}/manifests/{reference}", headers={"Accept": _MANIFEST_ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise InfrastructureError(f"registry {self.host}: GET manifest {self.repository}:{reference} -> {r.status_code}")
        return r.content, r.headers.get("Content-Type", "").split(";")[0].strip()

    def push_blob(self, data: bytes) -> str:
        digest = _digest(data)
        if self._request("HEAD", f"{self.url}/blobs/{digest}", push=True).status_code == 200:
            return digest
        r = self._request("POST", f"{self.url}/blobs/uploads/", push=True)
        if r.status_code != 202 or "Location" not in r.headers:
            raise InfrastructureError(f"registry {self.host}: start upload to {self.repository} -> {r.status_code}")
        location = urljoin(self.auth.base + "/", r.headers["Location"])
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        r = self._request("PUT", location, push=True, data=data,
                          headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
        if r.status_code != 201:
            raise InfrastructureError(f"registry {self.host}: upload {digest} to {self.repository} -> {r.status_code}")
        return digest

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> Any:
        r = self._request("PUT", f"{self.url}/manifests/{reference}", push=True, data=data,
                          headers={"Content-Type": media_type})
        if r.status_code != 201:
            raise InfrastructureError(f"registry {self.host}: PUT manifest {self.repository}:{reference} -> "
                                      f"{r.status_code} {r.text[:300]}")
        if r.headers.get("Docker-Content-Digest", _digest(data)) != _digest(data):
            raise CheckFailed(f"registry {self.host}: stored {r.headers['Docker-Content-Digest']} for "
                              f"{self.repository}:{reference}, not the sha256 of the bytes pushed ({_digest(data)})")
        return r


def _fallback_index(existing: tuple[bytes, str] | None, tag: str) -> dict[str, Any]:
    if existing is None:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    data, media_type = existing
    try:
        index = json.loads(data)
    except ValueError:
        index = None
    if (media_type != OCI_INDEX or not isinstance(index, dict) or index.get("mediaType", OCI_INDEX) != OCI_INDEX
            or not isinstance(index.get("manifests"), list)):
        raise CheckFailed(f"the tag {tag} is not an OCI image index: it cannot hold the image's referrers")
    return index


def attach_bundle(image: ImageRef, bundle: bytes, predicate_type: str) -> Attached:
    """Push ``bundle`` (a Sigstore bundle v0.3 holding a DSSE envelope of a ``predicate_type`` statement
    about ``image``) as a referrer of ``image``. The caller vouches that the bundle is about this image;
    a verifier checks the signer and that the statement's subject is the digest."""
    repository = _Repository(image.registry, image.repository)
    found = repository.manifest(image.digest)
    if found is None:
        raise CheckFailed(f"registry {image.registry}: the image {image.ref} is not there")
    data, media_type = found
    if _digest(data) != image.digest:
        raise CheckFailed(f"registry {image.registry}: the manifest of {image.ref} does not hash to its digest")
    subject = {"mediaType": media_type or json.loads(data).get("mediaType", OCI_MANIFEST), "digest": image.digest,
               "size": len(data)}
    manifest = referrer_manifest(bundle, subject, predicate_type)
    repository.push_blob(EMPTY_JSON)
    repository.push_blob(bundle)
    digest = _digest(manifest)
    put = repository.put_manifest(digest, manifest, OCI_MANIFEST)
    if put.headers.get("OCI-Subject") == image.digest:
        return Attached(runner=image.ref, manifest=digest, fallback_tag=None, added=True)
    # No referrers API: the referrers tag schema (distribution-spec), read, extended, written back,
    # by one writer of this digest's tags at a time (pipeline.attest.taglock).
    tag = image.digest.replace(":", "-")
    with digest_tags_locked(image):
        index = _fallback_index(repository.manifest(tag), tag)
        if any(isinstance(entry, dict) and entry.get("digest") == digest for entry in index["manifests"]):
            return Attached(runner=image.ref, manifest=digest, fallback_tag=tag, added=False)
        index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
                                   "artifactType": BUNDLE_MEDIA_TYPE,
                                   "annotations": _annotations(bundle, predicate_type)})
        repository.put_manifest(tag, json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX)
    return Attached(runner=image.ref, manifest=digest, fallback_tag=tag, added=True)
