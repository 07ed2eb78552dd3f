"""OCI image config and manifest, as canonical JSON bytes.

benchseal writes OCI media types only (image manifest v1, config v1,
tar+gzip layers). The image digest is sha256 of the exact manifest bytes,
which are canonical (sorted keys, no whitespace), so it is known before push.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import rfc8785

from pipeline.imaging.layers import Layer

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# Accepted when reading a base that someone else built.
ACCEPT = ", ".join(
    [
        MANIFEST_TYPE,
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def canonical_bytes(data: Any) -> bytes:
    """RFC 8785 canonical JSON (sorted keys, no whitespace): image configs, manifests, cache keys."""
    return rfc8785.dumps(data)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def timestamp(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def descriptor(media_type: str, digest: str, size: int) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size}


def manifest_bytes(config: bytes, layers: list[dict[str, Any]]) -> bytes:
    return canonical_bytes(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": descriptor(CONFIG_TYPE, sha256_digest(config), len(config)),
            "layers": layers,
        }
    )


def layer_descriptor(layer: Layer) -> dict[str, Any]:
    return descriptor(LAYER_TYPE, layer.digest, layer.size)


def merge_env(base: list[str], extra: dict[str, str]) -> list[str]:
    """Base ``KEY=VALUE`` list with ``extra`` overriding by key, order kept, new keys sorted."""
    merged: dict[str, str] = {}
    for item in base:
        key, _, value = item.partition("=")
        merged[key] = value
    for key in sorted(extra):
        merged[key] = extra[key]
    return [f"{k}={v}" for k, v in merged.items()]
