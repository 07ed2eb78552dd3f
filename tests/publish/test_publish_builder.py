"""Issue 25: ``benchseal publish --builder OWNER/REPO@REF`` (what the builder's seal job passes): the release
body's commands pin the builder and the infra repository separately, the cosign lines with
``--certificate-identity`` the builder's benchmark.yml and ``--certificate-github-workflow-repository`` /
``-ref`` the infra repository on main, and ``benchseal verify ... --infra-repo ... --builder ...``. They run
as printed with the real cosign and benchseal; each pin edited fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.local.release import run_commands
from tests.publish.test_release_commands import _printed_commands, consumer_env
from tests.verify.test_verify_builder import BUILDER, INFRA, builder_release

__all__ = ["builder_release", "consumer_env"]  # fixtures, used by name

pytestmark = pytest.mark.slow
TAG, SOURCE = "v9.9.9", "acme/widget"


def _publish(artifacts: Path, dist: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "publish", str(artifacts), "--target", "local", "--root",
                           str(dist), "--tag", TAG, "--trigger", "tag", *extra],
                          capture_output=True, text=True, check=False, timeout=120)


@pytest.fixture()
def published(builder_release: Path, tmp_path: Path, sigstore_instance: Any, consumer_env: None) -> Path:
    artifacts = tmp_path / "artifacts"
    shutil.copytree(builder_release, artifacts)
    done = _publish(artifacts, tmp_path / "dist", "--infra-repo", INFRA, "--builder", str(BUILDER),
                    "--trusted-root", str(sigstore_instance.trusted_root))
    assert done.returncode == 0, done.stderr
    return tmp_path / "dist" / TAG


def test_the_body_pins_the_builder_and_the_infra_repository(published: Path) -> None:
    body = (published / "body.md").read_text()
    commands = _printed_commands(body)
    evidence = [c for c in commands if c.startswith("cosign ")]
    assert len(evidence) == 8  # 4 blobs, 3 attestation checks, the test result's against summary.json
    identity = f"https://github.com/{BUILDER.workflow('benchmark.yml')}"
    for line in evidence:
        assert (f"--certificate-identity {identity} --certificate-oidc-issuer https://token.actions.githubusercontent.com"
                f" --certificate-github-workflow-repository {INFRA} --certificate-github-workflow-ref refs/heads/main"
                in line), line
    verify_line = next(c for c in commands if c.startswith("benchseal verify "))
    assert verify_line.startswith(f"benchseal verify . --repo {SOURCE} --tag {TAG} --infra-repo {INFRA} "
                                  f"--builder {BUILDER} --trusted-root ")
    # gh's lines, after it, pin the same signer in gh's terms (pipeline.verify.gh).
    gh = [c for c in commands if c.startswith("gh attestation verify ")]
    assert len(gh) == 4 and all(f"--repo {INFRA} --cert-identity {identity} --source-ref refs/heads/main " in c
                                for c in gh), gh
    # The images' block: the builder's release.yml for the source at the tag and its commit.
    images = body.split("The runner and API images", 1)[1]
    release_identity = f"https://github.com/{BUILDER.workflow('release.yml')}"
    assert images.count(f"--certificate-identity {release_identity} ") == 6
    assert images.count(f"--certificate-github-workflow-repository {SOURCE} --certificate-github-workflow-ref "
                        f"refs/tags/{TAG} --certificate-github-workflow-sha 0123456789abcdef0123456789abcdef01234567") == 6
    # then the runner's test-result attestation, by the seal job's identity (issue 26.1)
    assert images.count(f"--certificate-identity {identity} ") == 1
    assert images.count("verify-attestation --new-bundle-format --type https://in-toto.io/attestation/test-result/v0.1") == 1
    assert run_commands(commands, published) == commands


@pytest.mark.parametrize(("pin", "edited"), [
    (f"--certificate-github-workflow-repository {INFRA}", "--certificate-github-workflow-repository evil/bench-infra"),
    ("--certificate-github-workflow-ref refs/heads/main", "--certificate-github-workflow-ref refs/heads/dev"),
    (f"benchmark.yml@{BUILDER.ref}", "benchmark.yml@" + "cd" * 20),
    (f"--builder {BUILDER}", f"--builder {BUILDER.repository}@refs/tags/v1"),
    (f"--infra-repo {INFRA}", "--infra-repo evil/bench-infra"),
])
def test_each_printed_pin_is_checked(published: Path, pin: str, edited: str) -> None:
    commands = _printed_commands((published / "body.md").read_text())
    changed = [c.replace(pin, edited) for c in commands]
    assert changed != commands
    for original, line in zip(commands, changed, strict=True):
        if line != original:
            with pytest.raises(CheckFailed):
                run_commands([line], published)


def test_github_identity_evidence_needs_both(builder_release: Path, tmp_path: Path, sigstore_instance: Any) -> None:
    root = ("--trusted-root", str(sigstore_instance.trusted_root))
    for args, named in (((*root, "--infra-repo", INFRA), "--builder"), ((*root, "--builder", str(BUILDER)), "--infra-repo")):
        done = _publish(builder_release, tmp_path / "dist", *args)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert f"{named} is required: ARTIFACTS are signed with a GitHub Actions identity" in line
    assert not (tmp_path / "dist").exists()  # refused before anything was published


@pytest.mark.parametrize("value", ["benchseal/benchseal@main", "benchseal/benchseal", "benchseal@" + "ab" * 20,
                                   "benchseal/benchseal@refs/heads/*"])
def test_a_bad_builder_is_a_usage_error(builder_release: Path, tmp_path: Path, value: str) -> None:
    done = _publish(builder_release, tmp_path / "dist", "--infra-repo", INFRA, "--builder", value)
    assert done.returncode == 2 and "invalid --builder:" in done.stderr, done.stderr
    pending = subprocess.run([sys.executable, "-m", "pipeline", "publish", "--pending", "--builder", str(BUILDER)],
                             capture_output=True, text=True, check=False, timeout=60)
    assert pending.returncode == 2 and "--builder" in pending.stderr
