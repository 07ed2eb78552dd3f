"""A release's npm agent through the whole local chain, with tiny npm packages published to a real
npm registry (verdaccio) in a temp dir:

* an honest CLI: its files reach the task containers read-only (the task images have no Node of
  their own) and it runs there with the baked Node; with no model it solves nothing: scored 0;
* a CLI that reports another version than the release's: the run FAILS before any trial,
  unscored, with the reason on one line (the runner's version probe), and is still published.

State: a fresh BENCHSEAL_HOME sharing only the build caches and tools; a copy of the shipped
infra policy that admits the two packages, each for its own repository benchseal-examples/<dir>.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.paths import REPO_ROOT
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
# The CLI writes where it ran and with which Node into the agent's log dir (mounted from the trial dir).
HONEST_CLI = """\
const fs = require('fs');
if (process.argv[2] === '--version') { console.log('v' + require('./package.json').version); process.exit(0); }
let writable = true;
try { fs.writeFileSync(__dirname + '/tamper', 'x'); } catch (e) { writable = false; }
console.log(JSON.stringify({node: process.version, dir: __dirname, writable: writable,
                            instruction: process.argv[3].slice(0, 40), key: process.env.OPENAI_API_KEY || null}));
"""
LIAR_CLI = "console.log('0.9.9');\n"


def _package(root: Path, name: str, version: str, cli: str) -> Path:
    source = root / name.replace("/", "_")
    source.mkdir(parents=True)
    (source / "package.json").write_text(json.dumps({"name": name, "version": version, "bin": {"x": "cli.js"},
                                                     "license": "MIT"}))
    (source / "cli.js").write_text(cli)
    tarball, _ = npm_pack(source, root / "packed")
    return tarball


def _project(root: Path, agent: str, package: str) -> Path:
    path = root / agent / "benchseal.toml"
    path.parent.mkdir(parents=True)
    path.write_text(f'schema = "benchseal.project/v1"\n[agent]\nname = "{agent}"\nkind = "npm"\n'
                    f'package = "{package}"\nbin = "cli.js"\nargs = ["run", "{{instruction}}"]\n'
                    'publish_wait_seconds = 5\n[agent.env]\nOPENAI_API_KEY = "{model_key}"\n')
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[dict[str, Path | str]]:
    from pipeline.core import paths
    from pipeline.local import sigstore as sigstore_local

    root = tmp_path_factory.mktemp("npm-agent-checks")
    home = root / "home"
    home.mkdir()
    for shared in ("cache", "tools"):
        if (paths.home() / shared).is_dir():
            (home / shared).symlink_to(paths.home() / shared, target_is_directory=True)
    # Each project, in no git checkout, is released as its own repository benchseal-examples/<dir>
    # (pipeline/local/sources.py), signed by the local builder like the shipped examples.
    policy = (REPO_ROOT / "policies" / "infra.yaml").read_text(encoding="utf-8")
    agents = (("honest-cli", "@acme/honest-cli"), ("liar-cli", "@acme/liar-cli"))
    sources = "".join(f"  - repository: benchseal-examples/{name}\n    signer: *local-builder\n    images: *local-images\n"
                      for name, _ in agents)
    extra = "".join(f"  - name: {name}\n    kind: npm\n    package: \"{package}\"\n"
                    f"    repositories: [benchseal-examples/{name}]\n" for name, package in agents)
    assert "\n# Agents admitted" in policy and "agents:\n" in policy
    policy = policy.replace("\n# Agents admitted", sources + "\n# Agents admitted", 1)
    (root / "infra.yaml").write_text(policy.replace("agents:\n", "agents:\n" + extra, 1), encoding="utf-8")
    with LocalNpmRegistry(root / "npm") as registry:
        registry.publish(_package(root / "src", "@acme/honest-cli", "1.0.0", HONEST_CLI))
        registry.publish(_package(root / "src", "@acme/liar-cli", "1.0.0", LIAR_CLI))
        yield {"home": home, "root": root, "policy": root / "infra.yaml", "registry": registry.url,
               "honest": _project(root, "honest-cli", "@acme/honest-cli"),
               "liar": _project(root, "liar-cli", "@acme/liar-cli")}
        sigstore_local.stop(home / "sigstore")


def _release(world: dict[str, Path | str], project: str, dist: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENCHSEAL_HOME": str(world["home"]), "HARBOR_TELEMETRY": "0",
           "BENCHSEAL_NPM_REGISTRY": str(world["registry"])}
    return subprocess.run([BENCHSEAL, "release", "v1.0.0", "--local", "--project", str(world[project]), "--policy",
                           str(world["policy"]), "--dist", str(dist), "--json"],
                          capture_output=True, text=True, env=env, check=False, timeout=900)


def test_an_honest_npm_cli_runs_in_the_task_containers_read_only(world: dict[str, Path | str], tmp_path: Path) -> None:
    done = _release(world, "honest", tmp_path / "dist")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED" and report["score"] == 0.0, report
    assert report["counts"]["unresolved"] == 3 and report["counts"]["infra_errors"] == 0
    summary = json.loads((tmp_path / "dist" / "v1.0.0" / "summary.json").read_text())
    release = summary["agent"]["release"]
    assert release["package"] == "@acme/honest-cli" and release["version"] == "1.0.0" and release["kind"] == "npm"
    runs = Path(str(world["home"])) / "infra" / "runs" / report["run_id"]
    outputs = sorted(runs.glob("harbor/*/agent/cli-output.txt"))
    assert len(outputs) == 4  # the three scored tasks and the tamper canary
    for output in outputs:
        seen = json.loads(output.read_text().splitlines()[-1])
        # The baked Node ran the package at the manifest's path inside the task container, which
        # could not write there, and held the placeholder, never a key.
        assert seen["node"] == "v24.19.0" and seen["dir"] == "/opt/benchseal/agent/node_modules/@acme/honest-cli"
        assert seen["writable"] is False and seen["key"] == "benchseal-placeholder-key"
        assert seen["instruction"]


def test_a_cli_reporting_another_version_fails_the_run_unscored(world: dict[str, Path | str], tmp_path: Path) -> None:
    done = _release(world, "liar", tmp_path / "dist")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "FAILED" and report["score"] is None
    summary = json.loads((tmp_path / "dist" / "v1.0.0" / "summary.json").read_text())
    assert summary["score"] is None
    reason = summary["reason"]
    assert "liar-cli reports version '0.9.9'; the release is 1.0.0" in reason and "\n" not in reason
    runs = Path(str(world["home"])) / "infra" / "runs" / report["run_id"]
    assert not list(runs.glob("harbor/*/result.json")), "no trial may run"
