"""Assemble the runner and api images from ``images/<role>/image.toml`` (no ``docker build``).

image = base manifest's layers (reused as is, never re-compressed)
      + one layer per ``[[layers]]`` entry, written deterministically
      + a canonical config and manifest.

Epochs: dependency layers use the base spec's fixed epoch (they change only
when a lock changes, so their blobs are shared across commits); the app layer
and the config ``created`` use SOURCE_DATE_EPOCH, default the commit time.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.agent.resolve import ResolvedAgent
from pipeline.core import paths
from pipeline.core.contracts import IMAGE_ROLES, DigestsFile, ImageEntry, SourceInfo
from pipeline.core.digests import ImageRef
from pipeline.core.documents import BASE_LOCK_PATH
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.imaging import bytecode, oci, wheels
from pipeline.imaging.agentlayers import agent_label, agent_layers
from pipeline.imaging.base import load_specs
from pipeline.imaging.layers import (
    BlobStore,
    Entry,
    Layer,
    LayerCache,
    build_layer,
    entries_key,
    staging_dir,
    tree_entries,
)
from pipeline.imaging.names import ImageNames, as_names
from pipeline.imaging.push import PushStats, Registry, validate_oci_tag

IMAGES_DIR = paths.REPO_ROOT / "images"
BUILDER_VERSION = "benchseal-build/1"
APP_ROOT = "/opt/benchseal"
# Copied into the image beside the package, so pipeline.core.paths.REPO_ROOT/<dir> works there too. No suites:
# datasets are the infra's, staged by the worker by their digest (pipeline.infra.worker.dataset), so a new or
# edited suite needs no new runner image.
APP_DIRS = ("pipeline", "policies")
_EXCLUDE_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_EXCLUDE_SUFFIXES = (".pyc", ".pyo", ".tmp", ".swp")
# Layers with ``bytecode = true`` keep the __pycache__ dirs that bytecode.compile_tree wrote.
_EXCLUDE_DIRS_BYTECODE = _EXCLUDE_DIRS - {"__pycache__"}
_EXCLUDE_SUFFIXES_BYTECODE = tuple(s for s in _EXCLUDE_SUFFIXES if s != ".pyc")
# What the app layer compiles (suites/ hold task sources that are copied into task images as is).
APP_BYTECODE_DIRS = (f"{APP_ROOT}/pipeline",)


def _git(*args: str, root: Path | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(root or paths.REPO_ROOT), *args], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def source_info(checkout: Path | None = None) -> SourceInfo:
    """What is released: commit = HEAD of ``checkout``; ref = $GITHUB_REF or refs/heads/<branch> /
    refs/tags/<tag>; repository = $GITHUB_REPOSITORY.

    ``checkout``: the source repository (an adopter's, holding its project file), default the
    project directory (benchseal's own checkout). Either must be the top of its git checkout:
    git walks up, and a directory inside another repository must not take that one's commit.
    """
    root = paths.REPO_ROOT if checkout is None else checkout
    if checkout is None and paths.PROJECT_SOURCE == "package data":
        raise UsageError(
            "build needs the project's git checkout (the app layer and source.commit come from it): "
            "run it as benchseal --project-dir CHECKOUT build ..."
        )
    commit = _git("rev-parse", "HEAD", root=root)
    if not commit:
        raise InfrastructureError(f"{root} is not a git checkout with a commit (git rev-parse HEAD failed)")
    toplevel = _git("rev-parse", "--show-toplevel", root=root)
    if not toplevel or Path(toplevel).resolve() != root.resolve():
        raise UsageError(f"source directory {root} is not the top of a git checkout (git says {toplevel or 'none'})")
    ref = os.environ.get("GITHUB_REF") or _git("symbolic-ref", "-q", "HEAD", root=root)
    if not ref:
        tag = _git("describe", "--exact-match", "--tags", "HEAD", root=root)
        ref = f"refs/tags/{tag}" if tag else "HEAD"
    return SourceInfo(commit=commit, ref=ref, repository=os.environ.get("GITHUB_REPOSITORY") or "local/benchseal")


def source_checkout(project_file: Path) -> Path:
    """The source repository a project file belongs to: the top of the git checkout holding it."""
    toplevel = _git("rev-parse", "--show-toplevel", root=project_file.resolve().parent)
    if not toplevel:
        raise UsageError(f"--project: {project_file} is not inside a git checkout (the release commit comes from it)")
    return Path(toplevel)


def source_date_epoch(commit: str = "HEAD", root: Path | None = None) -> int:
    """$SOURCE_DATE_EPOCH, else the committer time of ``commit`` (in the checkout ``root``)."""
    configured = os.environ.get("SOURCE_DATE_EPOCH")
    value = configured if configured is not None else _git("log", "-1", "--format=%ct", commit, root=root)
    if not value.isdigit():
        raise ValidationError("SOURCE_DATE_EPOCH", "must be a non-negative integer (seconds since 1970)", value)
    return int(value)


@dataclass(frozen=True)
class ImageSpec:
    role: str
    directory: Path
    base: str
    config: dict[str, Any]
    layers: tuple[dict[str, Any], ...]


def load_image_spec(role: str) -> ImageSpec:
    if role not in IMAGE_ROLES:
        raise ValidationError("image", f"must be one of {', '.join(IMAGE_ROLES)}", role)
    directory = IMAGES_DIR / role
    raw = tomllib.loads((directory / "image.toml").read_text())
    if "repository" in raw:
        raise ValidationError(f"images/{role}/image.toml: repository", "image names are configuration "
                              "(--image-prefix / $BENCHSEAL_IMAGE_PREFIX), not part of the spec", raw["repository"])
    return ImageSpec(
        role=role,
        directory=directory,
        base=raw["base"],
        config=raw.get("config", {}),
        layers=tuple(raw.get("layers", ())),
    )


@dataclass
class BuildResult:
    role: str
    ref: ImageRef
    manifest: bytes
    tags: tuple[str, ...]
    stats: PushStats
    seconds_build: float = 0.0
    seconds_push: float = 0.0
    layers_built: list[str] = field(default_factory=list)


def _wheel_cache() -> Path:
    return paths.state_dir("cache", "wheels")


def prefetch_wheels(roles: Sequence[str]) -> None:
    """Download what the roles' wheel layers need and the wheel cache lacks (by its index: a warm
    build hashes nothing here). The build runs it beside the base images."""
    for role in roles:
        spec = load_image_spec(role)
        for layer in spec.layers:
            if layer.get("kind") != "wheels":
                continue
            for item in layer.get("locks", ()):
                lock = spec.directory / item["lock"]
                if wheels.missing(lock, _wheel_cache()):
                    wheels.download(lock, _wheel_cache(), item["python_version"], item["platforms"])
            for item in layer.get("extract", ()):
                lock = spec.directory / item["lock"]
                if wheels.missing(lock, _wheel_cache(), binary=False):
                    wheels.download(lock, _wheel_cache(), "", (), binary=False)


def _bytecode_key(interpreter: ImageRef | None) -> dict[str, str] | None:
    """Cache-key part of a layer's bytecode: the interpreter that compiled it (base digest) and the driver."""
    if interpreter is None:
        return None
    return {"interpreter": interpreter.digest, "compiler": bytecode.COMPILER_ID}


def _wheels_layer(
    spec: ImageSpec,
    layer: dict[str, Any],
    epoch: int,
    store: BlobStore,
    cache: LayerCache,
    built: list[str],
    interpreter: ImageRef | None = None,
) -> Layer:
    """``interpreter`` (the base image): compile the layer's site-packages with it (``bytecode = true``)."""
    locks = [spec.directory / item["lock"] for item in layer.get("locks", ())] + [
        spec.directory / item["lock"] for item in layer.get("extract", ())
    ]
    key_data: dict[str, Any] = {
        "builder": BUILDER_VERSION,
        "layer": layer,
        "epoch": epoch,
        "locks": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in locks},
    }
    if interpreter is not None:
        key_data["bytecode"] = _bytecode_key(interpreter)
    key = "wheels-" + hashlib.sha256(oci.canonical_bytes(key_data)).hexdigest()
    cached = cache.get(key)
    if cached is not None:
        return cached
    with staging_dir("benchseal-layer-") as root:
        _stage_wheels(spec, layer, root)
        if interpreter is not None:
            bytecode.compile_tree(root, [layer["site_packages"]], interpreter,
                                  bytecode.BytecodeCache(interpreter, read=cache.enabled))
            entries = tree_entries(root, "/", _EXCLUDE_DIRS_BYTECODE, _EXCLUDE_SUFFIXES_BYTECODE)
        else:
            entries = tree_entries(root, "/", _EXCLUDE_DIRS, _EXCLUDE_SUFFIXES)
        entries += [Entry(link["path"], "symlink", target=link["target"]) for link in layer.get("symlinks", ())]
        result = build_layer(entries, epoch, store)
    cache.put(key, result)
    built.append(result.digest)
    return result


