"""Issue 25: ``benchseal verify --images --builder OWNER/REPO@REF`` checks the release's runner and api with
the builder's release.yml identity for the source (``image_identity(repo, tag, commit, builder=
OWNER/REPO/.github/workflows/release.yml@REF)``), each signature made for real (cosign, GitHub-shaped
certificates from the private instance) through tests/attest/test_builder_identity.py's helper.

Each release here is sealed by the builder's benchmark.yml for the infra repository (it verifies); only
the runner image's signer differs. Refused: the adopter's own workflow, the builder for another
repository, another tag, another commit of the source, and another version of the builder.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.documents import TEST_RESULT
from tests.attest.test_builder_identity import _signed
from tests.publish.test_release_commands import consumer_env
from tests.verify.test_verify_builder import BUILDER, INFRA, SOURCE_REPO, SOURCE_TAG, seal_job

__all__ = ["consumer_env"]  # a fixture, used by name

pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _release(tmp: Path, runner: str, api: str, sigstore_instance: Any) -> Path:
    """acme/widget v9.9.9 naming ``runner`` and ``api``, sealed by BUILDER's benchmark.yml for INFRA."""
    from pipeline.evidence.writer import write_evidence
    from pipeline.local.signing import local_signer
    from tests.fixtures.sigstore import make_inputs
    from tests.fixtures.trials import evidence_for

    grading, payload = make_inputs({"runner": runner, "api": api})
    evidence_for(grading, tmp / "artifacts" / "evidence")
    signer = local_signer(state=sigstore_instance.state, github_job=seal_job())
    try:
        return write_evidence(tmp, grading, payload, signer=signer).artifacts
    finally:
        signer.close()


def _image(sigstore_instance: Any, tmp: Path, **signed_as: Any) -> str:
    """A fresh image signed and attested by the builder's release.yml for acme/widget v9.9.9 (``signed_as``: a forgery)."""
    tmp.mkdir(parents=True)
    ref, _ = _signed(sigstore_instance, tmp, **{"tag": SOURCE_TAG, **signed_as})
    return ref


@pytest.fixture(scope="module")
def good_api(tmp_path_factory: pytest.TempPathFactory, sigstore_instance: Any) -> str:
    return _image(sigstore_instance, tmp_path_factory.mktemp("api") / "sign")


def _verify(release: Path, sigstore_instance: Any, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(release), "--repo", SOURCE_REPO,
                           "--tag", SOURCE_TAG, "--infra-repo", INFRA, "--builder", str(BUILDER), "--trusted-root",
                           str(sigstore_instance.trusted_root), "--offline", "--profile", "production", "--images",
                           *extra], capture_output=True, text=True, check=False, timeout=300, cwd=REPO)


def test_images_signed_by_the_builder_for_the_source_pass(tmp_path: Path, sigstore_instance: Any, good_api: str) -> None:
    runner = _image(sigstore_instance, tmp_path / "runner")
    release = _release(tmp_path / "run", runner, good_api, sigstore_instance)
    done = _verify(release, sigstore_instance)
    assert done.returncode == 0, done.stderr
    assert (f"images:     runner and api by https://github.com/{BUILDER.workflow('release.yml')} at commit "
            "0123456789abcdef0123456789abcdef01234567") in done.stdout
    # A builder's images are its release.yml's: naming another workflow is a usage error.
    usage = _verify(release, sigstore_instance, "--image-workflow", "tag.yml")
    assert usage.returncode == 2 and "--image-workflow" in usage.stderr


