"""Real engine, real registry: digests file vs registry, reproducibility, push, pull + run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from pipeline.core.contracts import DigestsFile, SourceInfo, load_model
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import base_lock_path, read_base_lock
from pipeline.imaging.base import assemble, load_specs, rootfs_tarball
from pipeline.imaging.build import ensure_base, ensure_local
from pipeline.imaging.images import build_image
from pipeline.imaging.layers import BlobStore
from pipeline.imaging.oci import MANIFEST_TYPE
from pipeline.imaging.push import Registry

FROZEN_EPOCH = 1767225600  # same as tests/imaging/conftest.py

pytestmark = [pytest.mark.docker, pytest.mark.slow]
# Per session: the refs this module pulls and `docker rmi`s are its own, never another
# session's (several test sessions share one engine and registry).
TEST_REPO_PREFIX = f"benchseal-buildtest-{uuid.uuid4().hex[:12]}"


def _head_digest(ref: ImageRef) -> str | None:
    req = urllib.request.Request(
        f"http://{ref.registry}/v2/{ref.repository}/manifests/{ref.digest}",
        method="HEAD",
        headers={"Accept": f"{MANIFEST_TYPE}, application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == MANIFEST_TYPE
        return resp.headers["Docker-Content-Digest"]


def _skopeo_raw(ref: ImageRef) -> bytes:
    return subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref.ref}"], capture_output=True, check=True
    ).stdout


@pytest.mark.parametrize("role", ["runner", "api"])
def test_registry_confirms_every_digest_in_the_file(built_images: DigestsFile, role: str) -> None:
    entry = built_images.images[role]
    ref = parse_ref(entry.ref)
    assert _head_digest(ref) == entry.digest
    raw = _skopeo_raw(ref)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == entry.digest
    assert json.loads(raw)["mediaType"] == MANIFEST_TYPE
    # Tags are metadata: each resolves to the same digest, but only the digest is recorded.
    for tag in entry.tags:
        assert Registry(ref.registry).manifest_digest(ref.repository, tag) == entry.digest


def test_digests_file_round_trips_through_the_contract(built_images: DigestsFile) -> None:
    data = json.loads(json.dumps(built_images.to_json_dict()))
    assert load_model(DigestsFile, data, "digests") == built_images
    assert set(data["images"]) == {"runner", "api"}
    assert len(data["source"]["commit"]) == 40


@pytest.mark.parametrize("role", ["runner", "api"])
def test_no_cache_rebuild_gives_identical_manifest_bytes(
    role: str, image_registry: str, base_refs: dict[str, ImageRef], app_snapshot: Path, frozen_source: SourceInfo
) -> None:
    warm = build_image(role, image_registry, base_refs, frozen_source, app_root=app_snapshot, epoch=FROZEN_EPOCH)
    cold = build_image(
        role, image_registry, base_refs, frozen_source, app_root=app_snapshot, epoch=FROZEN_EPOCH, use_cache=False
    )
    assert cold.layers_built, "use_cache=False must really rebuild the layers"
    assert cold.manifest == warm.manifest
    assert cold.ref == warm.ref
    assert _head_digest(cold.ref) == cold.ref.digest


@pytest.mark.parametrize("role", ["runner", "api"])
def test_unchanged_push_uploads_no_blob_bytes(
    role: str, image_registry: str, base_refs: dict[str, ImageRef], app_snapshot: Path, frozen_source: SourceInfo
) -> None:
    first = build_image(role, image_registry, base_refs, frozen_source, app_root=app_snapshot, epoch=FROZEN_EPOCH)
    again = build_image(role, image_registry, base_refs, frozen_source, app_root=app_snapshot, epoch=FROZEN_EPOCH)
    assert again.ref == first.ref
    assert again.stats.bytes_uploaded == 0
    assert again.stats.blobs_uploaded == 0
    assert again.stats.blobs_skipped == len(json.loads(again.manifest)["layers"]) + 1
    assert again.stats.manifests_put >= 1  # the manifest itself is re-put (idempotent)


def test_a_changed_app_changes_only_the_app_layer(
    image_registry: str, base_refs: dict[str, ImageRef], app_snapshot: Path, frozen_source: SourceInfo, tmp_path: Path
) -> None:
    import shutil

    changed = tmp_path / "app"
    shutil.copytree(app_snapshot, changed)
    # Unique per run: a registry kept from an earlier run must not already hold the changed layer.
    (changed / "pipeline" / "_buildtest_marker.py").write_text(f"MARKER = {uuid.uuid4().hex!r}\n")
    a = build_image("api", image_registry, base_refs, frozen_source, app_root=app_snapshot, epoch=FROZEN_EPOCH)
    b = build_image("api", image_registry, base_refs, frozen_source, app_root=changed, epoch=FROZEN_EPOCH)
    la, lb = json.loads(a.manifest)["layers"], json.loads(b.manifest)["layers"]
    assert a.ref.digest != b.ref.digest
    assert la[:-1] == lb[:-1] and la[-1] != lb[-1]
    assert b.stats.bytes_uploaded == lb[-1]["size"] + json.loads(b.manifest)["config"]["size"]


def _fresh_ref(image_registry: str, built: DigestsFile, role: str) -> ImageRef:
    """The built manifest under a repository only this test uses, absent from the engine.

    The engine is shared: other sessions may be running containers of the real
    refs, so the test never removes those. Same manifest bytes -> same digest.
    """
    src = parse_ref(built.images[role].ref)
    client = Registry(image_registry)
    manifest = client.get_manifest(src.repository, src.digest)
    repo = f"{TEST_REPO_PREFIX}/{role}"
    body = json.loads(manifest)
    for desc in [*body["layers"], body["config"]]:
        client.push_blob(repo, desc["digest"], desc["size"], lambda d=desc["digest"]: client.open_blob(src.repository, d), mount_from=src.repository)
    assert client.stats.bytes_uploaded == 0  # everything is mounted from the real repository
    digest = client.put_manifest(repo, src.digest, manifest)
    ref = ImageRef(f"{image_registry}/{repo}", digest)
    subprocess.run(["docker", "rmi", ref.ref], capture_output=True, check=False)
    assert subprocess.run(["docker", "image", "inspect", ref.ref], capture_output=True, check=False).returncode != 0
    return ref


def test_runner_pulled_by_digest_answers_version_commands(image_registry: str, built_images: DigestsFile) -> None:
    ref = _fresh_ref(image_registry, built_images, "runner")
    ensure_local(ref)
    benchseal = subprocess.run(["docker", "run", "--rm", ref.ref, "--version"], capture_output=True, text=True, check=True)
    assert benchseal.stdout.startswith("benchseal ")
    harbor = subprocess.run(["docker", "run", "--rm", "--entrypoint", "harbor", ref.ref, "--version"], capture_output=True, text=True, check=True)
    assert harbor.stdout.strip() == "0.26.0"
    compose = subprocess.run(["docker", "run", "--rm", "--entrypoint", "docker", ref.ref, "compose", "version"], capture_output=True, text=True, check=True)
    assert "v2.40.3" in compose.stdout
    env = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Env}}", ref.ref], capture_output=True, text=True, check=True)
    assert {"HARBOR_TELEMETRY=0", "LITELLM_LOCAL_MODEL_COST_MAP=True", "PYTHONDONTWRITEBYTECODE=1"} <= set(json.loads(env.stdout))
    subprocess.run(["docker", "rmi", ref.ref], capture_output=True, check=False)


def test_runner_imports_harbor_and_benchseal_from_bytecode(local_images: dict[str, ImageRef]) -> None:
    """Nothing is compiled at start: every module of the layers comes from the image's unchecked-hash pyc."""
    ref = local_images["runner"]
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", ref.ref, "-v", "-c",
         "import harbor.trial.trial, harbor.cli.main, pipeline.runner.trial, pipeline.cli.runner_main, pipeline.cli.main"],
        capture_output=True, text=True, check=True,
    )
    ours = ("/usr/local/lib/python3.13/dist-packages/", "/opt/benchseal/")
    # importlib logs "code object from '<pyc>'" for a cached module, "code object from <py>" when it compiles.
    from_pyc = [line for line in proc.stderr.splitlines() if line.startswith("# code object from '") and any(p in line for p in ours)]
    compiled = [line for line in proc.stderr.splitlines() if line.startswith("# code object from /") and line.split()[-1].startswith(ours)]
    assert compiled == []
    assert len(from_pyc) > 500
    assert any("/opt/benchseal/pipeline/runner/__pycache__/trial.cpython-313.pyc" in line for line in from_pyc)