def _wheels_maker(spec: ImageSpec, layer: dict[str, Any], epoch: int, store: BlobStore, cache: LayerCache,
                  interpreter: ImageRef | None, built: list[str]) -> tuple[Layer, str]:
    made = _wheels_layer(spec, layer, epoch, store, cache, built, interpreter)
    return made, f"benchseal: wheels {layer.get('comment', '')}".strip()


def _stage_wheels(spec: ImageSpec, layer: dict[str, Any], root: Path) -> None:
    """Install a wheels layer's locked wheels (and its sdist members) into ``root``, laid out as the image."""
    files: list[Path] = []
    for item in layer.get("locks", ()):
        found = wheels.download(spec.directory / item["lock"], _wheel_cache(), item["python_version"], item["platforms"])
        files.extend(found.values())
    wheels.install(files, root, layer["site_packages"], layer["scripts"], layer["interpreter"])
    for item in layer.get("extract", ()):
        sdists = wheels.download(spec.directory / item["lock"], _wheel_cache(), "", (), binary=False)
        (archive,) = sdists.values()
        target = root / item["path"].lstrip("/")
        wheels.extract_member(archive, item["member"], target)
        target.chmod(int(item.get("mode", 0o644)))


def _app_maker(root: Path, entry: str, epoch: int, store: BlobStore, cache: LayerCache, interpreter: ImageRef | None,
               built: list[str]) -> tuple[Layer, str]:
    return _app_layer(root, entry, epoch, store, cache, built, interpreter), f"benchseal: app {__version__}"


