"""Base images: mmdebstrap rootfs -> single-layer OCI image -> registry + lock.

``images/base/spec.toml`` says what goes in. The rootfs tarball is cached per
spec hash (mmdebstrap takes ~30 s and depends on the Debian mirror of the day);
the compressed layer is cached per tarball hash. ``images/base.lock.json`` is
GENERATED (gitignored): it records what this machine built and pushed.

A production build runs FROZEN (``BENCHSEAL_BASE_FROZEN=1`` with ``BENCHSEAL_BASE_LOCK``
naming a committed lock, ``images/base.production.lock.json``): every base comes from
that lock, pinned by digest, and is never built; a missing lock, a missing entry, an
entry for another spec, entries under different prefixes, or a registry that does not serve
the digest fails. The lock's prefix may differ from the release's (an adopter pushes under
its own prefix and takes benchseal's published bases by digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from pipeline.core import paths
from pipeline.core.digests import ImageRef, require_repo_digest
from pipeline.core.documents import BaseImage, BaseLock, base_lock_path, dump_document, read_base_lock
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError, ValidationError
from pipeline.core.fsutil import atomic_write_json, sha256_file
from pipeline.core.registry_auth import docker_auth_config
from pipeline.imaging import oci
from pipeline.imaging.layers import BlobStore, Layer, LayerCache, build_lock, compress_tarball
from pipeline.imaging.names import ImageNames, as_names
from pipeline.imaging.push import Registry

SPEC_PATH = paths.REPO_ROOT / "images" / "base" / "spec.toml"
FROZEN_ENV = "BENCHSEAL_BASE_FROZEN"


def frozen() -> bool:
    """``$BENCHSEAL_BASE_FROZEN``: 1/true = use the committed lock only, never build a base."""
    raw = os.environ.get(FROZEN_ENV, "").strip().lower()
    if raw in ("", "0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise ValidationError(FROZEN_ENV, "must be 1/true or 0/false (or unset)", raw)


_SAFE_PATH = re.compile(r"\A/[A-Za-z0-9._/-]+\Z")
_PACKAGE = re.compile(r"\A[a-z0-9][a-z0-9+.-]+\Z")


@dataclass(frozen=True)
class BaseSpec:
    name: str
    suite: str
    variant: str
    epoch: int
    include: tuple[str, ...]
    remove: tuple[str, ...]
    env: dict[str, str]
    cmd: tuple[str, ...]

    @property
    def spec_hash(self) -> str:
        data = {
            "suite": self.suite,
            "variant": self.variant,
            "epoch": self.epoch,
            "include": list(self.include),
            "remove": list(self.remove),
            "env": self.env,
            "cmd": list(self.cmd),
        }
        return hashlib.sha256(oci.canonical_bytes(data)).hexdigest()

    def mmdebstrap_argv(self, out: Path, deb_sums: Path | None = None) -> list[str]:
        """The mmdebstrap command; with ``deb_sums``, also write ``sha256sum`` lines of every .deb installed.

        Keeping the essential .debs until the customize hook (``--skip=essential/unlink``) changes nothing
        in the tarball: the cleanup step removes the apt cache after the hooks (checked bit for bit).
        The image history records the command without ``deb_sums``, so the base digest does not depend on it.
        """
        hook = "rm -f " + " ".join(f'"$1{p}"' for p in self.remove)
        extra: list[str] = []
        if deb_sums is not None:
            if not _SAFE_PATH.match(str(deb_sums)):
                raise ValidationError("deb_sums", "must be an absolute path of [A-Za-z0-9._/-]", str(deb_sums))
            extra = [
                "--skip=essential/unlink",
                f'--customize-hook=cd "$1/var/cache/apt/archives" && sha256sum -- *.deb > "{deb_sums}"',
            ]
        return [
            "mmdebstrap",
            "--quiet",
            f"--variant={self.variant}",
            f"--include={','.join(self.include)}",
            f"--customize-hook={hook}",
            *extra,
            self.suite,
            str(out),
        ]


def load_specs(path: Path = SPEC_PATH) -> dict[str, BaseSpec]:
    raw = tomllib.loads(path.read_text())
    epoch = raw.get("source_date_epoch")
    if not isinstance(epoch, int) or epoch <= 0:
        raise ValidationError(f"{path}: source_date_epoch", "must be a positive integer (fixed, not the commit time)", epoch)
    remove = tuple(raw.get("remove", ()))
    for p in remove:
        if not _SAFE_PATH.match(p):
            raise ValidationError(f"{path}: remove", "entries must be absolute paths of [A-Za-z0-9._/-]", p)
    config = raw.get("config", {})
    specs: dict[str, BaseSpec] = {}
    for name, image in raw.get("images", {}).items():
        include = tuple(image.get("include", ()))
        for pkg in include:
            if not _PACKAGE.match(pkg):
                raise ValidationError(f"{path}: images.{name}.include", "must be Debian package names", pkg)
        if "repository" in image:
            raise ValidationError(f"{path}: images.{name}.repository", "image names are configuration "
                                  "(--image-prefix / $BENCHSEAL_IMAGE_PREFIX), not part of the spec", image["repository"])
        specs[name] = BaseSpec(
            name=name,
            suite=raw["suite"],
            variant=raw["variant"],
            epoch=epoch,
            include=include,
            remove=remove,
            env=dict(config.get("env", {})),
            cmd=tuple(config.get("cmd", ())),
        )
    return specs


def _tarball_cache() -> Path:
    return paths.state_dir("cache", "base")


_HASHED: dict[tuple[str, int, int, int], str] = {}


def tarball_sha256(tarball: Path) -> str:
    """sha256 of a cached rootfs tarball, hashed once per file version (a build asks up to five times)."""
    st = tarball.stat()
    key = (str(tarball.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(tarball)
    return _HASHED[key]


def rootfs_tarball(spec: BaseSpec) -> Path:
    """The mmdebstrap tarball for ``spec``: from the cache, else made now (with its .deb hashes beside it)."""
    out = _tarball_cache() / f"{spec.name}-{spec.spec_hash[:20]}.tar"
    if out.is_file():
        return out
    tmp = out.with_name(out.stem + ".partial.tar")
    debs = _run_mmdebstrap(spec, tmp)
    os.replace(tmp, out)
    _write_debs(out, debs)
    return out


def _debs_path(tarball: Path) -> Path:
    return tarball.with_name(tarball.stem + ".debs.json")


def _run_mmdebstrap(spec: BaseSpec, tmp: Path) -> dict[str, dict[str, str]]:
    """Run mmdebstrap into ``tmp``; return the .deb hashes it installed from (``deb_entries``)."""
    tmp.unlink(missing_ok=True)
    sums = tmp.absolute().with_name(tmp.stem + ".sha256sums")
    sums.unlink(missing_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(spec.epoch))
    try:
        proc = subprocess.run(spec.mmdebstrap_argv(tmp, deb_sums=sums), env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise InfrastructureError(f"cannot run mmdebstrap ({exc}); `make setup` installs it") from exc
    try:
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise InfrastructureError(f"mmdebstrap for base {spec.name!r} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        try:
            text = sums.read_text()
        except OSError as exc:
            raise InfrastructureError(f"mmdebstrap for base {spec.name!r} wrote no .deb hashes: {exc}") from exc
        return deb_entries(text)
    finally:
        sums.unlink(missing_ok=True)


_SUM_LINE = re.compile(r"\A(?P<sha>[0-9a-f]{64}) [ *](?P<file>[^/\s]+)_(?P<version>[^_/\s]+)_(?P<arch>[a-z0-9-]+)\.deb\Z")


def deb_entries(sha256sum_output: str) -> dict[str, dict[str, str]]:
    """``{"name:arch": {"version", "sha256"}}`` from ``sha256sum NAME_VERSION_ARCH.deb`` lines (apt's file names)."""
    debs: dict[str, dict[str, str]] = {}
    for number, line in enumerate(sha256sum_output.splitlines(), 1):
        m = _SUM_LINE.match(line)
        if not m:
            raise CheckFailed(f".deb hash list line {number}: not 'SHA256  NAME_VERSION_ARCH.deb': {line[:200]!r}")
        key = f"{m['file']}:{m['arch']}"
        if key in debs:
            raise CheckFailed(f".deb hash list: {key} appears twice")
        # apt escapes the epoch colon in file names
        debs[key] = {"version": m["version"].replace("%3a", ":"), "sha256": m["sha"]}
    if not debs:
        raise CheckFailed(".deb hash list is empty")
    return dict(sorted(debs.items()))


def _write_debs(tarball: Path, debs: dict[str, dict[str, str]]) -> None:
    atomic_write_json(_debs_path(tarball), {"rootfs_sha256": tarball_sha256(tarball), "debs": debs})


def deb_hashes(spec: BaseSpec, tarball: Path) -> dict[str, dict[str, str]] | None:
    """The .deb hashes ``tarball`` was built from, or None when they cannot be tied to it.

    A tarball cached before hashes were recorded is made again; the hashes are kept only
    if the new tarball is bit-identical (the mirror may have moved on since).
    """
    rootfs = tarball_sha256(tarball)
    try:
        data = json.loads(_debs_path(tarball).read_text())
        if data.get("rootfs_sha256") == rootfs:
            debs: dict[str, dict[str, str]] | None = data["debs"]
            return debs
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    again = tarball.with_name(tarball.stem + ".recheck.tar")
    try:
        debs = _run_mmdebstrap(spec, again)
        same = sha256_file(again) == rootfs
    finally:
        again.unlink(missing_ok=True)
    if not same:
        # remembered, so later builds do not run mmdebstrap again for a tarball that cannot be matched
        atomic_write_json(_debs_path(tarball), {"rootfs_sha256": rootfs, "debs": None,
                                                "reason": "a new mmdebstrap run gave another tarball (the mirror moved on)"})
        return None
    _write_debs(tarball, debs)
    return debs


def packages(tarball: Path) -> dict[str, str]:
    """``{package: version}`` of everything installed in the rootfs (its dpkg status file)."""
    with tarfile.open(tarball) as tar:
        member = next((m for m in ("./var/lib/dpkg/status", "var/lib/dpkg/status") if m in tar.getnames()), None)
        if member is None:
            raise CheckFailed(f"{tarball}: no var/lib/dpkg/status")
        handle = tar.extractfile(member)
        if handle is None:
            raise CheckFailed(f"{tarball}: dpkg status is not a file")
        text = handle.read().decode()
    result: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Status") == "install ok installed":
            arch = fields.get("Architecture", "all")
            key = fields["Package"] if arch in ("all", "amd64") else f"{fields['Package']}:{arch}"
            result[key] = fields["Version"]
    return dict(sorted(result.items()))


@dataclass(frozen=True)
class AssembledBase:
    manifest: bytes
    config: bytes
    layer: Layer

    @property
    def digest(self) -> str:
        return oci.sha256_digest(self.manifest)


def assemble(spec: BaseSpec, tarball: Path, store: BlobStore, use_cache: bool = True) -> AssembledBase:
    """One-layer OCI image of ``tarball``; the same tarball always gives the same manifest bytes."""
    cache = LayerCache(store, enabled=use_cache, compression="")
    key = "rootfs-" + tarball_sha256(tarball)
    layer = cache.get(key)
    if layer is None:
        layer = compress_tarball(tarball, store)
        cache.put(key, layer)
    created = oci.timestamp(spec.epoch)
    config = oci.canonical_bytes(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": {"Env": [f"{k}={v}" for k, v in sorted(spec.env.items())], "Cmd": list(spec.cmd)},
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
            "history": [{"created": created, "created_by": " ".join(spec.mmdebstrap_argv(Path("rootfs.tar"))[:-1])}],
        }
    )
    manifest = oci.manifest_bytes(config, [oci.layer_descriptor(layer)])
    store.put_bytes(config)
    store.put_bytes(manifest)
    return AssembledBase(manifest=manifest, config=config, layer=layer)