@pytest.mark.parametrize(("case", "signed_as"), [
    ("the adopter's own workflow", {"builder_ref": None}),
    ("the builder for another repository", {"repository": "evil/widget"}),
    ("the builder for another tag", {"tag": "v9.9.8"}),
    ("the builder at another commit of the source", {"commit": "f" * 40}),
    ("another version of the builder", {"builder_ref": "cd" * 20}),
])
def test_images_signed_by_anyone_else_are_refused(case: str, signed_as: dict[str, Any], tmp_path: Path,
                                                  sigstore_instance: Any, good_api: str) -> None:
    runner = _image(sigstore_instance, tmp_path / "runner", **signed_as)
    release = _release(tmp_path / "run", runner, good_api, sigstore_instance)
    done = _verify(release, sigstore_instance)
    assert done.returncode == 1, (case, done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert f"{runner}: signature by https://github.com/{BUILDER.workflow('release.yml')} at commit" in line, line
    assert "not verified" in line


def _image_block(body: str) -> list[str]:
    """The image block's cosign lines (gh's follow them: tests/attest/test_image_commands.py)."""
    lines = body.split("The runner and API images", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()
    return [line for line in lines if not line.startswith("gh ")]


@pytest.mark.parametrize(("pin", "edited"), [
    (None, None),
    (f"release.yml@{BUILDER.ref}", "release.yml@" + "cd" * 20),
    (f"--certificate-github-workflow-repository {SOURCE_REPO}", "--certificate-github-workflow-repository evil/widget"),
    (f"--certificate-github-workflow-ref refs/tags/{SOURCE_TAG}", "--certificate-github-workflow-ref refs/tags/v9.9.8"),
    ("--certificate-github-workflow-sha 0123456789abcdef0123456789abcdef01234567",
     "--certificate-github-workflow-sha " + "f" * 40),
])
def test_the_bodys_image_lines_run_as_printed(tmp_path: Path, sigstore_instance: Any, good_api: str,
                                              consumer_env: None, pin: str | None, edited: str | None) -> None:
    """``benchseal publish --builder`` prints the images' cosign lines with the builder's release.yml identity
    and the source's pins: they pass as printed with the real cosign, and fail with any pin edited."""
    from pipeline.core.errors import CheckFailed
    from pipeline.local.release import run_commands

    runner = _image(sigstore_instance, tmp_path / "runner")
    published = _published(tmp_path, _release(tmp_path / "run", runner, good_api, sigstore_instance), sigstore_instance)
    lines = _image_block((published / "body.md").read_text())
    # 2 images x (signature, SLSA provenance, CycloneDX SBOM), then the runner's test-result attestation
    # (test_the_bodys_test_result_line_runs_as_printed_once_attached)
    assert len(lines) == 7 and all(line.startswith("cosign verify") for line in lines)  # no env prefix, no host path
    assert TEST_RESULT in lines[-1]
    lines = lines[:-1]
    if pin is None:
        assert run_commands(lines, published) == lines
        return
    assert edited is not None
    for line in (line.replace(pin, edited) for line in lines):
        with pytest.raises(CheckFailed):
            run_commands([line], published)


def test_the_bodys_test_result_line_runs_as_printed_once_attached(tmp_path: Path, sigstore_instance: Any,
                                                                  good_api: str, consumer_env: None) -> None:
    """Issue 26.1: the body prints `cosign verify-attestation --new-bundle-format --type
    https://in-toto.io/attestation/test-result/v0.1` for the runner with the seal job's identity (the
    builder's benchmark.yml for the infra repository on main). It fails until the release's test-result
    bundle is attached to the runner (`benchseal attach-result`, release.yml's attach_result job), then
    passes as printed with the real cosign, and fails with any pin edited."""
    from pipeline.core.errors import CheckFailed
    from pipeline.local.release import run_commands
    from pipeline.verify.external import result_attestation_args
    from pipeline.verify.policy import expectation

    runner = _image(sigstore_instance, tmp_path / "runner")
    published = _published(tmp_path, _release(tmp_path / "run", runner, good_api, sigstore_instance), sigstore_instance)
    line = _image_block((published / "body.md").read_text())[-1]
    seal = expectation(None, "production", repository=SOURCE_REPO, tag=SOURCE_TAG, infra_repository=INFRA,
                       builder=BUILDER)
    argv = shlex.split(line)
    assert argv[0] == "cosign"
    # The line names the root the release publishes beside it (issue 37.4), run inside the release directory.
    assert (published / "trusted_root.json").is_file()
    assert argv[1:] == result_attestation_args(runner, seal, trusted_root=Path("trusted_root.json"))
    for pin in (f"--type {TEST_RESULT}", f"--certificate-identity https://github.com/{BUILDER.workflow('benchmark.yml')}",
                f"--certificate-github-workflow-repository {INFRA}", "--certificate-github-workflow-ref refs/heads/main",
                f" {runner}"):
        assert pin in line, pin
    with pytest.raises(CheckFailed, match="verification command failed"):
        run_commands([line], published)  # nothing attached yet
    for attempt in ("attached: ", "already there"):
        attached = subprocess.run([sys.executable, "-m", "pipeline", "attach-result", str(published), "--runner",
                                   runner], capture_output=True, text=True, check=False, timeout=120, cwd=REPO)
        assert attached.returncode == 0 and attempt in attached.stdout, attached.stderr
        assert run_commands([line], published) == [line]
    for pin, edited in ((f"benchmark.yml@{BUILDER.ref}", "benchmark.yml@" + "cd" * 20),
                        (f"/{BUILDER.repository}/.github/workflows/benchmark.yml", "/evil/benchseal/.github/workflows/benchmark.yml"),
                        ("workflows/benchmark.yml@", "workflows/release.yml@"),
                        (f"--certificate-github-workflow-repository {INFRA}", "--certificate-github-workflow-repository evil/bench-infra"),
                        ("--certificate-github-workflow-ref refs/heads/main", "--certificate-github-workflow-ref refs/heads/dev"),
                        ("--certificate-oidc-issuer https://token.actions.githubusercontent.com",
                         "--certificate-oidc-issuer https://accounts.example.com"),
                        (f"--type {TEST_RESULT}", "--type https://slsa.dev/provenance/v1"),
                        (f" {runner}", f" {good_api}")):
        assert pin in line, pin
        with pytest.raises(CheckFailed, match="verification command failed"):
            run_commands([line.replace(pin, edited)], published)


def _published(tmp: Path, release: Path, instance: Any) -> Path:
    """``release`` published locally (its body printed with the builder and the infra repository pinned)."""
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(release), "--target", "local", "--root",
                           str(tmp / "dist"), "--tag", SOURCE_TAG, "--trigger", "tag", "--infra-repo", INFRA,
                           "--builder", str(BUILDER), "--trusted-root", str(instance.trusted_root)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return tmp / "dist" / SOURCE_TAG