# The app layer's ``entry``: the ``pipeline.cli`` module whose ``main()`` the image's ``benchseal`` runs.
_ENTRY_RE = re.compile(r"\Apipeline\.cli\.[a-z][a-z0-9_]*\Z")


def app_entry(spec: ImageSpec, layer: dict[str, Any], app_root: Path) -> str:
    """The app layer's ``entry`` module (required: each image names the verbs it ships)."""
    field = f"images/{spec.role}/image.toml: layers.entry"
    entry = layer.get("entry")
    if not isinstance(entry, str) or not _ENTRY_RE.fullmatch(entry):
        raise ValidationError(field, "must name a pipeline.cli module with a main(), e.g. 'pipeline.cli.main'", entry)
    if not (app_root / (entry.replace(".", "/") + ".py")).is_file():
        raise ValidationError(field, "must name a module that exists in the checkout", entry)
    return entry


def _app_entries(app_root: Path, entry: str) -> list[Entry]:
    entries: list[Entry] = []
    for name in APP_DIRS:
        source = app_root / name
        if source.is_dir():
            entries += tree_entries(source, f"{APP_ROOT}/{name}", _EXCLUDE_DIRS | {f"{name}.egg-info"}, _EXCLUDE_SUFFIXES)
    script = f"#!/usr/bin/python3\nimport sys\nfrom {entry} import main\nsys.exit(main())\n".encode()
    entries.append(Entry("/usr/local/bin/benchseal", "file", mode=0o755, data=script))
    # Debian's python3 reads .pth files in /usr/local/lib/python3.13/dist-packages.
    entries.append(Entry(f"{APP_SITE}/benchseal.pth", "file", data=f"{APP_ROOT}\n".encode()))
    return entries + _app_dist_info(app_root, entries)


APP_SITE = "/usr/local/lib/python3.13/dist-packages"
_SPDX_EXPRESSION = re.compile(r"[A-Za-z0-9.+-]+(?: (?:AND|OR|WITH) [A-Za-z0-9.+-]+)*")


