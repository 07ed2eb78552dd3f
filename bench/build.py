"""Build benchmark: cold vs warm image builds, bytes re-pushed, cost of compressing the base.

    .venv/bin/python bench/build.py [--keep]

Runs in a scratch BENCHSEAL_HOME (empty caches: mmdebstrap, wheel downloads,
compression all happen) against a scratch registry on an ephemeral loopback
port, so it neither uses nor disturbs the shared caches and the 127.0.0.1:5055
registry. Prints figures only; asserts nothing about time.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

print = functools.partial(print, flush=True)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-build-"))
    os.environ["BENCHSEAL_HOME"] = str(scratch / "home")
    os.environ["BENCHSEAL_BASE_LOCK"] = str(scratch / "base.lock.json")
    from pipeline.imaging.base import ensure_base, load_specs, rootfs_tarball
    from pipeline.imaging.images import APP_DIRS, build_image, source_date_epoch, source_info
    from pipeline.imaging.layers import BlobStore, compress_tarball
    from pipeline.local import registry as reg

    registry = reg.Registry(address=f"127.0.0.1:{_free_port()}", state=scratch / "registry")
    registry.state.mkdir(parents=True)
    reg.start(registry)
    # Other sessions edit the shared tree while this runs: build every time from one snapshot.
    app = scratch / "app"
    for name in APP_DIRS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, app / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        source = source_info()
        epoch = source_date_epoch(source.commit)
        t = time.monotonic()
        bases = ensure_base(registry.address)
        base_seconds = time.monotonic() - t
        print(f"cold base images (2x mmdebstrap + compress + push): {base_seconds:7.1f} s")

        cold: dict[str, float] = {}
        digests: dict[str, str] = {}
        manifests: dict[str, bytes] = {}
        for role in ("runner", "api"):
            t = time.monotonic()
            result = build_image(role, registry.address, bases, source, epoch=epoch, app_root=app)
            cold[role] = time.monotonic() - t
            digests[role] = result.ref.digest
            manifests[role] = result.manifest
            print(
                f"cold build+push {role:6s}: {cold[role]:7.1f} s  (assemble {result.seconds_build:.1f} s, push {result.seconds_push:.1f} s, "
                f"{result.stats.bytes_uploaded / 1e6:.1f} MB uploaded, {result.stats.blobs_mounted} blobs mounted from the base)"
            )

        for role in ("runner", "api"):
            t = time.monotonic()
            again = build_image(role, registry.address, bases, source, epoch=epoch, app_root=app)
            warm = time.monotonic() - t
            print(
                f"warm rebuild    {role:6s}: {warm:7.2f} s  bytes pushed on unchanged rebuild: {again.stats.bytes_uploaded} "
                f"(blobs uploaded {again.stats.blobs_uploaded}, skipped {again.stats.blobs_skipped})"
            )

        t = time.monotonic()
        nocache = build_image("runner", registry.address, bases, source, epoch=epoch, app_root=app, use_cache=False)
        print(f"no-cache rebuild runner  : {time.monotonic() - t:7.1f} s  same digest as cold: {nocache.ref.digest == digests['runner']}")
        if nocache.manifest != manifests["runner"]:
            old, new = json.loads(manifests["runner"]), json.loads(nocache.manifest)
            for i, (a, b) in enumerate(zip(old["layers"], new["layers"], strict=False)):
                print(f"  layer {i}: {'same' if a == b else f'DIFFERS {a} {b}'}")

        spec = load_specs()["runner-base"]
        tarball = rootfs_tarball(spec)
        t = time.monotonic()
        layer = compress_tarball(tarball, BlobStore(scratch / "compress-only"))
        gzip_seconds = time.monotonic() - t
        print(f"compress runner-base layer alone: {gzip_seconds:5.1f} s  ({tarball.stat().st_size / 1e6:.0f} MB tar -> {layer.size / 1e6:.0f} MB gzip)")
        for role, seconds in cold.items():
            print(f"ratio cold build+push {role} / compress base layer: {seconds / gzip_seconds:5.2f}")
        print(f"ratio cold (base + runner + api) / compress base layer: {(base_seconds + sum(cold.values())) / gzip_seconds:5.2f}")
    finally:
        reg.stop(registry)
        if "--keep" not in sys.argv:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
