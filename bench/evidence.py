"""Evidence benchmark: SHA256SUMS throughput vs sha256sum, signing time, SBOM time per image.

    .venv/bin/python bench/evidence.py [--size-mib 1024] [--files 20] [--parts checksums,signing,sbom]

Uses a private Sigstore instance of its own (scratch state dir, stopped at the end)
and the runner/api images in the local registry (built with the build stage's cache).
Prints figures only; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _big_file(path: Path, mib: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as handle:
        for i in range(mib):
            handle.write(block[i % 251:] + block[: i % 251])


def bench_checksums(scratch: Path, mib: int) -> None:
    from pipeline.evidence.artifacts import write_checksums

    artifacts = scratch / "sums"
    artifacts.mkdir()
    _big_file(artifacts / "big.bin", mib)
    subprocess.run(["sha256sum", str(artifacts / "big.bin")], capture_output=True, check=True)  # warm the page cache
    started = time.perf_counter()
    write_checksums(artifacts)
    ours = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run(["sha256sum", str(artifacts / "big.bin")], capture_output=True, check=True)
    theirs = time.perf_counter() - started
    print(f"SHA256SUMS over {mib} MiB: benchseal {ours:.2f}s ({mib / ours:.0f} MiB/s), "
          f"sha256sum {theirs:.2f}s ({mib / theirs:.0f} MiB/s), ratio benchseal/sha256sum = {ours / theirs:.2f}")
    shutil.rmtree(artifacts)


def bench_signing(scratch: Path, count: int) -> None:
    from pipeline.local import sigstore as sigstore_local
    from pipeline.local.signing import local_signer

    state = scratch / "sigstore"
    started = time.perf_counter()
    sigstore_local.ensure_running(state)
    print(f"local Sigstore instance start: {time.perf_counter() - started:.2f}s")
    files = []
    for i in range(count):
        path = scratch / f"file-{i}.json"
        path.write_text(f'{{"n": {i}}}\n')
        files.append(path)
    try:
        for rekor in (1, 2):
            signer = local_signer(rekor_version=rekor, state=state)
            started = time.perf_counter()
            signer.sign_file(files[0])  # includes the Fulcio certificate
            first = time.perf_counter() - started
            started = time.perf_counter()
            for path in files[1:]:
                signer.sign_file(path)
            rest = time.perf_counter() - started
            print(f"sign {count} files (Rekor v{rekor}): first {first * 1000:.0f} ms (certificate + log entry + TSA), "
                  f"then {rest / max(1, count - 1) * 1000:.0f} ms/file, total {first + rest:.2f}s")
            signer.close()
    finally:
        sigstore_local.stop(state)


def _image_refs() -> dict[str, str]:
    from pipeline.imaging.build import build_images
    from pipeline.local import registry as reg

    registry = reg.default_registry()
    reg.start(registry)
    digests = build_images(["runner", "api"], registry.address)
    return {role: entry.ref for role, entry in digests.images.items()}


def _baseline_read(ref: str) -> int:
    """The SBOM read before issue 17, kept here as the yardstick: GzipFile + tarfile, and only
    ``var/lib/dpkg/status`` and ``*.dist-info/METADATA`` kept. Returns the number of files kept."""
    import gzip
    import json
    import posixpath
    import tarfile

    from pipeline.core.digests import parse_ref
    from pipeline.evidence.sbom import _Registry

    image = parse_ref(ref, "image")
    registry = _Registry(image)
    manifest = json.loads(registry.manifest(image.digest))
    registry.blob_bytes(manifest["config"]["digest"])
    files: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        stream = registry.blob_stream(layer["digest"])
        with tarfile.open(fileobj=gzip.GzipFile(fileobj=stream), mode="r|") as tar:  # type: ignore[call-overload]
            seen: dict[str, bytes] = {}
            for member in tar:
                path = posixpath.normpath(member.name.lstrip("/"))
                if member.isfile() and (path == "var/lib/dpkg/status" or (
                        path.endswith("/METADATA") and path.rsplit("/", 2)[-2].endswith(".dist-info"))):
                    handle = tar.extractfile(member)
                    if handle is not None:
                        seen[path] = handle.read()
            files.update(seen)
        stream.drain()
    return len(files)


def bench_sbom(scratch: Path) -> None:
    """The whole SBOM (read + unpack + licenses, hashes, executables, graph; render; strict validation)
    beside the pre-issue-17 read in the same run; the target is new read+build < 2x the old read."""
    from pipeline.evidence.sbom import _distro, build_bom, read_image, render_bom, validate_sbom_text
    from pipeline.local.ntia import ntia_report

    for role, ref in _image_refs().items():
        started = time.perf_counter()
        _baseline_read(ref)
        old = time.perf_counter() - started
        started = time.perf_counter()
        contents = read_image(ref)
        read = time.perf_counter() - started
        started = time.perf_counter()
        text = render_bom(build_bom(contents, distro=_distro(contents)))
        render = time.perf_counter() - started
        started = time.perf_counter()
        validate_sbom_text(text)
        validate = time.perf_counter() - started
        new = read + render
        print(f"SBOM {role}: old read+unpack {old:.2f}s (2.7s when first measured); new read+unpack {read:.2f}s "
              f"+ graph/render {render:.2f}s = {new:.2f}s, ratio new/old = {new / old:.2f} (target < 2.00; "
              f"new/2.7s = {new / 2.7:.2f}, on a busier machine than then); "
              f"strict validation {validate:.2f}s; {len(contents.debian)} deb + {len(contents.python)} pypi + "
              f"{len(contents.npm)} npm packages, {len(contents.binaries)} executables, {len(text) // 1024} KiB")
        report = ntia_report(text)
        print(f"SBOM {role} NTIA minimum elements: {report.summary()}")
        print(f"SBOM {role} coverage: {report.coverage_summary()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--parts", default="checksums,signing,sbom", help="comma-separated subset to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"checksums", "signing", "sbom"}
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(sorted(unknown))}")
    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-evidence-"))
    try:
        if "checksums" in parts:
            bench_checksums(scratch, args.size_mib)
        if "signing" in parts:
            bench_signing(scratch, args.files)
        if "sbom" in parts:
            bench_sbom(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