def _app_dist_info(app_root: Path, entries: list[Entry]) -> list[Entry]:
    """benchseal's own dist-info, so the image says what it is: METADATA (name, version, the license
    pyproject.toml declares) and a RECORD listing every app file (the launcher and the suites' scripts
    included), as an installer writes it. Deterministic: the same files give the same bytes."""

    project: dict[str, Any] = {}
    pyproject = app_root / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    license_ = project.get("license")
    license_text = license_.get("text") if isinstance(license_, dict) else license_
    lines = ["Metadata-Version: 2.4", "Name: benchseal", f"Version: {__version__}"]
    if isinstance(project.get("description"), str):
        lines.append(f"Summary: {project['description']}")
    if isinstance(license_text, str) and _SPDX_EXPRESSION.fullmatch(license_text.strip()):
        lines.append(f"License-Expression: {license_text.strip()}")
    metadata = ("\n".join(lines) + "\n").encode()
    installer = b"benchseal-build\n"
    dist_info = f"{APP_SITE}/benchseal-{__version__.replace('-', '_')}.dist-info"
    rows: list[list[str]] = []
    for entry in [*entries, Entry(f"{dist_info}/METADATA", "file", data=metadata),
                  Entry(f"{dist_info}/INSTALLER", "file", data=installer)]:
        if entry.kind != "file":
            continue
        data = entry.data if entry.data is not None else entry.source.read_bytes() if entry.source else b""
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([os.path.relpath(entry.path, APP_SITE), f"sha256={digest}", str(len(data))])
    rows.append([os.path.relpath(f"{dist_info}/RECORD", APP_SITE), "", ""])
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(sorted(rows))
    return [Entry(dist_info, "dir", mode=0o755),
            Entry(f"{dist_info}/METADATA", "file", data=metadata),
            Entry(f"{dist_info}/INSTALLER", "file", data=installer),
            Entry(f"{dist_info}/RECORD", "file", data=buffer.getvalue().encode())]


def _app_layer(
    app_root: Path, entry: str, epoch: int, store: BlobStore, cache: LayerCache, built: list[str],
    interpreter: ImageRef | None = None,
) -> Layer:
    entries = _app_entries(app_root, entry)
    key_text = f"{BUILDER_VERSION}\n{epoch}\n{entries_key(entries)}"
    if interpreter is not None:
        key_text += "\n" + json.dumps(_bytecode_key(interpreter), sort_keys=True)
    key = "app-" + hashlib.sha256(key_text.encode()).hexdigest()
    cached = cache.get(key)
    if cached is not None:
        return cached
    with staging_dir("benchseal-app-") as tmp:
        if interpreter is not None:
            entries += _app_bytecode(entries, tmp, interpreter, bytecode.BytecodeCache(interpreter, read=cache.enabled))
        result = build_layer(entries, epoch, store)
    cache.put(key, result)
    built.append(result.digest)
    return result


def _app_bytecode(entries: list[Entry], stage: Path, interpreter: ImageRef,
                  cache: bytecode.BytecodeCache | None = None) -> list[Entry]:
    """Stage the app's sources as laid out in the image, compile them, return the .pyc entries."""
    for entry in entries:
        if entry.kind != "file" or not any(entry.path.startswith(d + "/") for d in APP_BYTECODE_DIRS):
            continue
        target = stage / entry.arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.data is not None:
            target.write_bytes(entry.data)
        elif entry.source is not None:
            shutil.copyfile(entry.source, target)
    bytecode.compile_tree(stage, APP_BYTECODE_DIRS, interpreter, cache)
    return [
        Entry("/" + pyc.relative_to(stage).as_posix(), "file", source=pyc)
        for top in APP_BYTECODE_DIRS
        for pyc in sorted((stage / top.lstrip("/")).rglob("__pycache__/*.pyc"))
    ]


def _bytecode_interpreter(spec: ImageSpec, layer: dict[str, Any], base: ImageRef) -> ImageRef | None:
    """The base image when the layer asks for bytecode (``bytecode = true``), else None."""
    flag = layer.get("bytecode", False)
    if not isinstance(flag, bool):
        raise ValidationError(f"images/{spec.role}/image.toml: layers.bytecode", "must be true or false", flag)
    return base if flag else None