def push_assembled(registry: Registry, repository: str, image: AssembledBase, store: BlobStore) -> str:
    registry.push_file_blob(repository, image.layer.digest, store.path(image.layer.digest))
    config_digest = oci.sha256_digest(image.config)
    registry.push_blob(repository, config_digest, len(image.config), lambda: image.config)
    digest = registry.put_manifest(repository, image.digest, image.manifest)
    registry.put_manifest(repository, "latest", image.manifest)
    return digest


def ensure_base(target: ImageNames | str, rebuild: bool = False) -> dict[str, ImageRef]:
    """Every base image present by digest under its configured name; build what is missing.

    ``target``: the image names (pipeline.imaging.names), or a bare ``host:port`` (the
    ``--registry`` shorthand, ``host:port/benchseal/<base>``).
    Idempotent: when the lock names an image the registry serves with that
    digest (and the spec has not changed), nothing is built or pushed.
    """
    names = as_names(target)
    with build_lock():
        return _ensure_base(names, rebuild)


def _frozen_bases(names: ImageNames, rebuild: bool) -> dict[str, ImageRef]:
    """Every base from the committed lock, pinned by digest; nothing is built or written. Fails closed."""
    path = base_lock_path()
    if rebuild:
        raise UsageError(f"{FROZEN_ENV}=1: the committed lock {path} is never rebuilt here; refresh it (docs/build.md)")
    if not os.environ.get("BENCHSEAL_BASE_LOCK"):
        raise UsageError(f"{FROZEN_ENV}=1 needs BENCHSEAL_BASE_LOCK naming the committed base lock")
    if not path.is_file():
        raise CheckFailed(f"base lock {path} is missing: a frozen build never builds a base; "
                          "refresh and commit the lock (docs/build.md)")
    try:
        lock = read_base_lock(path)
    except ValueError as exc:
        raise CheckFailed(f"base lock {path} is not a valid base lock: {exc}") from None
    refs: dict[str, ImageRef] = {}
    lock_prefix: str | None = None
    for name, spec in load_specs().items():
        entry = lock.images.get(name)
        if entry is None:
            raise CheckFailed(f"base lock {path}: images.{name} is missing; refresh the lock (docs/build.md)")
        ref = ImageRef(entry.name, entry.digest)
        if entry.spec_hash != spec.spec_hash:
            raise CheckFailed(f"base lock {path}: images.{name}.spec_hash {entry.spec_hash!r} does not match "
                              f"images/base/spec.toml ({spec.spec_hash}); refresh the lock (docs/build.md)")
        # The lock is benchseal's (committed beside the reusable workflows), its bases published
        # under benchseal's own prefix: a release under another prefix takes them by digest from
        # there (push mounts or copies the blobs), so every base must share ONE prefix and be
        # named as a base, nothing else.
        prefix = lock_prefix if lock_prefix is not None else ref.name.removesuffix(name)
        lock_prefix = prefix
        if ref.name != prefix + name or ImageNames(prefix, "the base lock").name(name) != ref.name:
            raise CheckFailed(f"base lock {path}: images.{name}.name {ref.name!r} is not {prefix + name!r} "
                              f"(the lock's bases must share one prefix); refresh the lock (docs/build.md)")
        client = Registry(ref.registry)
        if not client.has_manifest(ref):
            raise CheckFailed(f"the registry does not serve the locked base {ref.ref}; push it (docs/build.md)")
        client.get_manifest(ref.repository, ref.digest)  # exactly these bytes: CheckFailed unless they hash to it
        refs[name] = ref
    return refs


