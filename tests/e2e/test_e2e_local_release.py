"""``benchseal release vX.Y.Z --local`` (what ``make demo`` runs), twice: the second run reuses the images;
and ``--project examples/hello-agent/benchseal.toml`` (the default ``make demo``): the example released as
its own repository, ``benchseal-examples/hello-agent``.

Who signs (issue 25, the adopter path): the local builder ``local/benchseal@refs/heads/main``'s release.yml
the images (for the source at the tag and its commit), its benchmark.yml the evidence (for the local infra
repository ``local/bench-infra`` on main); the body's commands pin the builder and the source separately.

State is a fresh BENCHSEAL_HOME that shares only the build caches and tools of the
default one (so the images are warm, as after ``make setup``), never its queue,
Sigstore instance or releases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.errors import CheckFailed
from pipeline.publish.body import END, START

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
TAG = "v0.0.1-e2e"
BUILDER, INFRA = "local/benchseal@refs/heads/main", "local/bench-infra"
SEAL_IDENTITY = "https://github.com/local/benchseal/.github/workflows/benchmark.yml@refs/heads/main"
IMAGE_IDENTITY = "https://github.com/local/benchseal/.github/workflows/release.yml@refs/heads/main"


@pytest.fixture(scope="module")
def local_home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    from pipeline.core import paths
    from pipeline.local import sigstore as sigstore_local

    home = tmp_path_factory.mktemp("release-home")
    for shared in ("cache", "tools"):
        if (paths.home() / shared).is_dir():
            (home / shared).symlink_to(paths.home() / shared, target_is_directory=True)
    yield home
    sigstore_local.stop(home / "sigstore")  # the instance `release` started there, by its pid


def _release(home: Path, dist: Path, *extra: str, tag: str = TAG) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    return subprocess.run([BENCHSEAL, "release", tag, "--local", "--dist", str(dist), *extra],
                          capture_output=True, text=True, env=env, check=False, timeout=900)


def test_release_local_twice(local_home: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    first = _release(local_home, dist, "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    report: dict[str, Any] = json.loads(first.stdout)
    release = dist / TAG
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    assert report["counts"] == {"total": 3, "completed": 3, "resolved": 3, "unresolved": 0, "infra_errors": 0}
    assert report["release_dir"] == str(release)
    sums = (release / "SHA256SUMS").read_text().splitlines()
    listed = {line.split("  ", 1)[1] for line in sums}
    assert {p.name for p in release.iterdir()} == listed | {"body.md", "SHA256SUMS", "SHA256SUMS.sigstore.json"}
    body = (release / "body.md").read_text()
    assert body.count(START) == 1 and body.count(END) == 1 and report["run_id"] in body
    for role in ("runner", "api"):
        assert report["images"][role] in body
    assert any("cosign verify-blob" in c for c in report["verified"]["cosign_commands"])
    # The body's image lines ran too: signature and both attestations of each image, commit pinned.
    image_lines = [c for c in report["verified"]["cosign_commands"] if " --certificate-github-workflow-sha " in c]
    assert len(image_lines) == 6 and sum(" verify-attestation --type " in c for c in image_lines) == 4
    assert body.count("--certificate-github-workflow-sha") == 6
    assert set(report["stages"]) >= {"build", "push", "dispatch", "worker", "evidence", "signing", "publication",
                                     "verification"}

    # Nothing changed: same digests, nothing pushed, a new benchmark run, the same release dir updated.
    second = _release(local_home, dist)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((local_home / "release" / "last-digests.json").read_text())
    assert again == report["images"], "the images changed although nothing did (is the working tree moving?)"
    assert "SUCCEEDED" in second.stdout and "reused" in second.stdout
    body2 = (release / "body.md").read_text()
    assert body2.count(START) == 1 and report["run_id"] not in body2  # the second run's section replaced it

    from pipeline.verify.release import verify_release

    # The consumer states the release: build's source repository (no GITHUB_REPOSITORY here) and the tag,
    # and who sealed it: the local builder, for the local infra repository.
    source_repo = os.environ.get("GITHUB_REPOSITORY") or "local/benchseal"
    root = local_home / "sigstore" / "trusted_root.json"
    # Signed exactly as production would be (GitHub Actions identities), under the local root only.
    done = verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository=INFRA,
                          builder=BUILDER, trusted_root=root, offline=True)
    assert (done.repository, done.tag, done.commit) == (source_repo, TAG, report["source"]["commit"])
    assert (done.identity, done.workflow_repository, done.workflow_ref) == (SEAL_IDENTITY, INFRA, "refs/heads/main")
    assert done.issuer == "https://token.actions.githubusercontent.com"
    with pytest.raises(CheckFailed):  # the private instance's plain identity is not what signed it
        verify_release(release, repository=source_repo, tag=TAG, profile="local", trusted_root=root, offline=True)
    image_checks = report["verified"]["images"]
    assert len(image_checks) == 2 and all(f"slsaprovenance1 and cyclonedx by {IMAGE_IDENTITY} at commit "
                                          f"{report['source']['commit']}" in c and "refused" in c
                                          for c in image_checks)
    assert report["verified"]["repository"] == source_repo and report["verified"]["tag"] == TAG
    assert (report["verified"]["builder"], report["verified"]["infra_repository"]) == (BUILDER, INFRA)
    assert f"verify . --repo {source_repo} --tag {TAG} --infra-repo {INFRA} --builder {BUILDER}" in body2
    for infra, builder in (("other/infra", BUILDER), (INFRA, "local/benchseal@refs/heads/other"),
                           (source_repo, BUILDER)):
        with pytest.raises(CheckFailed):  # sealed for another infra repository, or by another builder: refused
            verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository=infra,
                           builder=builder, trusted_root=root, offline=True)


def test_release_local_of_the_example_as_its_own_repository(local_home: Path, tmp_path: Path) -> None:
    """``make demo``: the example's directory released as benchseal-examples/hello-agent, its own repository
    at its own commit, the agent scored against the scripted model; every printed command ran."""
    from pipeline.core.paths import REPO_ROOT
    from pipeline.verify.release import verify_release

    dist = tmp_path / "dist"
    done = _release(local_home, dist, "--project", str(REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"),
                    "--scripted-model", "right", "--json", tag="v0.1.0")
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED" and report["score"] == 1.0
    checkout = local_home / "sources" / "hello-agent"
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "refs/tags/v0.1.0"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert report["source"] == {"repository": "benchseal-examples/hello-agent", "tag": "v0.1.0", "commit": commit}
    assert commit != subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
    release = dist / "v0.1.0"
    summary = json.loads((release / "summary.json").read_text())
    assert summary["agent"]["release"]["source_commit"] == commit
    body = (release / "body.md").read_text()
    assert (f"benchseal verify . --repo benchseal-examples/hello-agent --tag v0.1.0 --infra-repo {INFRA} "
            f"--builder {BUILDER} ") in body
    assert body.count(f"--certificate-identity {SEAL_IDENTITY} ") == 7
    assert body.count(f"--certificate-github-workflow-repository {INFRA} --certificate-github-workflow-ref "
                      "refs/heads/main") == 7
    assert body.count(f"--certificate-identity {IMAGE_IDENTITY} ") == 6
    assert body.count("--certificate-github-workflow-repository benchseal-examples/hello-agent "
                      f"--certificate-github-workflow-ref refs/tags/v0.1.0 --certificate-github-workflow-sha {commit}") == 6
    assert len(report["verified"]["cosign_commands"]) == 15  # sha256sum, 7 blob checks, benchseal verify, 6 image checks
    verified = verify_release(release, repository="benchseal-examples/hello-agent", tag="v0.1.0", profile="production",
                              infra_repository=INFRA, builder=BUILDER, offline=True,
                              trusted_root=local_home / "sigstore" / "trusted_root.json")
    assert verified.commit == commit
