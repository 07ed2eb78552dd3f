"""The committed base lock (images/base.production.lock.json) and frozen base builds.

A release build in Actions runs with ``BENCHSEAL_BASE_FROZEN=1`` and ``BENCHSEAL_BASE_LOCK``
naming the committed lock: the bases come from the lock, pinned by digest, and are never
built (no mmdebstrap on the hosted runner). Every way the lock can be wrong fails closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core import paths
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import BASE_LOCK_PATH, BASE_LOCK_SCHEMA
from pipeline.core.errors import CheckFailed, UsageError, ValidationError
from pipeline.imaging import base
from pipeline.imaging.names import ImageNames

COMMITTED = paths.REPO_ROOT / "images" / "base.production.lock.json"


def test_the_committed_lock_matches_the_spec_and_names_one_registry() -> None:
    """A spec change without a refreshed lock fails here, before any release build does."""
    data = json.loads(COMMITTED.read_text())
    assert data["schema"] == BASE_LOCK_SCHEMA
    specs = base.load_specs()
    assert set(data["images"]) == set(specs)
    registries = set()
    for name, spec in specs.items():
        entry = data["images"][name]
        ref = parse_ref(entry["ref"])
        assert entry["spec_hash"] == spec.spec_hash, f"{name}: refresh images/base.production.lock.json (docs/build.md)"
        assert (ref.name, ref.digest) == (entry["name"], entry["digest"])
        prefix = ref.name.removesuffix(name)
        assert ref.name == ImageNames(prefix).name(name)
        registries.add(prefix)
        assert entry["packages"] and entry["debs"], f"{name}: the SBOM needs the package list and .deb hashes"
    assert len(registries) == 1, registries
    # Not ignored: it is committed, unlike the generated images/base.lock.json.
    ignored = subprocess.run(["git", "check-ignore", "-q", str(COMMITTED)], cwd=paths.REPO_ROOT, check=False)
    assert ignored.returncode == 1


def _lock(path: Path, images: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"schema": BASE_LOCK_SCHEMA, "images": images}))
    return path


@pytest.fixture
def frozen_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_registry: str,
                base_refs: dict[str, ImageRef]) -> tuple[Path, dict[str, Any]]:
    """A committed-style lock for the test registry (what a refresh writes), frozen mode on,
    and any attempt to build a base turned into a test failure."""
    local = json.loads(BASE_LOCK_PATH.read_text())["images"] if BASE_LOCK_PATH.is_file() else {}
    entries = {name: dict(local[name]) for name in base_refs}
    for name, ref in base_refs.items():
        assert entries[name]["ref"] == ref.ref
    path = _lock(tmp_path / "base.production.lock.json", entries)
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(path))
    monkeypatch.setenv("BENCHSEAL_BASE_FROZEN", "1")

    def no_build(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a frozen build must never build a base")

    monkeypatch.setattr(base, "rootfs_tarball", no_build)
    return path, entries


@pytest.mark.docker
def test_a_frozen_build_uses_the_lock_and_writes_nothing(frozen_lock: tuple[Path, dict[str, Any]],
                                                         image_registry: str, base_refs: dict[str, ImageRef]) -> None:
    path, _ = frozen_lock
    before = path.read_bytes(), path.stat().st_mtime_ns
    assert base.ensure_base(image_registry) == base_refs
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


@pytest.mark.docker
@pytest.mark.parametrize("breakage, message", [
    ("missing-file", "is missing: a frozen build never builds a base"),
    ("missing-entry", "images.runner-base is missing"),
    ("spec-hash", "does not match images/base/spec.toml"),
    ("mixed-prefixes", "the lock's bases must share one prefix"),
    ("not-served", "the registry does not serve the locked base"),
])
def test_a_wrong_lock_fails_closed(frozen_lock: tuple[Path, dict[str, Any]], image_registry: str,
                                   breakage: str, message: str) -> None:
    path, entries = frozen_lock
    if breakage == "missing-file":
        path.unlink()
    elif breakage == "missing-entry":
        _lock(path, {k: v for k, v in entries.items() if k != "runner-base"})
    elif breakage == "spec-hash":
        _lock(path, {**entries, "base": {**entries["base"], "spec_hash": "0" * 64}})
    elif breakage == "mixed-prefixes":
        entry = entries["runner-base"]
        other = entry["name"].replace(image_registry, "ghcr.io/someone-else", 1)
        _lock(path, {**entries, "runner-base": {**entry, "name": other, "ref": f"{other}@{entry['digest']}"}})
    else:
        digest = "sha256:" + "ab" * 32
        entry = entries["base"]
        _lock(path, {**entries, "base": {**entry, "digest": digest, "ref": f"{entry['name']}@{digest}"}})
    with pytest.raises(CheckFailed, match=message):
        base.ensure_base(image_registry)


def test_frozen_needs_a_named_lock_and_a_clear_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCHSEAL_BASE_LOCK", raising=False)
    monkeypatch.setenv("BENCHSEAL_BASE_FROZEN", "1")
    with pytest.raises(UsageError, match="needs BENCHSEAL_BASE_LOCK"):
        base.ensure_base("127.0.0.1:1")
    monkeypatch.setenv("BENCHSEAL_BASE_FROZEN", "yes please")
    with pytest.raises(ValidationError, match="BENCHSEAL_BASE_FROZEN"):
        base.ensure_base("127.0.0.1:1")
    for off in ("", "0", "false"):
        monkeypatch.setenv("BENCHSEAL_BASE_FROZEN", off)
        assert base.frozen() is False


def test_frozen_cli_exits_1_naming_the_lock(tmp_path: Path) -> None:
    """`benchseal base build` (and so `benchseal build`) on a frozen, missing lock: exit 1, nothing built."""
    missing = tmp_path / "base.production.lock.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_")}
    env.update({"BENCHSEAL_BASE_FROZEN": "1", "BENCHSEAL_BASE_LOCK": str(missing),
                "BENCHSEAL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(paths.REPO_ROOT)})
    done = subprocess.run([sys.executable, "-m", "pipeline", "base", "build", "--registry", "127.0.0.1:1"],
                          capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert str(missing) in done.stderr and "docs/build.md" in done.stderr
    assert not missing.exists()


@pytest.mark.parametrize("text", ["[]", '{"schema": "benchseal.base-lock/v1", "images": []}',
                                  '{"schema": "other", "images": {}}'])
def test_a_malformed_lock_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = tmp_path / "base.production.lock.json"
    path.write_text(text)
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(path))
    monkeypatch.setenv("BENCHSEAL_BASE_FROZEN", "1")
    with pytest.raises(ValidationError, match=str(path)):
        base.ensure_base("127.0.0.1:1")


@pytest.mark.docker
def test_a_release_under_another_prefix_takes_the_locks_bases_by_digest(
        frozen_lock: tuple[Path, dict[str, Any]], image_registry: str, base_refs: dict[str, ImageRef]) -> None:
    """benchseal's committed lock names its own published bases; an adopter releasing under its
    own prefix uses exactly those, by digest (the push mounts or copies their blobs)."""
    from pipeline.imaging.names import ImageNames

    assert base.ensure_base(ImageNames(f"{image_registry}/acme/widget-")) == base_refs