def test_api_pulled_by_digest_answers_healthz(image_registry: str, built_images: DigestsFile) -> None:
    ref = _fresh_ref(image_registry, built_images, "api")
    ensure_local(ref)
    name = f"benchseal-build-api-{int(time.time() * 1000)}"
    subprocess.run(["docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8080", ref.ref], capture_output=True, check=True)
    try:
        port = subprocess.run(["docker", "port", name, "8080/tcp"], capture_output=True, text=True, check=True).stdout.split()[0]
        body = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://{port}/healthz", timeout=2) as resp:
                    body = json.loads(resp.read())
                    break
            except OSError:
                time.sleep(0.2)
        assert body is not None, subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
        assert body["status"] == "ok"
        # No queue mounted at /queue: the API says so (503, one line) instead of inventing an empty one.
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://{port}/runs", timeout=5)
        assert answer.value.code == 503 and "does not exist" in json.loads(answer.value.read())["detail"]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", ref.ref], capture_output=True, check=False)


def test_base_assembly_is_deterministic_and_matches_the_lock(base_refs: dict[str, ImageRef]) -> None:
    spec = load_specs()["base"]
    store = BlobStore()
    first = assemble(spec, rootfs_tarball(spec), store, use_cache=False)
    again = assemble(spec, rootfs_tarball(spec), store, use_cache=True)
    assert first.manifest == again.manifest
    assert first.digest == base_refs["base"].digest == read_base_lock().images["base"].digest


