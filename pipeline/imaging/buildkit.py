"""The adopter's own images: Dockerfiles built with BuildKit, pushed by digest, confirmed by the registry.

A project file (``benchseal.toml``, pipeline.core.project) may declare ``[images.<name>]`` with a
``dockerfile`` and a ``context``, both inside the source repository. ``benchseal build --project``
builds each with BuildKit (the engine's embedded BuildKit, driven by the ``docker-buildx`` client
that scripts/install-tools.sh installs), with ``SOURCE_DATE_EPOCH`` = the release commit's time,
and pushes it as ``PREFIX + name`` (the runner's prefix, pipeline.imaging.names) with the same
client and the same check as the runner (pipeline.imaging.images.push_image: the registry's
Docker-Content-Digest must be the sha256 of the manifest bytes pushed).

Two ways to a reproducible image, chosen from what the engine is (measured, docs/build.md):

* ``buildkit``: Engine >= 26 (BuildKit >= 0.13) with the containerd image store. BuildKit itself
  writes an OCI layout with ``SOURCE_DATE_EPOCH`` and ``rewrite-timestamp=true``; benchseal pushes
  those exact bytes.
* ``benchseal-clamp``: every other engine: Debian 12's Engine 20.10 (BuildKit 0.8, which ignores
  SOURCE_DATE_EPOCH and has no OCI exporter or rewrite-timestamp with the docker driver) and
  Debian 13's Engine 26 with its default (classic) image store (no OCI exporter). BuildKit builds
  into the engine; benchseal reads the image back (``docker save``) and applies rewrite-timestamp's
  rule itself: every file mtime and every config/history ``created`` later than SOURCE_DATE_EPOCH
  becomes SOURCE_DATE_EPOCH; layers with nothing to clamp stay byte for byte as they are (a base
  image's layers keep their diff_ids). Layers are gzipped deterministically (mtime 0, level 6) and
  config and manifest written as canonical JSON.

Either way only timestamps are normalized: a Dockerfile whose RUN steps write different bytes each
time (random data, downloads of moving targets) still gives a new digest on each build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO

import docker

from pipeline.core import paths
from pipeline.core.contracts import DigestsFile, ImageEntry, SourceInfo, load_model
from pipeline.core.digests import ImageRef, parse_ref, validate_digest, validate_name
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.project import ProjectImage, load_project
from pipeline.imaging import oci
from pipeline.imaging.images import default_tags, push_image, source_date_epoch
from pipeline.imaging.layers import BASE_GZIP_LEVEL, BlobStore, Layer, LayerCache, compress_tar_stream
from pipeline.imaging.names import ImageNames
from pipeline.imaging.push import Registry

BUILDX_ENV = "BENCHSEAL_BUILDX"  # an explicit docker-buildx binary (tests, unusual installs)
# Where the docker CLI keeps plugins (Debian 13's docker-buildx package uses the libexec one).
_PLUGIN_DIRS = ("/usr/libexec/docker/cli-plugins", "/usr/lib/docker/cli-plugins", "/usr/local/lib/docker/cli-plugins")
BUILD_TIMEOUT = 2 * 3600
METHOD_BUILDKIT = "buildkit"  # BuildKit's own SOURCE_DATE_EPOCH + rewrite-timestamp
METHOD_CLAMP = "benchseal-clamp"  # BuildKit built it; benchseal clamped the timestamps afterwards
_NATIVE_MIN_API = (1, 45)  # Engine 26.0: embedded BuildKit 0.13, the first with rewrite-timestamp
_CHUNK = 1 << 20
_CACHE_VERSION = "buildkit-clamp-1"  # layer cache keys: change with clamp_tar's output
_RFC3339 = re.compile(r"\A(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})\Z")


# --- the plan: what the project file asks for, checked before anything is built ------------------


@dataclass(frozen=True)
class PlannedImage:
    name: str
    dockerfile: Path
    context: Path
    spec: ProjectImage


@dataclass(frozen=True)
class Plan:
    project_file: Path
    root: Path  # the top of the source checkout holding the project file
    images: tuple[PlannedImage, ...]


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def checkout_root(project_file: Path) -> Path:
    """The top of the git checkout that holds ``project_file`` (the repository its paths must stay in)."""
    toplevel = _git(project_file.resolve().parent, "rev-parse", "--show-toplevel")
    if not toplevel:
        raise UsageError(f"--project: {project_file} is not inside a git checkout (the release commit comes from it)")
    return Path(toplevel).resolve()


def _inside(root: Path, base: Path, relative: str, field: str, kind: str) -> Path:
    """``base / relative`` resolved (symlinks followed); it must be inside ``root`` and be a ``kind``."""
    target = (base / relative).resolve()
    try:
        target.relative_to(root)
    except ValueError:
        raise ValidationError(field, f"must stay inside the repository {root} (it resolves to {target})",
                              relative) from None
    if kind == "file" and not target.is_file():
        raise ValidationError(field, f"must name a file in the repository: {target} is not one", relative)
    if kind == "dir" and not target.is_dir():
        raise ValidationError(field, f"must name a directory in the repository: {target} is not one", relative)
    return target


def plan(project_file: Path) -> Plan:
    """The project file's images with their paths checked (exit 2 naming ``images.<name>.<key>``)."""
    project = load_project(project_file)
    if not project.images:
        return Plan(project_file, project_file.resolve().parent, ())
    root = checkout_root(project_file)
    base = project_file.resolve().parent
    planned = []
    for name, spec in sorted(project.images.items()):
        dockerfile = _inside(root, base, spec.dockerfile, f"images.{name}.dockerfile", "file")
        context = _inside(root, base, spec.context, f"images.{name}.context", "dir")
        planned.append(PlannedImage(name, dockerfile, context, spec))
    return Plan(project_file, root, tuple(planned))


