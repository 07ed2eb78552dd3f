"""``benchseal release vX.Y.Z --local`` (what ``make demo`` runs), twice: the second run reuses the images.

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


def _release(home: Path, dist: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0")
    return subprocess.run([BENCHSEAL, "release", TAG, "--local", "--dist", str(dist), *extra],
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

    # The consumer states the release: build's source repository (no GITHUB_REPOSITORY here) and the tag.
    source_repo = os.environ.get("GITHUB_REPOSITORY") or "local/benchseal"
    # Signed exactly as production would be (GitHub Actions identities), under the local root only.
    # Sealed as the infra repository's benchmark.yml; locally one checkout is both repositories.
    done = verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository=source_repo,
                          trusted_root=local_home / "sigstore" / "trusted_root.json", offline=True)
    assert (done.repository, done.tag, done.commit) == (source_repo, TAG, report["source"]["commit"])
    assert done.identity == f"https://github.com/{source_repo}/.github/workflows/benchmark.yml@refs/heads/main"
    assert done.issuer == "https://token.actions.githubusercontent.com"
    with pytest.raises(CheckFailed):  # the private instance's plain identity is not what signed it
        verify_release(release, repository=source_repo, tag=TAG, profile="local",
                       trusted_root=local_home / "sigstore" / "trusted_root.json", offline=True)
    image_checks = report["verified"]["images"]
    assert len(image_checks) == 2 and all("slsaprovenance1 and cyclonedx by https://github.com/" + source_repo +
                                          "/.github/workflows/tag.yml@refs/tags/" + TAG in c and "refused" in c
                                          for c in image_checks)
    assert report["verified"]["repository"] == source_repo and report["verified"]["tag"] == TAG
    assert f"verify . --repo {source_repo} --tag {TAG} --infra-repo {source_repo}" in body2
    with pytest.raises(CheckFailed):  # another infra repository's benchmark.yml did not seal it
        verify_release(release, repository=source_repo, tag=TAG, profile="production", infra_repository="other/infra",
                       trusted_root=local_home / "sigstore" / "trusted_root.json", offline=True)