def test_ensure_base_is_idempotent(image_registry: str, base_refs: dict[str, ImageRef]) -> None:
    before = base_lock_path().stat().st_mtime_ns
    assert ensure_base(image_registry) == base_refs
    assert base_lock_path().stat().st_mtime_ns == before
    lock = read_base_lock().images
    assert lock["base"].packages["python3"].startswith("3.13")
    assert "docker-cli" in lock["runner-base"].packages
    assert lock["base"].epoch == load_specs()["base"].epoch


def test_base_is_available_by_digest_in_the_engine(base_refs: dict[str, ImageRef]) -> None:
    ensure_local(base_refs["base"])
    out = subprocess.run(["docker", "run", "--rm", base_refs["base"].ref, "python3", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("Python 3.13")


def test_cli_build_writes_a_valid_digests_file(tmp_path: Path, image_registry: str, built_images: DigestsFile) -> None:
    out = tmp_path / "digests.json"
    proc = subprocess.run(
        [str(Path(".venv/bin/benchseal").resolve()), "build", "--image", "api", "--registry", image_registry, "--out", str(out), "--tag", "buildtest"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    written = load_model(DigestsFile, json.loads(out.read_text()), str(out))
    assert set(written.images) == {"api"}
    entry = written.images["api"]
    assert "buildtest" in entry.tags
    assert _head_digest(parse_ref(entry.ref)) == entry.digest


def test_cli_build_rejects_an_unknown_image(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(Path(".venv/bin/benchseal").resolve()), "build", "--image", "worker", "--out", str(tmp_path / "d.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "image" in proc.stderr and "runner" in proc.stderr
    assert not (tmp_path / "d.json").exists()


def test_ensure_local_fails_for_a_digest_the_registry_lacks(image_registry: str) -> None:
    from pipeline.core.errors import InfrastructureError

    with pytest.raises(InfrastructureError, match="docker pull"):
        ensure_local(ImageRef(f"{image_registry}/{TEST_REPO_PREFIX}/absent", "sha256:" + "0" * 64))


def test_cli_base_build_is_a_no_op_when_the_lock_matches(image_registry: str, base_refs: dict[str, ImageRef]) -> None:
    before = base_lock_path().stat().st_mtime_ns
    proc = subprocess.run(
        [str(Path(".venv/bin/benchseal").resolve()), "base", "build", "--registry", image_registry],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {name: ref.ref for name, ref in base_refs.items()}
    assert base_lock_path().stat().st_mtime_ns == before


def test_local_images_fixture_pins_repo_digests(local_images: dict[str, ImageRef], built_images: DigestsFile) -> None:
    for role, ref in local_images.items():
        assert ref.ref == built_images.images[role].ref
        out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", ref.ref], capture_output=True, text=True, check=True)
        assert ref.ref in json.loads(out.stdout)