def validate_names(build_plan: Plan, names: ImageNames) -> None:
    """Every image's name (``names.prefix + name``) is a valid repository name (exit 2 otherwise)."""
    for image in build_plan.images:
        try:
            validate_name(names.prefix + image.name, f"images.{image.name}")
        except ValidationError as exc:
            raise ValidationError(f"images.{image.name}", f"{exc.rule} (as {names.prefix + image.name!r})") from None


# --- the tools: docker-buildx and the engine it drives --------------------------------------------


def find_buildx() -> Path:
    """``$BENCHSEAL_BUILDX``; else the one scripts/install-tools.sh installed; else docker's plugin dirs."""
    configured = os.environ.get(BUILDX_ENV)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValidationError(BUILDX_ENV, "must name an executable docker-buildx binary", configured)
        return path
    candidates = [paths.home() / "tools" / "bin" / "docker-buildx"]
    for directory in [os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")]:
        candidates.append(Path(directory) / "cli-plugins" / "docker-buildx")
    candidates += [Path(d) / "docker-buildx" for d in _PLUGIN_DIRS]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise InfrastructureError("BuildKit's client docker-buildx is not installed (run scripts/install-tools.sh; "
                              f"or set ${BUILDX_ENV})")


@dataclass(frozen=True)
class Builder:
    """What builds: the buildx client, the engine (its embedded BuildKit, docker driver) and the method."""

    buildx: Path
    buildx_version: str
    buildkit_version: str
    engine_version: str
    api_version: tuple[int, int]
    containerd_store: bool

    @property
    def method(self) -> str:
        native = self.api_version >= _NATIVE_MIN_API and self.containerd_store
        return METHOD_BUILDKIT if native else METHOD_CLAMP

    def describe(self) -> str:
        store = "containerd image store" if self.containerd_store else "classic image store"
        return (f"BuildKit {self.buildkit_version} in Docker Engine {self.engine_version} ({store}; "
                f"docker-buildx {self.buildx_version}, docker driver)")


def _buildx_env() -> dict[str, str]:
    # buildx keeps its builder state in BUILDX_CONFIG (default ~/.docker/buildx): ours, not the user's.
    return {**os.environ, "BUILDX_CONFIG": str(paths.state_dir("buildkit", "buildx")), "BUILDX_NO_DEFAULT_ATTESTATIONS": "1"}


def _run_buildx(buildx: Path, args: Sequence[str], timeout: float = 60) -> str:
    try:
        done = subprocess.run([str(buildx), *args], capture_output=True, text=True, check=False, timeout=timeout,
                              env=_buildx_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfrastructureError(f"docker-buildx {args[0]} failed: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfrastructureError(f"docker-buildx {args[0]} failed (exit {done.returncode}): {last[:300]}")
    return done.stdout


def _docker_client() -> Any:
    try:
        return docker.from_env(timeout=600)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"Docker Engine unavailable: {exc}") from None


def _api_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (0, 0)


def probe(buildx: Path | None = None) -> Builder:
    """The builder ``buildx`` drives on this machine's engine (``$DOCKER_HOST``), and its versions."""
    buildx = buildx or find_buildx()
    version_words = _run_buildx(buildx, ["version"]).split()
    inspect = _run_buildx(buildx, ["inspect", "--bootstrap"], timeout=120)
    found = re.search(r"^BuildKit version:\s*(\S+)", inspect, re.MULTILINE)
    client = _docker_client()
    try:
        version = client.version()
        info = client.info()
    except Exception as exc:  # docker.errors.APIError, requests errors
        raise InfrastructureError(f"Docker Engine unavailable: {exc}") from None
    finally:
        client.close()
    status = {str(k): str(v) for k, v in (info.get("DriverStatus") or []) if isinstance(k, str)}
    return Builder(
        buildx=buildx,
        buildx_version=version_words[1] if len(version_words) > 1 else "unknown",
        buildkit_version=found.group(1) if found else "unknown",
        engine_version=str(version.get("Version", "unknown")),
        api_version=_api_version(str(version.get("ApiVersion", ""))),
        containerd_store=status.get("driver-type") == "io.containerd.snapshotter.v1",
    )


# --- timestamps --------------------------------------------------------------------------------------


def clamp_timestamp(value: object, epoch: int, field: str) -> object:
    """An RFC 3339 time later than ``epoch`` becomes ``epoch`` (``YYYY-MM-DDTHH:MM:SSZ``); others stay."""
    match = _RFC3339.match(value) if isinstance(value, str) else None
    if match is None:
        raise CheckFailed(f"{field}: BuildKit wrote a time that is not RFC 3339: {value!r}")
    offset = "+00:00" if match.group(3) == "Z" else match.group(3)
    seconds = int(datetime.fromisoformat(match.group(1) + offset).timestamp())
    fraction = match.group(2) or ""
    if seconds > epoch or (seconds == epoch and fraction.strip(".0")):
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


def clamp_config(config: Mapping[str, Any], epoch: int) -> dict[str, Any]:
    """The image config with ``created`` and every ``history[].created`` clamped to ``epoch``."""
    result = dict(config)
    if "created" in result:
        result["created"] = clamp_timestamp(result["created"], epoch, "config.created")
    history = []
    for i, item in enumerate(result.get("history") or []):
        entry = dict(item)
        if "created" in entry:
            entry["created"] = clamp_timestamp(entry["created"], epoch, f"config.history.{i}.created")
        history.append(entry)
    if "history" in result:
        result["history"] = history
    return result


_TIME_KEYS = ("mtime", "atime", "ctime")  # PAX records that carry times


def _latest_time(layer: IO[bytes]) -> float:
    """The latest mtime (or PAX atime/ctime) of any member of a layer tar."""
    latest = 0.0
    with tarfile.open(fileobj=layer, mode="r:") as tar:
        for member in tar:
            latest = max(latest, float(member.mtime),
                         *(float(member.pax_headers[k]) for k in _TIME_KEYS[1:] if k in member.pax_headers))
    return latest


def _octal_field(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:
        raise CheckFailed(f"{what}: a base-256 number in a layer tar header is not supported")
    text = field.rstrip(b"\0 ").lstrip(b" ")
    return int(text, 8) if text else 0


def _with_octal(header: bytes, start: int, width: int, value: int) -> bytes:
    """``header`` with the numeric field at ``start`` set to ``value``: zero-padded octal, NUL-terminated."""
    field = b"%0*o\0" % (width - 1, value)
    if len(field) != width:
        raise CheckFailed(f"layer tar: {value} does not fit a {width}-byte header field")
    return header[:start] + field + header[start + width:]


def _with_checksum(header: bytes) -> bytes:
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return header[:148] + b"%06o\0" % unsigned + header[155:]


def _clamp_pax(records: bytes, epoch: int) -> bytes:
    """PAX records with every time later than ``epoch`` removed (the header's mtime field, clamped, then holds)."""
    kept = []
    rest = records
    while rest:
        length_text, _, _ = rest.partition(b" ")
        if not length_text.isdigit() or int(length_text) > len(rest) or int(length_text) <= len(length_text):
            raise CheckFailed("layer tar: a PAX header record is malformed")
        record, rest = rest[:int(length_text)], rest[int(length_text):]
        key, _, value = record[len(length_text) + 1:-1].partition(b"=")
        if key.decode("utf-8", "replace") in _TIME_KEYS and float(value) > epoch:
            continue
        kept.append(record)
    return b"".join(kept)


def _read_exact(source: IO[bytes], size: int) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise CheckFailed("layer tar: truncated")
    return data


def _copy_exact(source: IO[bytes], out: BinaryIO, size: int) -> None:
    while size:
        chunk = _read_exact(source, min(size, _CHUNK))
        out.write(chunk)
        size -= len(chunk)


def clamp_tar(source: IO[bytes], epoch: int, out: BinaryIO) -> None:
    """Copy a layer tar with every time later than ``epoch`` set to ``epoch`` (rewrite-timestamp's rule).

    Works on the raw 512-byte blocks: only mtime fields (and their checksums) change, and PAX time
    records that were later than ``epoch`` go (a PAX header left empty goes with them). So a member
    whose time was clamped is byte for byte the member the engine writes when the time was ``epoch``
    to begin with, and a layer with nothing to clamp comes out unchanged.
    """
    while True:
        header = source.read(512)
        if not header:
            return
        if len(header) != 512:
            raise CheckFailed("layer tar: truncated header")
        if header == bytes(512):  # end of archive: the rest is padding
            out.write(header)
            shutil.copyfileobj(source, out, _CHUNK)
            return
        kind = header[156:157]
        size = _octal_field(header[124:136], "layer tar size")
        padded = -(-size // 512) * 512
        if kind in (b"x", b"g"):
            records = _read_exact(source, padded)[:size]
            kept = _clamp_pax(records, epoch)
            if not kept:
                continue  # nothing left to say: the member stands on its own header
            if kept != records:
                header = _with_octal(header, 124, 12, len(kept))
                out.write(_with_checksum(header))
                out.write(kept + bytes(-len(kept) % 512))
            else:
                out.write(header)
                out.write(records + bytes(padded - size))
            continue
        if kind not in (b"L", b"K") and _octal_field(header[136:148], "layer tar mtime") > epoch:
            header = _with_checksum(_with_octal(header, 136, 12, epoch))
        out.write(header)
        _copy_exact(source, out, padded)


# --- the build ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectImageResult:
    name: str
    ref: ImageRef
    tags: tuple[str, ...]
    method: str
    builder: str
    epoch: int
    seconds_build: float
    seconds_push: float

    def entry(self) -> ImageEntry:
        return ImageEntry(name=self.ref.name, digest=self.ref.digest, ref=self.ref.ref, tags=self.tags)

    def report(self) -> str:
        """One line for the build's stderr: how the image came to be reproducible (or what it is not)."""
        if self.method == METHOD_BUILDKIT:
            how = f"BuildKit applied SOURCE_DATE_EPOCH={self.epoch} and rewrite-timestamp itself"
        else:
            how = (f"this BuildKit cannot make the image reproducible by itself (SOURCE_DATE_EPOCH is not applied to "
                   f"layers, rewrite-timestamp is not available), so benchseal clamped every timestamp to "
                   f"SOURCE_DATE_EPOCH={self.epoch} after the build")
        return f"images.{self.name}: {self.ref.ref} built with {self.builder}; {how}"


def _log_path(name: str) -> Path:
    return paths.state_dir("buildkit", "logs") / f"{name}.log"


def _buildx_build(builder: Builder, image: PlannedImage, output: str, metadata: Path, epoch: int, no_cache: bool) -> None:
    args = ["build", "--file", str(image.dockerfile), "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
            "--provenance=false", "--sbom=false", "--progress=plain", "--metadata-file", str(metadata),
            "--output", output]
    if no_cache:
        args.append("--no-cache")
    args.append(str(image.context))
    log = _log_path(image.name)
    env = {**_buildx_env(), "SOURCE_DATE_EPOCH": str(epoch)}
    try:
        with log.open("wb") as handle:
            done = subprocess.run([str(builder.buildx), *args], stdout=handle, stderr=subprocess.STDOUT, check=False,
                                  timeout=BUILD_TIMEOUT, env=env, cwd=str(image.context))
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"images.{image.name}: the BuildKit build took longer than {BUILD_TIMEOUT} s; log: {log}") from None
    except OSError as exc:
        raise InfrastructureError(f"images.{image.name}: cannot run docker-buildx: {exc}") from None
    if done.returncode != 0:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("ERROR:")] or [line for line in lines if line.strip()]
        reason = errors[-1].strip()[:400] if errors else "no output"
        raise CheckFailed(f"images.{image.name}: the BuildKit build failed (docker-buildx exit {done.returncode}): "
                          f"{reason}; log: {log}")


def _put_stream(store: BlobStore, source: IO[bytes], digest: str, what: str) -> None:
    """Copy ``source`` into the store as ``digest``; CheckFailed when the bytes hash otherwise."""
    validate_digest(digest, what)
    if store.has(digest):
        return
    tmp = store.temp_path()
    sha = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            while chunk := source.read(_CHUNK):
                sha.update(chunk)
                out.write(chunk)
        if "sha256:" + sha.hexdigest() != digest:
            raise CheckFailed(f"{what}: the blob BuildKit wrote does not hash to its digest {digest}")
        os.replace(tmp, store.path(digest))
    finally:
        tmp.unlink(missing_ok=True)


def _member(tar: tarfile.TarFile, name: str, what: str) -> IO[bytes]:
    try:
        handle = tar.extractfile(name)
    except KeyError:
        handle = None
    if handle is None:
        raise CheckFailed(f"{what}: {name} is missing from the image BuildKit wrote")
    return handle


def _from_oci_layout(archive: Path, store: BlobStore, name: str) -> bytes:
    """The manifest of the one image in BuildKit's OCI layout tar; its blobs copied into ``store``."""
    what = f"images.{name}"
    with tarfile.open(archive, mode="r:") as tar:
        index = json.loads(_member(tar, "index.json", what).read())
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise CheckFailed(f"{what}: BuildKit's OCI layout holds {len(manifests)} manifests, not exactly one")
        digest = validate_digest(manifests[0].get("digest"), f"{what} manifest digest")
        manifest = _member(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", what).read()
        if oci.sha256_digest(manifest) != digest:
            raise CheckFailed(f"{what}: the manifest BuildKit wrote does not hash to {digest}")
        data = json.loads(manifest)
        if data.get("mediaType") != oci.MANIFEST_TYPE:
            raise CheckFailed(f"{what}: BuildKit wrote a {data.get('mediaType')!r} manifest, not {oci.MANIFEST_TYPE}")
        store.put_bytes(manifest)
        for desc in [data["config"], *data["layers"]]:
            blob = validate_digest(desc.get("digest"), f"{what} blob digest")
            _put_stream(store, _member(tar, f"blobs/sha256/{blob.removeprefix('sha256:')}", what), blob, what)
        return manifest


def _layer(outer: tarfile.TarFile, path: str, diff_id: str, epoch: int, store: BlobStore, cache: LayerCache,
           what: str) -> Layer:
    """One layer of a ``docker save`` archive as a deterministic gzip blob, clamped when it must be."""
    validate_digest(diff_id, f"{what} diff_id")
    handle = _member(outer, path, what)
    try:
        clamp = _latest_time(handle) > epoch
    except tarfile.TarError as exc:
        raise CheckFailed(f"{what}: layer {path} is not a tar the engine should have saved: {exc}") from None
    key = f"{_CACHE_VERSION}-{epoch}-{diff_id}" if clamp else f"{_CACHE_VERSION}-{diff_id}"
    cached = cache.get(key.replace(":", "-"))
    if cached is not None:
        return cached
    handle.seek(0)
    # At the base's gzip level: a layer left as the base's comes out as the base's own blob.
    if clamp:
        layer = compress_tar_stream(lambda out: clamp_tar(handle, epoch, out), store, level=BASE_GZIP_LEVEL)
    else:
        layer = compress_tar_stream(lambda out: shutil.copyfileobj(handle, out, _CHUNK), store, level=BASE_GZIP_LEVEL)
        if layer.diff_id != diff_id:
            raise CheckFailed(f"{what}: layer {path} hashes to {layer.diff_id}, not the config's diff_id {diff_id}")
    cache.put(key.replace(":", "-"), layer)
    return layer


def _from_docker_archive(archive: Path, store: BlobStore, epoch: int, name: str, image_id: str | None) -> bytes:
    """An OCI manifest for the image of a ``docker save`` archive, timestamps clamped to ``epoch``."""
    what = f"images.{name}"
    cache = LayerCache(store, compression="")  # its layers are gzipped at the base's level, as before
    with tarfile.open(archive, mode="r:") as outer:
        saved = json.loads(_member(outer, "manifest.json", what).read())
        if not isinstance(saved, list) or len(saved) != 1:
            raise CheckFailed(f"{what}: the saved archive holds {len(saved) if isinstance(saved, list) else 0} images, "
                              "not exactly one")
        config_raw = _member(outer, saved[0]["Config"], what).read()
        if image_id is not None and oci.sha256_digest(config_raw) != image_id:
            raise CheckFailed(f"{what}: the engine saved config {oci.sha256_digest(config_raw)}, not the image "
                              f"{image_id} BuildKit built")
        config = json.loads(config_raw)
        diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
        paths_ = list(saved[0].get("Layers") or [])
        if len(diff_ids) != len(paths_):
            raise CheckFailed(f"{what}: the saved image has {len(paths_)} layers for {len(diff_ids)} diff_ids")
        layers = [_layer(outer, path, diff_id, epoch, store, cache, what) for path, diff_id in zip(paths_, diff_ids, strict=True)]
    config = clamp_config(config, epoch)
    config["rootfs"] = {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}
    config_bytes = oci.canonical_bytes(config)
    store.put_bytes(config_bytes)
    manifest = oci.manifest_bytes(config_bytes, [oci.layer_descriptor(layer) for layer in layers])
    store.put_bytes(manifest)
    return manifest


@contextlib.contextmanager
def _loaded(client: Any, reference: str) -> Iterator[None]:
    """Remove the engine's temporary tag for a loaded build afterwards (the image is ours to drop)."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            client.images.remove(reference)


def _save(client: Any, reference: str, dest: Path, name: str) -> None:
    try:
        with dest.open("wb") as out:
            for chunk in client.api.get_image(reference):
                out.write(chunk)
    except Exception as exc:  # docker.errors.APIError, connection errors
        raise InfrastructureError(f"images.{name}: docker save of the built image failed: {exc}") from None


def build_one(builder: Builder, image: PlannedImage, names: ImageNames, source: SourceInfo, epoch: int,
              tags: Sequence[str] = (), no_cache: bool = False, store: BlobStore | None = None) -> ProjectImageResult:
    """Build ``image`` with BuildKit, push it under ``names.prefix + image.name``; the registry confirms the digest."""
    name = validate_name(names.prefix + image.name, f"images.{image.name}")
    repository = name.partition("/")[2]
    store = store or BlobStore()
    method = builder.method
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="benchseal-buildkit-") as tmp:
        work = Path(tmp)
        metadata = work / "metadata.json"
        if method == METHOD_BUILDKIT:
            archive = work / "image.oci.tar"
            _buildx_build(builder, image, f"type=oci,dest={archive},rewrite-timestamp=true", metadata, epoch, no_cache)
            manifest = _from_oci_layout(archive, store, image.name)
        else:
            reference = f"benchseal-buildkit-tmp/{image.name}:{uuid.uuid4().hex[:16]}"
            client = _docker_client()
            try:
                with _loaded(client, reference):
                    _buildx_build(builder, image, f"type=docker,name={reference}", metadata, epoch, no_cache)
                    built = _metadata_digest(metadata)
                    archive = work / "image.docker.tar"
                    _save(client, reference, archive, image.name)
                manifest = _from_docker_archive(archive, store, epoch, image.name, built)
            finally:
                client.close()
    built_at = time.monotonic()
    all_tags = default_tags(source, tags)
    client = Registry(names.registry)
    digest = push_image(client, repository, manifest, store, None, all_tags)
    ref = parse_ref(f"{name}@{validate_digest(digest, f'images.{image.name}.digest')}", f"images.{image.name}.ref")
    return ProjectImageResult(name=image.name, ref=ref, tags=all_tags, method=method, builder=builder.describe(),
                              epoch=epoch, seconds_build=built_at - started, seconds_push=time.monotonic() - built_at)


def _metadata_digest(metadata: Path) -> str | None:
    """The image id (config digest) BuildKit reports for a build loaded into the engine, when it does."""
    try:
        data = json.loads(metadata.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("containerimage.config.digest") or data.get("containerimage.digest")
    return validate_digest(value, "buildx metadata digest") if isinstance(value, str) else None


def with_project_images(digests: DigestsFile, results: Sequence[ProjectImageResult]) -> DigestsFile:
    """``digests`` with ``results`` recorded under ``project_images``; every ref re-validated."""
    data = digests.model_dump(mode="json", by_alias=True)
    data["project_images"] = {**data.get("project_images", {}), **{r.name: r.entry().model_dump(mode="json") for r in results}}
    merged = load_model(DigestsFile, data, "digests file")
    for name, entry in merged.project_images.items():
        parse_ref(entry.ref, f"project_images.{name}.ref")
    return merged


def build_project_images(build_plan: Plan, names: ImageNames, source: SourceInfo, tags: Sequence[str] = (),
                         no_cache: bool = False, builder: Builder | None = None) -> list[ProjectImageResult]:
    """Build and push every image of ``build_plan``; SOURCE_DATE_EPOCH is the release commit's time.

    The release commit is ``source.commit``: it must be the HEAD of the checkout holding the
    project file, or the images would come from another tree than the one recorded.
    """
    if not build_plan.images:
        return []
    head = _git(build_plan.root, "rev-parse", "HEAD")
    if head != source.commit:
        raise UsageError(f"--project: the checkout {build_plan.root} is at {head or 'no commit'}, not the release commit "
                         f"{source.commit} the digests file records: build the images from the release's checkout")
    epoch = source_date_epoch(source.commit, root=build_plan.root)
    builder = builder or probe()
    store = BlobStore()
    return [build_one(builder, image, names, source, epoch, tags, no_cache, store) for image in build_plan.images]
