"""Push client against the real registry, plus one registry that lies about digests."""

from __future__ import annotations

import hashlib
import os

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.imaging.oci import canonical_bytes, manifest_bytes
from pipeline.imaging.push import Registry


def test_a_digest_the_registry_does_not_confirm_fails_the_push(lying_registry: str) -> None:
    with pytest.raises(CheckFailed, match="not the sha256 of the manifest bytes"):
        Registry(lying_registry).put_manifest("benchseal/x", "latest", manifest_bytes(b"{}", []))


@pytest.mark.docker
def test_blob_upload_then_skip_counts_bytes(image_registry: str) -> None:
    client = Registry(image_registry)
    repo = "benchseal-buildtest/blobs"
    data = os.urandom(4096)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    client.push_blob(repo, digest, len(data), lambda: data)
    assert (client.stats.blobs_uploaded, client.stats.bytes_uploaded) == (1, 4096)
    client.push_blob(repo, digest, len(data), lambda: data)
    assert (client.stats.blobs_uploaded, client.stats.bytes_uploaded, client.stats.blobs_skipped) == (1, 4096, 1)
    # mounting into another repository moves no bytes
    client.push_blob("benchseal-buildtest/blobs2", digest, len(data), lambda: data, mount_from=repo)
    assert client.stats.bytes_uploaded == 4096 and client.stats.blobs_mounted == 1
    config = canonical_bytes({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    client.push_blob(repo, "sha256:" + hashlib.sha256(config).hexdigest(), len(config), lambda: config)
    manifest = manifest_bytes(config, [])
    assert client.put_manifest(repo, "t1", manifest) == "sha256:" + hashlib.sha256(manifest).hexdigest()


@pytest.mark.docker
def test_a_blob_with_the_wrong_content_is_refused_by_the_registry(image_registry: str) -> None:
    from pipeline.core.errors import InfrastructureError

    with pytest.raises(InfrastructureError):
        Registry(image_registry).push_blob("benchseal-buildtest/blobs", "sha256:" + "1" * 64, 3, lambda: b"abc")
