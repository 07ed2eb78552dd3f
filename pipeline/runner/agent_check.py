"""Before any trial: the runner carries exactly the release's agent, and that agent reports the release's version.

The payload's artifact (``--expect-agent``, what the build resolved and infra admitted) must equal
the manifest baked into this image (``AGENT_MANIFEST_PATH``), field for field. Then the agent is
asked for its version: an npm CLI runs its ``version_args`` with the baked Node (no network, a
throwaway HOME); a Python agent is the adopter's code and is never imported here: in a container of
the runner image (``--agent-image``; nothing bound, network none) ``pipeline.runner.agent_host probe``
reads its distribution's version and imports its class (``agent_box.probe_in_box``). Any
difference is a ValidationError (``trial run`` exits 2): the run fails, unscored, with this line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline.core.contracts import AgentArtifact
from pipeline.core.errors import ValidationError
from pipeline.core.project import AGENT_ROOT, AgentManifest, NpmAgent, read_manifest_file
from pipeline.runner.envshared import set_agent_mount

AGENT_COPY = "agent"  # in the batch's out dir: the files task containers get read-only
VERSION_PROBE_SECONDS = 60
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def describe(artifact: AgentArtifact) -> str:
    return (f"{artifact.name} ({artifact.kind} {artifact.package}@{artifact.version}, {artifact.integrity[:19]}…, "
            f"commit {artifact.source_commit[:12]})")


def release_agent(agent: str, expect: AgentArtifact | None, manifest_path: Path,
                  agent_image: str | None = None) -> AgentManifest | None:
    """The release's agent to run (checked), or None for another agent (oracle, nop, terminus-2)."""
    manifest = read_manifest_file(manifest_path)
    if manifest is None or manifest.artifact.name != agent:
        if expect is not None:
            carried = describe(manifest.artifact) if manifest is not None else "no agent"
            raise ValidationError("--expect-agent", f"the payload names {describe(expect)}; this runner image "
                                  f"carries {carried}")
        return None
    if expect is None:
        raise ValidationError("--expect-agent", f"is required to run the release's agent {agent} "
                              "(the payload's agent_artifact)")
    if manifest.artifact != expect:
        raise ValidationError("--expect-agent", f"the payload names {describe(expect)}; this runner image carries "
                              f"{describe(manifest.artifact)}")
    reported = probe_version(manifest, agent_image)
    if reported != expect.version:
        raise ValidationError("agent version", f"{agent} reports version {reported!r}; the release is "
                              f"{expect.version}", reported)
    return manifest


def probe_version(manifest: AgentManifest, agent_image: str | None = None) -> str:
    """The version the agent itself reports (see the module docstring); a Python agent's in ``agent_image``."""
    spec = manifest.spec
    if isinstance(spec, NpmAgent):
        if manifest.node is None or manifest.package_dir is None:
            raise ValidationError("agent manifest", "an npm agent needs its node runtime and package_dir")
        argv = [manifest.node.path, f"{manifest.package_dir}/{spec.bin}", *spec.version_args]
        with tempfile.TemporaryDirectory(prefix="benchseal-probe-") as home:
            env = {"PATH": os.path.dirname(manifest.node.path) + ":/usr/bin:/bin", "HOME": home, "NO_COLOR": "1",
                   "CI": "1"}
            try:
                done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=home, check=False,
                                      timeout=VERSION_PROBE_SECONDS, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ValidationError("agent version", f"{spec.name} {' '.join(spec.version_args)} did not run: "
                                      f"{exc}") from None
        lines = [_ANSI.sub("", line).strip() for line in done.stdout.splitlines() if line.strip()]
        if done.returncode != 0 or not lines:
            raise ValidationError("agent version", f"{spec.name} {' '.join(spec.version_args)} exited "
                                  f"{done.returncode} without printing a version")
        return lines[-1].removeprefix("v")
    if agent_image is None:
        raise ValidationError("--agent-image", "is required to run a Python release agent (it runs in a container "
                              "of the runner image, never in the runner)")
    from pipeline.runner.agent_box import probe_in_box  # lazy: the Docker SDK, only for a Python agent

    answer = probe_in_box(agent_image, manifest.artifact.package, spec.import_path)
    if "missing" in answer:
        raise ValidationError("agent version", f"distribution {manifest.artifact.package} is not installed in "
                              "this runner image")
    if "import_error" in answer:
        raise ValidationError("agent import_path", f"{spec.import_path} cannot be imported: {answer['import_error']}")
    installed = answer.get("version")
    if installed is None:
        raise ValidationError("agent version", f"probing {spec.import_path} gave no version")
    if _same_python_version(installed, manifest.artifact.version):
        installed = manifest.artifact.version  # PEP 440 spells 1.0.0-rc1 as 1.0.0rc1: the same version
    return installed


def _same_python_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version  # lazy: packaging costs 6 ms; only Python agents use it
    except ImportError:
        return a == b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def mount_agent_files(source: Path, dest: Path) -> None:
    """Copy the baked agent (Node + package) beside the trials and hand it to task containers read-only.

    The engine binds only paths under the run dir, so task containers get this copy, mounted
    read-only at ``AGENT_ROOT``, the path the manifest names.
    """
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True)
    set_agent_mount(dest, AGENT_ROOT)
