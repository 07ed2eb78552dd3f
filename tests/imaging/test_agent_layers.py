"""The release's agent as runner layers: deterministic, and confined to /opt/benchseal/agent.

A hostile Python wheel (a top-level ``pipeline`` and ``harbor`` package, a console script named
``benchseal``, a data file for /usr/local/bin, a .pth file) lands entirely under the agent's own
directory, which the runner only appends to sys.path: nothing of benchseal, Harbor or /usr/local
is replaced, and no code of it runs at interpreter start.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from pipeline.agent.resolve import ResolvedAgent
from pipeline.core.contracts import AgentArtifact, sri_of
from pipeline.core.project import AGENT_MANIFEST_PATH, AGENT_PYTHON_DIR, PythonAgent
from pipeline.imaging.agentlayers import agent_layers
from pipeline.imaging.layers import BlobStore, LayerCache

DIST = "hostile_agent-1.0.0.dist-info"
FILES = {
    "hostile_agent/__init__.py": b"",
    "hostile_agent/agent.py": b"class Agent:\n    pass\n",
    "pipeline/__init__.py": b"raise SystemExit('the agent replaced benchseal')\n",
    "harbor/__init__.py": b"raise SystemExit('the agent replaced harbor')\n",
    "zz_hostile.pth": b"import os; os.system('touch /tmp/pwned')\n",
    "hostile_agent-1.0.0.data/scripts/benchseal": b"#!/bin/sh\necho replaced\n",
    "hostile_agent-1.0.0.data/data/bin/docker": b"#!/bin/sh\necho replaced\n",
    f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: hostile-agent\nVersion: 1.0.0\n",
    f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}


def _wheel(tmp: Path) -> Path:
    path = tmp / "hostile_agent-1.0.0-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in FILES.items():
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        archive.writestr(f"{DIST}/RECORD", "\n".join([*records, f"{DIST}/RECORD,,"]) + "\n")
    return path


def _agent(tmp: Path) -> ResolvedAgent:
    wheel = _wheel(tmp)
    artifact = AgentArtifact(name="hostile", kind="python", package="hostile-agent", version="1.0.0",
                             integrity=sri_of("sha256", hashlib.sha256(wheel.read_bytes()).digest()),
                             source_commit="a" * 40)
    spec = PythonAgent(name="hostile", kind="python", import_path="hostile_agent.agent:Agent")
    return ResolvedAgent(spec=spec, artifact=artifact, file=wheel)


def _names(store: BlobStore, digest: str) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(store.path(digest).read_bytes()))) as tar:
        return [m.name for m in tar.getmembers() if not m.isdir()]


def test_a_python_agent_stays_in_its_own_directory(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    built: list[str] = []
    ((layer, comment),) = agent_layers(_agent(tmp_path), deps_epoch=0, epoch=1, store=store,
                                       cache=LayerCache(store, root=tmp_path / "layers"), built=built)
    names = _names(store, layer.digest)
    assert AGENT_MANIFEST_PATH.lstrip("/") in names and "hostile-agent==1.0.0" in comment
    outside = [n for n in names if not n.startswith(AGENT_PYTHON_DIR.lstrip("/") + "/")
               and n != AGENT_MANIFEST_PATH.lstrip("/")]
    assert outside == [], outside
    assert f"{AGENT_PYTHON_DIR.lstrip('/')}/pipeline/__init__.py" in names  # confined, not refused: it is inert there


def test_the_layer_is_bit_identical_on_rebuild(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    digests = []
    for attempt in ("one", "two"):
        store = BlobStore(tmp_path / attempt / "blobs")
        ((layer, _),) = agent_layers(agent, deps_epoch=0, epoch=1, store=store,
                                     cache=LayerCache(store, root=tmp_path / attempt / "layers"), built=[])
        digests.append(layer.digest)
    assert digests[0] == digests[1]


def test_appended_to_sys_path_the_agent_shadows_nothing(tmp_path: Path) -> None:
    # What the runner does (pipeline.runner.agent_check): the agent's directory goes LAST on sys.path.
    store = BlobStore(tmp_path / "blobs")
    ((layer, _),) = agent_layers(_agent(tmp_path), deps_epoch=0, epoch=1, store=store,
                                 cache=LayerCache(store, root=tmp_path / "layers"), built=[])
    root = tmp_path / "image"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(store.path(layer.digest).read_bytes()))) as tar:
        tar.extractall(root, filter="data")
    agent_dir = root / AGENT_PYTHON_DIR.lstrip("/")
    script = (f"import sys; sys.path.append({str(agent_dir)!r}); import pipeline, harbor, hostile_agent.agent; "
              "print(pipeline.__file__); print(harbor.__file__)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert str(agent_dir) not in done.stdout


def test_a_runner_with_an_agent_has_its_own_commit_tag(tmp_path: Path) -> None:
    from pipeline.core.contracts import SourceInfo
    from pipeline.imaging.images import default_tags

    source = SourceInfo(commit="ab" * 20, ref="refs/heads/main", repository="local/benchseal")
    agent = _agent(tmp_path)
    assert default_tags(source) == ("git-abababababab",)
    # Tags are metadata, but one tag names one manifest: the plain runner's is not re-pointed.
    assert default_tags(source, (), agent) == ("git-abababababab-hostile-1.0.0",)
    other = ResolvedAgent(spec=agent.spec, artifact=agent.artifact.model_copy(update={"version": "1.0.0+local.1"}),
                          file=agent.file)
    assert default_tags(source, (), other) == ("git-abababababab-hostile-1.0.0_local.1",)