def _ensure_base(names: ImageNames, rebuild: bool) -> dict[str, ImageRef]:
    if frozen():
        return _frozen_bases(names, rebuild)
    specs = load_specs()
    lock = dict(read_base_lock().images)
    reused: dict[str, ImageRef] = {}
    to_build: list[str] = []
    changed = False
    for name, spec in specs.items():
        entry = lock.get(name)
        if entry is not None and not rebuild and entry.spec_hash in (spec.spec_hash, None):
            ref = ImageRef(entry.name, entry.digest)
            # A lock entry without spec_hash names a base the user supplies: use it as is.
            if (ref.name == names.name(name) or entry.spec_hash is None) and Registry(ref.registry).has_manifest(ref):
                reused[name] = ref
                if entry.spec_hash and entry.debs is None:
                    with_debs = _add_debs(spec, entry)
                    if with_debs is not None:
                        lock[name] = with_debs
                        changed = True
                continue
        if paths.PROJECT_SOURCE == "package data" and not os.environ.get("BENCHSEAL_BASE_LOCK"):
            # The lock would be written inside the installed package.
            raise UsageError(
                f"base {name} must be built but the lock is the installed package's own ({base_lock_path()}): "
                "run benchseal --project-dir CHECKOUT ..., or set BENCHSEAL_BASE_LOCK"
            )
        to_build.append(name)
    # The bases are independent: each one's mmdebstrap (network and dpkg), gzip and push run side by side.
    built: dict[str, tuple[ImageRef, BaseImage]] = {}
    if to_build:
        with ThreadPoolExecutor(max_workers=len(to_build), thread_name_prefix="base") as pool:
            futures = {name: pool.submit(_build_base, names, name, specs[name]) for name in to_build}
            built = {name: future.result() for name, future in futures.items()}
    refs: dict[str, ImageRef] = {}
    for name in specs:
        if name in built:
            refs[name], lock[name] = built[name]
            changed = True
        elif name in reused:
            refs[name] = reused[name]
    if changed:
        dump_document(BaseLock(images=lock), base_lock_path())
    return refs