def _base_manifest(base: ImageRef, store: BlobStore) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, config) of the base: from the local blob store, else from its registry."""
    client = Registry(base.registry)
    raw = store.read(base.digest) if store.has(base.digest) else client.get_manifest(base.repository, base.digest)
    manifest: dict[str, Any] = json.loads(raw)
    config_digest = manifest["config"]["digest"]
    config_raw = store.read(config_digest) if store.has(config_digest) else client.get_blob(base.repository, config_digest)
    store.put_bytes(raw)
    store.put_bytes(config_raw)
    config: dict[str, Any] = json.loads(config_raw)
    return manifest, config


def assemble(
    spec: ImageSpec,
    base: ImageRef,
    source: SourceInfo,
    store: BlobStore,
    use_cache: bool = True,
    app_root: Path | None = None,
    epoch: int | None = None,
    agent: ResolvedAgent | None = None,
) -> tuple[bytes, bytes, list[str]]:
    """(manifest bytes, config bytes, digests of layers built now) for ``spec`` on ``base``.

    ``app_root`` (default the checkout) holds the app directories; ``epoch``
    (default SOURCE_DATE_EPOCH / commit time) stamps the app layer and config.
    ``agent`` (runner only): the release's agent, in its own layers after the app's.
    """
    if agent is not None and spec.role != "runner":
        raise UsageError(f"image {spec.role}: only the runner carries the release's agent")
    cache = LayerCache(store, enabled=use_cache)
    built: list[str] = []
    base_specs = load_specs()
    deps_epoch = base_specs[spec.base].epoch if spec.base in base_specs else 0
    app_epoch = source_date_epoch(source.commit) if epoch is None else epoch
    base_manifest, base_config = _base_manifest(base, store)
    makers: list[Callable[[list[str]], tuple[Layer, str]]] = []
    for layer in spec.layers:
        kind = layer.get("kind")
        compiled_by = _bytecode_interpreter(spec, layer, base)
        if kind == "wheels":
            makers.append(functools.partial(_wheels_maker, spec, layer, deps_epoch, store, cache, compiled_by))
        elif kind == "app":
            root = app_root or paths.REPO_ROOT
            entry = app_entry(spec, layer, root)
            makers.append(functools.partial(_app_maker, root, entry, app_epoch, store, cache, compiled_by))
        else:
            raise ValidationError(f"images/{spec.role}/image.toml: layers.kind", "must be 'wheels' or 'app'", kind)
    # The layers are independent: made side by side (the app's bytecode and tar beside the wheels');
    # each one's bytes do not depend on when it was made, and the image lists them in spec order.
    built_by_layer: list[list[str]] = [[] for _ in makers]
    with ThreadPoolExecutor(max_workers=max(1, len(makers)), thread_name_prefix=f"layers-{spec.role}") as pool:
        futures = [pool.submit(make, made) for make, made in zip(makers, built_by_layer, strict=True)]
        new_layers: list[tuple[Layer, str]] = [future.result() for future in futures]
    built += [digest for made in built_by_layer for digest in made]
    if agent is not None:
        new_layers += agent_layers(agent, deps_epoch=deps_epoch, epoch=app_epoch, store=store, cache=cache, built=built)

    created = oci.timestamp(app_epoch)
    inner = dict(base_config.get("config") or {})
    cfg = spec.config
    inner["Env"] = oci.merge_env(list(inner.get("Env") or [oci.DEFAULT_PATH]), dict(cfg.get("env", {})))
    for key, value in (("Entrypoint", cfg.get("entrypoint")), ("Cmd", cfg.get("cmd"))):
        if value:
            inner[key] = list(value)
        else:
            inner.pop(key, None)
    inner["WorkingDir"] = cfg.get("workdir", "/")
    if cfg.get("exposed_ports"):
        inner["ExposedPorts"] = {port: {} for port in cfg["exposed_ports"]}
    inner["Labels"] = {
        **(inner.get("Labels") or {}),
        "org.opencontainers.image.base.digest": base.digest,
        "org.opencontainers.image.base.name": base.name,
        "org.opencontainers.image.revision": source.commit,
        "org.opencontainers.image.source": source.repository,
        "org.opencontainers.image.title": f"benchseal-{spec.role}",
        "org.opencontainers.image.version": __version__,
        **(agent_label(agent) if agent is not None else {}),
    }
    config = {
        "architecture": base_config.get("architecture", "amd64"),
        "os": base_config.get("os", "linux"),
        "created": created,
        "config": inner,
        "rootfs": {
            "type": "layers",
            "diff_ids": list(base_config["rootfs"]["diff_ids"]) + [layer.diff_id for layer, _ in new_layers],
        },
        "history": list(base_config.get("history") or []) + [{"created": created, "created_by": why} for _, why in new_layers],
    }
    config_bytes = oci.canonical_bytes(config)
    manifest = oci.manifest_bytes(config_bytes, list(base_manifest["layers"]) + [oci.layer_descriptor(layer) for layer, _ in new_layers])
    store.put_bytes(config_bytes)
    store.put_bytes(manifest)
    return manifest, config_bytes, built


def push_image(client: Registry, repository: str, manifest: bytes, store: BlobStore, base: ImageRef | None, tags: Sequence[str]) -> str:
    """Push blobs (only missing ones) and the manifest, by digest and under ``tags``."""
    data = json.loads(manifest)
    for desc in [*data["layers"], data["config"]]:
        digest, size = desc["digest"], int(desc["size"])
        mount = base.repository if base is not None and base.registry == client.host else None
        if store.has(digest):
            client.push_file_blob(repository, digest, store.path(digest), mount_from=mount)
        elif base is not None:
            source = Registry(base.registry)
            client.push_blob(repository, digest, size, lambda d=digest, s=source: s.open_blob(base.repository, d), mount_from=mount)  # type: ignore[misc]
        else:
            raise CheckFailed(f"blob {digest} of {repository} is neither cached nor in a base registry")
    digest = client.put_manifest(repository, oci.sha256_digest(manifest), manifest)
    for tag in tags:
        if client.put_manifest(repository, tag, manifest) != digest:
            raise CheckFailed(f"tag {tag} of {repository} does not resolve to {digest}")
    return digest


def default_tags(source: SourceInfo, extra: Sequence[str] = (), agent: ResolvedAgent | None = None) -> tuple[str, ...]:
    # A runner with a release's agent is another image of the same commit: its commit tag names the agent too.
    suffix = "" if agent is None else re.sub(r"[^A-Za-z0-9_.-]", "_", f"-{agent.artifact.name}-{agent.artifact.version}")
    tags = [f"git-{source.commit[:12]}{suffix}"]
    if source.ref.startswith("refs/tags/"):
        tags.append(source.ref.removeprefix("refs/tags/"))
    tags += list(extra)
    return tuple(dict.fromkeys(validate_oci_tag(t) for t in tags))


def build_image(
    role: str,
    target: ImageNames | str,
    bases: dict[str, ImageRef],
    source: SourceInfo,
    tags: Sequence[str] = (),
    use_cache: bool = True,
    app_root: Path | None = None,
    epoch: int | None = None,
    agent: ResolvedAgent | None = None,
) -> BuildResult:
    spec = load_image_spec(role)
    if spec.base not in bases:
        raise UsageError(f"image {role}: base {spec.base!r} is not in {BASE_LOCK_PATH.name} / images/base/spec.toml")
    base = bases[spec.base]
    store = BlobStore()
    started = time.monotonic()
    manifest, _, built = assemble(spec, base, source, store, use_cache=use_cache, app_root=app_root, epoch=epoch,
                                  agent=agent if role == "runner" else None)
    assembled = time.monotonic()
    names = as_names(target)
    client = Registry(names.registry)
    name = names.name(role)
    all_tags = default_tags(source, tags, agent if role == "runner" else None)
    digest = push_image(client, names.repository(role), manifest, store, base, all_tags)
    return BuildResult(
        role=role,
        ref=ImageRef(name, digest),
        manifest=manifest,
        tags=all_tags,
        stats=client.stats,
        seconds_build=assembled - started,
        seconds_push=time.monotonic() - assembled,
        layers_built=built,
    )


def digests_file(source: SourceInfo, results: Sequence[BuildResult], agent: ResolvedAgent | None = None) -> DigestsFile:
    images = {
        r.role: ImageEntry(name=r.ref.name, digest=r.ref.digest, ref=r.ref.ref, tags=r.tags)
        for r in results
    }
    return DigestsFile.model_validate({"schema": "benchseal.digests/v1", "source": source, "images": images,
                                       "agent": agent.artifact if agent is not None else None})
