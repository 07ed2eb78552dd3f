"""The adopter's own images (benchseal.toml [images.<name>]): built with BuildKit, reproducible,
pushed by digest and confirmed by the registry (pipeline/imaging/buildkit.py).

The engine tests build real Dockerfiles with the engine's BuildKit (driven by the docker-buildx
that scripts/install-tools.sh installs) FROM benchseal's own base image in the local registry.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from pipeline.core.contracts import DigestsFile, SourceInfo
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.imaging import buildkit, oci
from pipeline.imaging.layers import BlobStore
from pipeline.imaging.names import ImageNames
from pipeline.imaging.push import Registry

EPOCH = 1767225600  # the release commit's time in these tests (2026-01-01T00:00:00Z)
TOML = '''schema = "benchseal.project/v1"
[agent]
name = "coval"
kind = "python"
import_path = "coval.agent:Agent"
'''


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_COMMITTER_DATE": f"@{EPOCH} +0000", "GIT_AUTHOR_DATE": f"@{EPOCH} +0000",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env=env).stdout.strip()


def make_repo(root: Path, dockerfiles: dict[str, str], images: str) -> Path:
    """A source repository: ``dockerfiles`` (path -> text), app/hello.txt, benchseal.toml with ``images``; committed."""
    root.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "-q")
    (root / "app").mkdir(exist_ok=True)
    (root / "app" / "hello.txt").write_text("hello\n")
    for path, text in dockerfiles.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "benchseal.toml").write_text(TOML + images)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "release")
    return root / "benchseal.toml"


def source_of(project: Path) -> SourceInfo:
    return SourceInfo(commit=_git(project.parent, "rev-parse", "HEAD"), ref="refs/tags/v1.0.0", repository="acme/coval")


# --- the plan: paths checked before anything is built (no engine needed) ----------------------------


def test_a_dockerfile_symlinked_out_of_the_repository_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.Dockerfile"
    outside.write_text("FROM scratch\n")
    project = make_repo(tmp_path / "repo", {}, '[images.app]\ndockerfile = "docker/app.Dockerfile"\n')
    (tmp_path / "repo" / "docker").mkdir()
    (tmp_path / "repo" / "docker" / "app.Dockerfile").symlink_to(outside)
    with pytest.raises(ValidationError) as caught:
        buildkit.plan(project)
    assert caught.value.field == "images.app.dockerfile" and "must stay inside the repository" in caught.value.rule
    assert caught.value.exit_code == 2


def test_a_context_symlinked_out_of_the_repository_is_refused(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "repo", {"Dockerfile": "FROM scratch\n"},
                        '[images.app]\ndockerfile = "Dockerfile"\ncontext = "ctx"\n')
    (tmp_path / "repo" / "ctx").symlink_to(tmp_path)
    with pytest.raises(ValidationError, match="must stay inside the repository") as caught:
        buildkit.plan(project)
    assert caught.value.field == "images.app.context"


def test_a_missing_dockerfile_is_refused_naming_the_key(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "repo", {}, '[images.app]\ndockerfile = "docker/missing.Dockerfile"\n')
    with pytest.raises(ValidationError) as caught:
        buildkit.plan(project)
    assert caught.value.field == "images.app.dockerfile" and "must name a file in the repository" in caught.value.rule
    assert "\n" not in caught.value.diagnostics()


def test_a_project_file_outside_a_git_checkout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "benchseal.toml").write_text(TOML + '[images.app]\ndockerfile = "Dockerfile"\n')
    with pytest.raises(UsageError, match="not inside a git checkout"):
        buildkit.plan(tmp_path / "benchseal.toml")


def test_paths_are_relative_to_the_project_file_and_checked_against_the_checkout(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    project = make_repo(root, {"sub/docker/Dockerfile": "FROM scratch\n", "Dockerfile": "FROM scratch\n"}, "")
    nested = root / "sub" / "benchseal.toml"
    nested.write_text(TOML + '[images.app]\ndockerfile = "docker/Dockerfile"\n[images.top]\ndockerfile = "./docker/Dockerfile"\n'
                      'context = "docker"\n')
    planned = buildkit.plan(nested)
    assert planned.root == root.resolve()
    assert [(i.name, i.dockerfile, i.context) for i in planned.images] == [
        ("app", root.resolve() / "sub/docker/Dockerfile", root.resolve() / "sub"),
        ("top", root.resolve() / "sub/docker/Dockerfile", root.resolve() / "sub/docker"),
    ]
    assert buildkit.plan(project).images == ()  # no [images]: nothing to build, no checkout needed


def test_an_image_name_that_makes_no_repository_name_is_a_usage_error(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "repo", {"Dockerfile": "FROM scratch\n"}, f'[images.{"a" * 64}]\ndockerfile = "Dockerfile"\n')
    prefix = "127.0.0.1:5055/" + "p" * 180 + "/"
    with pytest.raises(ValidationError) as caught:
        buildkit.validate_names(buildkit.plan(project), ImageNames(prefix))
    assert caught.value.field == f"images.{'a' * 64}" and "at most 255" in caught.value.rule


def test_the_release_commit_must_be_the_checkout_the_images_come_from(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "repo", {"Dockerfile": "FROM scratch\n"}, '[images.app]\ndockerfile = "Dockerfile"\n')
    other = SourceInfo(commit="c" * 40, ref="refs/tags/v1.0.0", repository="acme/coval")
    with pytest.raises(UsageError, match="not the release commit"):
        buildkit.build_project_images(buildkit.plan(project), ImageNames("127.0.0.1:5055/x/"), other)


def test_a_buildx_that_is_not_executable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(buildkit.BUILDX_ENV, str(tmp_path / "nothing"))
    with pytest.raises(ValidationError, match="executable docker-buildx"):
        buildkit.find_buildx()


@pytest.mark.parametrize(("api", "containerd", "method"), [
    ((1, 41), False, buildkit.METHOD_CLAMP),     # Debian 12: Engine 20.10, BuildKit 0.8
    ((1, 45), False, buildkit.METHOD_CLAMP),     # Debian 13: Engine 26, classic image store (the default)
    ((1, 44), True, buildkit.METHOD_CLAMP),      # Engine 25: BuildKit 0.12, no rewrite-timestamp
    ((1, 45), True, buildkit.METHOD_BUILDKIT),   # Engine 26 with the containerd image store
])
def test_the_method_follows_what_the_engine_can_do(api: tuple[int, int], containerd: bool, method: str) -> None:
    builder = buildkit.Builder(Path("/x"), "0.13.1", "v0.13", "26.1.5", api, containerd)
    assert builder.method == method


# --- timestamps: rewrite-timestamp's rule, applied by benchseal ---------------------------------------


def _tar(members: list[tuple[str, int, bytes | None]], fmt: int = tarfile.USTAR_FORMAT,
         pax: dict[str, dict[str, str]] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, mtime, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.pax_headers = dict((pax or {}).get(name, {}))
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _clamp(data: bytes, epoch: int = EPOCH) -> bytes:
    out = io.BytesIO()
    buildkit.clamp_tar(io.BytesIO(data), epoch, out)
    return out.getvalue()


def test_a_layer_with_nothing_to_clamp_is_unchanged_byte_for_byte() -> None:
    data = _tar([("opt", EPOCH - 10, None), ("opt/a", EPOCH, b"a")])
    assert _clamp(data) == data


def test_a_clamped_layer_is_the_layer_written_at_the_epoch() -> None:
    later = _tar([("opt", EPOCH + 500, None), ("opt/a", EPOCH + 1, b"a"), ("old", EPOCH - 7, b"x" * 700)])
    at_epoch = _tar([("opt", EPOCH, None), ("opt/a", EPOCH, b"a"), ("old", EPOCH - 7, b"x" * 700)])
    assert _clamp(later) == at_epoch
    with tarfile.open(fileobj=io.BytesIO(_clamp(later))) as tar:  # checksums are right: tarfile reads it
        assert [(m.name, m.mtime) for m in tar] == [("opt", EPOCH), ("opt/a", EPOCH), ("old", EPOCH - 7)]


def test_pax_time_records_later_than_the_epoch_go() -> None:
    later = _tar([("a", EPOCH + 1, b"a"), ("b", EPOCH + 2, b"b")], tarfile.PAX_FORMAT,
                 {"a": {"mtime": f"{EPOCH + 1}.5", "atime": f"{EPOCH + 9}"},
                  "b": {"mtime": f"{EPOCH + 2}.25", "SCHILY.xattr.user.k": "v"}})
    with tarfile.open(fileobj=io.BytesIO(_clamp(later))) as tar:
        members = list(tar)
    assert [(m.name, m.mtime) for m in members] == [("a", EPOCH), ("b", EPOCH)]
    assert members[0].pax_headers == {} and members[1].pax_headers == {"SCHILY.xattr.user.k": "v"}
    assert _clamp(_clamp(later)) == _clamp(later)


def test_config_times_are_clamped_and_older_ones_kept() -> None:
    config = {"created": "2026-12-04T22:24:25.685899506Z", "history": [
        {"created": "2025-01-01T00:00:00Z", "created_by": "base"},
        {"created": "2026-01-01T00:00:00.5+00:00", "created_by": "COPY"},
        {"created_by": "no time"},
    ]}
    clamped = buildkit.clamp_config(config, EPOCH)
    assert clamped["created"] == "2026-01-01T00:00:00Z"
    assert [h.get("created") for h in clamped["history"]] == ["2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z", None]
    with pytest.raises(CheckFailed, match="not RFC 3339"):
        buildkit.clamp_config({"created": "yesterday"}, EPOCH)


# --- BuildKit's OCI layout (the native path) ----------------------------------------------------------


def _layout(tmp_path: Path, manifests: int = 1, corrupt: bool = False) -> Path:
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        digest = oci.sha256_digest(data)
        blobs[digest] = data
        return digest

    layer = gzip.compress(_tar([("a", EPOCH, b"a")]), mtime=0)
    config = oci.canonical_bytes({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    put(config)
    layer_digest = put(layer)
    manifest = oci.manifest_bytes(config, [oci.descriptor(oci.LAYER_TYPE, layer_digest, len(layer))])
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": oci.MANIFEST_TYPE, "digest": put(manifest), "size": len(manifest)}] * manifests}
    if corrupt:
        blobs[layer_digest] = b"not the layer"
    archive = tmp_path / "layout.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in [("index.json", json.dumps(index).encode()), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           *((f"blobs/sha256/{d.removeprefix('sha256:')}", b) for d, b in blobs.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_the_native_path_takes_buildkits_manifest_bytes_as_they_are(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    manifest = buildkit._from_oci_layout(_layout(tmp_path), store, "app")
    data = json.loads(manifest)
    assert all(store.has(d["digest"]) for d in [data["config"], *data["layers"]])
    assert store.has(oci.sha256_digest(manifest))


def test_the_native_path_refuses_two_manifests_and_corrupt_blobs(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match="not exactly one"):
        buildkit._from_oci_layout(_layout(tmp_path, manifests=2), BlobStore(tmp_path / "b1"), "app")
    with pytest.raises(CheckFailed, match="does not hash to its digest"):
        buildkit._from_oci_layout(_layout(tmp_path, corrupt=True), BlobStore(tmp_path / "b2"), "app")


def test_project_images_are_recorded_in_the_digests_file_and_absent_when_none() -> None:
    source = SourceInfo(commit="c" * 40, ref="refs/tags/v1.0.0", repository="acme/coval")
    bare = DigestsFile.model_validate({"schema": "benchseal.digests/v1", "source": source, "images": {}})
    assert "project_images" not in bare.to_json_dict()
    ref = ImageRef("127.0.0.1:5055/benchseal/coval-api", "sha256:" + "a" * 64)
    result = buildkit.ProjectImageResult("coval-api", ref, ("git-cccccccccccc",), buildkit.METHOD_CLAMP, "BuildKit",
                                         EPOCH, 1.0, 1.0)
    merged = buildkit.with_project_images(bare, [result])
    assert merged.to_json_dict()["project_images"] == {"coval-api": {
        "name": ref.name, "digest": ref.digest, "ref": ref.ref, "tags": ["git-cccccccccccc"]}}
    assert DigestsFile.model_validate(merged.to_json_dict()) == merged


# --- with the engine's BuildKit and the local registry ------------------------------------------------


@pytest.fixture(scope="module")
def builder() -> buildkit.Builder:
    try:
        return buildkit.probe()
    except InfrastructureError as exc:
        pytest.fail(f"BuildKit is not reachable (make setup installs docker-buildx and starts the engine): {exc}")


def _dockerfile(base: ImageRef, run: str = "echo built > /opt/built.txt") -> str:
    return (f"FROM {base.ref}\nCOPY app/hello.txt /opt/hello.txt\nRUN {run}\n"
            'ENV COVAL=1\nCMD ["cat", "/opt/hello.txt"]\n')


def _names(registry: str) -> ImageNames:
    return ImageNames(f"{registry}/benchseal-buildkit-{uuid.uuid4().hex[:8]}/")


@pytest.mark.docker
def test_two_builds_of_one_commit_give_one_digest_the_registry_confirms(
        tmp_path: Path, image_registry: str, base_refs: dict[str, ImageRef], builder: buildkit.Builder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    project = make_repo(tmp_path / "repo", {"docker/api.Dockerfile": _dockerfile(base_refs["base"])},
                        '[images.coval-api]\ndockerfile = "docker/api.Dockerfile"\n')
    names, source, built_plan = _names(image_registry), source_of(project), buildkit.plan(project)
    first = buildkit.build_project_images(built_plan, names, source, no_cache=True, builder=builder)
    (project.parent / "app" / "hello.txt").touch()  # a fresh checkout's mtimes: the same commit
    second = buildkit.build_project_images(built_plan, names, source, no_cache=True, builder=builder)
    assert first[0].ref == second[0].ref, (
        f"{builder.describe()}: two --no-cache builds of one commit gave {first[0].ref.digest} and {second[0].ref.digest}")
    ref = parse_ref(first[0].ref.ref)
    assert ref.name == names.prefix + "coval-api"
    client = Registry(ref.registry)
    assert client.manifest_digest(ref.repository, ref.digest) == ref.digest
    manifest = json.loads(client.get_manifest(ref.repository, ref.digest))
    config = json.loads(client.get_blob(ref.repository, manifest["config"]["digest"]))
    assert config["created"] == "2026-01-01T00:00:00Z"  # SOURCE_DATE_EPOCH = the release commit's time
    assert config["config"]["Env"][-1] == "COVAL=1" and config["config"]["Cmd"] == ["cat", "/opt/hello.txt"]
    # the base's layer is the base's own blob: nothing re-encoded, nothing clamped
    base_manifest = json.loads(Registry(base_refs["base"].registry).get_manifest(base_refs["base"].repository,
                                                                               base_refs["base"].digest))
    assert manifest["layers"][0] == base_manifest["layers"][0]
    assert first[0].tags == ("git-" + source.commit[:12], "v1.0.0")
    assert client.manifest_digest(ref.repository, "v1.0.0") == ref.digest
    assert first[0].method == builder.method and builder.describe() in first[0].report()


@pytest.mark.docker
def test_the_native_path_is_reproducible_by_buildkit_itself(
        tmp_path: Path, image_registry: str, base_refs: dict[str, ImageRef], builder: buildkit.Builder,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if builder.method != buildkit.METHOD_BUILDKIT:
        pytest.skip(f"BuildKit's own SOURCE_DATE_EPOCH + rewrite-timestamp needs Docker Engine >= 26 with the containerd "
                    f"image store; this is {builder.describe()} (benchseal clamps the timestamps instead)")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    project = make_repo(tmp_path / "repo", {"Dockerfile": _dockerfile(base_refs["base"])},
                        '[images.app]\ndockerfile = "Dockerfile"\n')
    names, source, built_plan = _names(image_registry), source_of(project), buildkit.plan(project)
    first = buildkit.build_project_images(built_plan, names, source, no_cache=True, builder=builder)
    second = buildkit.build_project_images(built_plan, names, source, no_cache=True, builder=builder)
    assert first[0].ref == second[0].ref


@pytest.mark.docker
def test_a_failing_dockerfile_is_one_line_exit_1(tmp_path: Path, image_registry: str, base_refs: dict[str, ImageRef],
                                                builder: buildkit.Builder) -> None:
    project = make_repo(tmp_path / "repo", {"Dockerfile": _dockerfile(base_refs["base"], "echo broken >&2; exit 3")},
                        '[images.app]\ndockerfile = "Dockerfile"\n')
    with pytest.raises(CheckFailed) as caught:
        buildkit.build_project_images(buildkit.plan(project), _names(image_registry), source_of(project), builder=builder)
    message = caught.value.diagnostics()
    assert caught.value.exit_code == 1 and "\n" not in message
    assert message.startswith("images.app: the BuildKit build failed") and "exit code: 3" in message
    assert "log: " in message


@pytest.mark.docker
def test_a_registry_that_confirms_another_digest_fails_the_build(
        tmp_path: Path, lying_registry: str, base_refs: dict[str, ImageRef], builder: buildkit.Builder) -> None:
    project = make_repo(tmp_path / "repo", {"Dockerfile": _dockerfile(base_refs["base"])},
                        '[images.app]\ndockerfile = "Dockerfile"\n')
    with pytest.raises(CheckFailed, match="is not the sha256 of the manifest bytes pushed") as caught:
        buildkit.build_project_images(buildkit.plan(project), ImageNames(f"{lying_registry}/acme/"), source_of(project),
                                      builder=builder)
    assert caught.value.exit_code == 1


def test_the_cli_refuses_a_dockerfile_out_of_the_repository_before_building(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "repo", {}, '[images.app]\ndockerfile = "Dockerfile"\n')
    (tmp_path / "repo" / "Dockerfile").symlink_to("/etc/hostname")
    done = subprocess.run([str(Path(sys.executable).with_name("benchseal")), "build", "--image", "api", "--project",
                           str(project), "--release-tag", "v1.0.0", "--registry", "127.0.0.1:9"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "images.app.dockerfile" in lines[0] and "must stay inside the repository" in lines[0]


def test_the_cli_records_project_images_and_fails_a_broken_build_with_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The verb's wiring, with benchseal's own images and BuildKit stood in for: the digests file
    gains project_images; a failing Dockerfile is one line on stderr and exit 1, and no file is written."""
    from pipeline.cli import main as cli_main
    from pipeline.imaging import build as build_module

    project = make_repo(tmp_path / "repo", {"Dockerfile": "FROM scratch\n"}, '[images.app]\ndockerfile = "Dockerfile"\n')
    source = source_of(project)
    own = DigestsFile.model_validate({"schema": "benchseal.digests/v1", "source": source, "images": {}})
    monkeypatch.setattr(build_module, "build_images", lambda *args, **kwargs: own)
    monkeypatch.setattr(buildkit, "probe", lambda: buildkit.Builder(Path("/x"), "0.13.1", "v0.8", "20.10", (1, 41), False))
    ref = ImageRef("127.0.0.1:5055/benchseal/app", "sha256:" + "b" * 64)
    outcome: list[object] = [buildkit.ProjectImageResult("app", ref, (), buildkit.METHOD_CLAMP, "BuildKit v0.8", EPOCH, 0, 0)]

    def fake_build(*args: object, **kwargs: object) -> list[object]:
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome

    monkeypatch.setattr(buildkit, "build_project_images", fake_build)
    out = tmp_path / "digests.json"
    argv = ["benchseal", "build", "--image", "api", "--project", str(project), "--release-tag", "v1.0.0",
            "--registry", "127.0.0.1:5055", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code in (0, None)
    written = json.loads(out.read_text())
    assert written["project_images"]["app"]["ref"] == ref.ref
    assert "benchseal: images.app: " in capsys.readouterr().err

    out.unlink()
    outcome[0] = CheckFailed("images.app: the BuildKit build failed (docker-buildx exit 1): ERROR: process did not "
                             "complete successfully: exit code: 3\nforged line")
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("benchseal: error: images.app: the BuildKit build failed")
    assert not out.exists()