def _build_base(names: ImageNames, name: str, spec: BaseSpec) -> tuple[ImageRef, BaseImage]:
    """Make one base (its rootfs from the cache or mmdebstrap), push it; its reference and lock entry."""
    store = BlobStore()
    tarball = rootfs_tarball(spec)
    image = assemble(spec, tarball, store)
    digest = push_assembled(Registry(names.registry), names.repository(name), image, store)
    ref = ImageRef(names.name(name), digest)
    entry = BaseImage.model_validate({
        "name": ref.name,
        "digest": ref.digest,
        "ref": ref.ref,
        "spec_hash": spec.spec_hash,
        "suite": spec.suite,
        "variant": spec.variant,
        "epoch": spec.epoch,
        "include": list(spec.include),
        "rootfs_sha256": tarball_sha256(tarball),
        "layer": image.layer.to_json(),
        "packages": packages(tarball),
    })
    return ref, _add_debs(spec, entry) or entry


def _add_debs(spec: BaseSpec, entry: BaseImage) -> BaseImage | None:
    """``entry`` with the .deb hashes of its rootfs (SBOM hashes for Debian packages), when provable."""
    tarball = _tarball_cache() / f"{spec.name}-{spec.spec_hash[:20]}.tar"
    if not tarball.is_file() or tarball_sha256(tarball) != entry.rootfs_sha256:
        return None
    debs = deb_hashes(spec, tarball)
    if debs is None:
        return None
    return BaseImage.model_validate({**entry.to_json_dict(), "debs": debs})


def ensure_local(ref: ImageRef) -> None:
    """Pull ``ref`` by digest into the local engine; check RepoDigests lists exactly that ref.

    Harbor task Dockerfiles say ``FROM <name>@sha256:...``, which resolves
    locally only when the engine holds the image WITH that RepoDigest
    (``docker load`` would leave RepoDigests empty).
    """


    # The Docker SDK, so the Engine gets the same credentials as every other client (Docker config,
    # helpers, REGISTRY_AUTH_FILE) in the X-Registry-Auth header; never in argv.
    auth_config = docker_auth_config(ref.registry, ref.repository)
    try:
        client = docker.from_env(timeout=600)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(f"Docker Engine unavailable: {exc}") from None
    try:
        client.api.pull(ref.name, tag=ref.digest, auth_config=auth_config)
        image = client.images.get(ref.ref)
    except docker.errors.ImageNotFound:
        raise CheckFailed(f"{ref.ref} is not in the local engine after pull") from None
    except docker.errors.APIError as exc:
        raise InfrastructureError(f"docker pull {ref.ref} failed: {exc.explanation or exc}") from None
    finally:
        client.close()
    require_repo_digest(ref, image.attrs.get("RepoDigests") or [])
