"""An installed benchseal works outside the checkout.

The wheel is built from a copy of the source (what a clean checkout holds),
installed into a fresh venv in a temp directory, and run from another temp
directory. Dependencies come from the project's venv through a .pth line (a
plain path entry: the project's editable benchseal is NOT activated by it), so
`import pipeline` can only find the installed wheel. The venv's site-packages
is seeded with decoy images/, policies/ and suites/ directories: the installed
package must never read its parent directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.core import paths

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "pipeline", "images", "policies", "suites", "deploy", "package.json",
           "package-lock.json")


@dataclass(frozen=True)
class Installed:
    venv: Path
    workdir: Path
    state: Path

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        full = {**base, "XDG_STATE_HOME": str(self.state), "HOME": str(self.workdir), **(env or {})}
        return subprocess.run([str(self.venv / "bin" / "benchseal"), *args], cwd=self.workdir, env=full,
                              capture_output=True, text=True, timeout=timeout, check=False)


def _source_copy(dest: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        if rel.split("/", 1)[0] not in SHIPPED or not (REPO / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    src = _source_copy(root / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(root / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (root / "dist").glob("benchseal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("pipeline/_project/policies/infra.yaml", "pipeline/_project/policies/verify.yaml",
                   "pipeline/_project/policies/payload.schema.json", "pipeline/_project/images/runner/image.toml",
                   "pipeline/_project/images/base/spec.toml", "pipeline/_project/package-lock.json",
                   "pipeline/verify/sigstore_js_verify.js"):
        assert needed in names, f"{needed} not in the wheel"
    assert not any(n.startswith(("images/", "policies/", "suites/")) for n in names)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_benchseal_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Decoys beside the installed package: reading them would be the bug this test exists for.
    for name in ("images", "policies", "suites"):
        (site / name).mkdir()
    (site / "policies" / "infra.yaml").write_text("decoy: [this is not the policy\n")
    (site / "policies" / "verify.yaml").write_text("decoy: [this is not the policy\n")
    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(venv, workdir, root / "state")


def test_installed_package_reads_its_own_data(installed: Installed) -> None:
    probe = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import pipeline, pipeline.core.paths as p; print(pipeline.__file__); print(p.REPO_ROOT); print(p.PROJECT_SOURCE); print(p.home())"],
        cwd=installed.workdir, capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_") and k != "PYTHONPATH"}
        | {"XDG_STATE_HOME": str(installed.state)},
    )
    module, root, source, home = probe.stdout.splitlines()
    assert module.startswith(str(installed.venv)), module
    assert root.endswith("pipeline/_project") and root.startswith(str(installed.venv)) and source == "package data"
    assert home == str(installed.state / "benchseal")  # state never inside site-packages
    assert installed.run("--version").stdout.strip() == "benchseal 0.1.0"


def test_a_plain_install_imports_every_module_and_ships_no_test_double(installed: Installed) -> None:
    """Every module of the installed package imports (no test extra needed); the GitHub emulator,
    the PostgreSQL cluster and the queue load live in tests/doubles, outside the product."""
    probe = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import importlib, pkgutil, pipeline\n"
         "names = [m.name for m in pkgutil.walk_packages(pipeline.__path__, 'pipeline.') if not m.name.endswith('__main__')]\n"
         "for name in names: importlib.import_module(name)\n"
         "print(len(names)); print('\\n'.join(names))"],
        cwd=installed.workdir, capture_output=True, text=True, check=False, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_") and k != "PYTHONPATH"}
        | {"XDG_STATE_HOME": str(installed.state)},
    )
    assert probe.returncode == 0, probe.stderr
    count, *names = probe.stdout.splitlines()
    assert int(count) > 80 and "pipeline.cli.main" in names and "pipeline.infra.worker.loop" in names
    assert not any(".testing" in n or "emulator" in n or "doubles" in n for n in names), names


def test_installed_infra_validate_uses_the_bundled_policy(installed: Installed, tmp_path: Path, make_payload) -> None:  # type: ignore[no-untyped-def]
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(make_payload()))
    done = installed.run("infra", "validate", "--payload", str(payload))
    reference = subprocess.run([sys.executable, "-m", "pipeline", "infra", "validate", "--payload", str(payload)],
                               cwd=REPO, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (reference.returncode, reference.stdout) and done.returncode == 0, done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(make_payload(suite="../../etc")))
    refused = installed.run("infra", "validate", "--payload", str(bad))
    assert refused.returncode == 2 and "suite" in refused.stderr, refused.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_installed_verify_accepts_a_signed_release(installed: Installed, signed_release: Path, sigstore_instance: object) -> None:
    done = installed.run("verify", str(signed_release), "--repo", "acme/widget", "--tag", "v9.9.9",
                         "--trusted-root", str(sigstore_instance.trusted_root))  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stdout + done.stderr


def test_installed_project_dir_must_hold_the_data(installed: Installed, tmp_path: Path) -> None:
    done = installed.run("--project-dir", str(tmp_path), "infra", "validate", "--payload", "x.json")
    assert done.returncode == 2 and "--project-dir" in done.stderr and "images/" in done.stderr, done.stderr
    env_done = installed.run("registry", "status", env={"BENCHSEAL_PROJECT_DIR": str(tmp_path / "absent")})
    assert env_done.returncode == 2 and "BENCHSEAL_PROJECT_DIR" in env_done.stderr


def test_installed_build_needs_a_checkout(installed: Installed) -> None:
    done = installed.run("build", "--registry", "127.0.0.1:5055", "--image", "api")
    assert done.returncode == 2 and "--project-dir" in done.stderr, done.stderr


def test_installed_base_build_never_writes_into_the_package(installed: Installed, tmp_path: Path) -> None:
    # A scratch registry that has no base: a base would have to be built and the lock written.
    done = installed.run("base", "build", "--registry", "127.0.0.1:9")
    assert done.returncode == 2 and "BENCHSEAL_BASE_LOCK" in done.stderr, done.stdout + done.stderr
    bundled = next(installed.venv.glob("lib/python*/site-packages/pipeline/_project/images"))
    assert not (bundled / "base.lock.json.tmp").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_installed_build_with_project_dir_matches_the_checkout(installed: Installed, image_registry: str, tmp_path: Path) -> None:
    out = tmp_path / "digests.json"
    done = installed.run("--project-dir", str(paths.REPO_ROOT), "build", "--registry", image_registry, "--image", "api", "--out", str(out),
                         timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    reference_out = tmp_path / "reference.json"
    reference = subprocess.run([sys.executable, "-m", "pipeline", "build", "--registry", image_registry, "--image", "api",
                                "--out", str(reference_out)], cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    assert reference.returncode == 0, reference.stderr[-3000:]
    installed_entry = json.loads(out.read_text())["images"]["api"]
    assert installed_entry == json.loads(reference_out.read_text())["images"]["api"]


def test_installed_node_helpers_need_an_explicit_node_modules(installed: Installed, tmp_path: Path) -> None:
    # Package data has no node_modules beside the scripts: a clear usage error, before node runs.
    done = installed.run("sigstore", "start", "--state", str(tmp_path / "sig"))
    assert done.returncode == 2 and "BENCHSEAL_NODE_MODULES" in done.stderr and "npm ci" in done.stderr, done.stderr
    absent = installed.run("sigstore", "start", "--state", str(tmp_path / "sig"),
                           env={"BENCHSEAL_NODE_MODULES": str(tmp_path / "absent")})
    assert absent.returncode == 2 and "BENCHSEAL_NODE_MODULES must name an existing" in absent.stderr, absent.stderr
    incomplete = tmp_path / "node_modules"
    incomplete.mkdir()
    partial = installed.run("sigstore", "start", "--state", str(tmp_path / "sig"),
                            env={"BENCHSEAL_NODE_MODULES": str(incomplete)})
    assert partial.returncode == 2 and "@sigstore/mock" in partial.stderr, partial.stderr
    assert not (tmp_path / "sig" / "server.pid").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_installed_node_helpers_run_from_site_packages(installed: Installed, tmp_path: Path) -> None:
    # The scripts run from the venv; their packages come only through the setting (NODE_PATH).
    state = tmp_path / "sig"
    env = {"BENCHSEAL_NODE_MODULES": str(REPO / "node_modules")}
    done = installed.run("sigstore", "start", "--state", str(state), env=env, timeout=120)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert (state / "trusted_root.json").is_file()
    finally:
        installed.run("sigstore", "stop", "--state", str(state), env=env, timeout=60)


@pytest.mark.docker
@pytest.mark.slow
def test_installed_release_local(installed: Installed, image_registry: str, tmp_path: Path) -> None:
    """``release --local`` from the wheel's venv, outside the checkout, against the checkout as project dir.

    Its own state dir (queue, Sigstore instance, release work) shares only the build caches
    and cosign with the checkout's, so no base or wheel is fetched again.
    """
    home = tmp_path / "home"
    home.mkdir()
    for shared in ("cache", "tools"):
        if (paths.home() / shared).is_dir():
            (home / shared).symlink_to(paths.home() / shared, target_is_directory=True)
    dist = tmp_path / "dist"
    env = {"BENCHSEAL_HOME": str(home), "BENCHSEAL_REGISTRY": image_registry, "NO_PROXY": "127.0.0.1,localhost",
           "HARBOR_TELEMETRY": "0"}
    try:
        done = installed.run("--project-dir", str(paths.REPO_ROOT), "release", "v0.0.1-wheel", "--local", "--json",
                             "--dist", str(dist), env=env, timeout=1800)
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(done.stdout)
        assert report["status"] == "SUCCEEDED" and report["verified"]["benchseal_verify"] is True
        assert report["images"]["runner"].startswith(f"{image_registry}/benchseal/runner@sha256:")
        assert (dist / "v0.0.1-wheel" / "SHA256SUMS").is_file()
        # The Sigstore server ran from the venv's copy of server.js, with the checkout's node_modules.
        instance = json.loads((home / "sigstore" / "instance.json").read_text())
        assert instance["url"].startswith("http://127.0.0.1:")
    finally:
        installed.run("--project-dir", str(paths.REPO_ROOT), "sigstore", "stop", env=env, timeout=60)
