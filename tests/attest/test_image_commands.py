"""The release body prints how to verify the images (issue 22, point 8), and ``benchseal verify
--images`` checks them: ``cosign verify`` and ``cosign verify-attestation --new-bundle-format --type
https://slsa.dev/provenance/v1`` / ``https://cyclonedx.org/bom`` (the Sigstore bundles attached as OCI
referrers, issue 37.2) for the runner and the api digest, with the identity, issuer and the
workflow repository, ref and SHA pins ``benchseal verify-image`` uses (one home:
``image_identity`` + ``image_check_args``).

The body is a real published one (``publish_request`` to a local target); its image commands are
run exactly as printed, with the real cosign, against the local registry and the private
Sigstore instance whose root the body names; an edited identity fails.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.attest.images import SigstoreEndpoints
from pipeline.attest.testresult import attach_test_result
from pipeline.cli.main import app
from pipeline.core.contracts import PublicationRequest
from pipeline.core.documents import TEST_RESULT, ReleaseSummary, load_document
from pipeline.core.errors import CheckFailed
from pipeline.local.release import run_commands
from pipeline.publish.outbox import publish_request
from pipeline.publish.targets import LocalTarget
from pipeline.verify.external import (
    CYCLONEDX,
    SLSA_PROVENANCE,
    image_check_args,
    image_identity,
    result_attestation_args,
)
from pipeline.verify.gh import gh_image_args
from pipeline.verify.policy import expectation
from tests.attest.test_image_commit_pin import sign_as
from tests.fixtures.attest import RELEASE_COMMIT

pytestmark = pytest.mark.slow

REPOSITORY, TAG = "acme/widget", "v9.9.9"  # the source tests.fixtures.sigstore.make_inputs seals
OTHER = "9" * 40


@pytest.fixture()
def consumer_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sigstore_instance: Any, cosign_bin: Path) -> None:
    """A consumer's shell: `cosign` and `benchseal` on PATH; the publisher's home holds the local
    instance's trusted root (where the printed root points)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "sigstore").symlink_to(sigstore_instance.state)
    monkeypatch.setenv("BENCHSEAL_HOME", str(home))
    monkeypatch.setenv("PATH", os.pathsep.join([str(cosign_bin.parent), str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))


def _publish(artifacts: Path, dist: Path) -> Path:
    request = PublicationRequest(run_id="unknown", target="local", tag=TAG, artifacts_dir=str(artifacts),
                                 options={"root": str(dist), "repository": REPOSITORY})
    publish_request(request, LocalTarget(dist))
    return dist / TAG


def _image_lines(body: str) -> list[str]:
    """The lines of the body's image block: the ```sh block under "The runner and API images" (the evidence
    logs' line follows in a block of its own): cosign's, then gh's."""
    section = body.split("The runner and API images (cosign and gh, from their registry)", 1)[1].split("</details>", 1)[0]
    blocks = [part.split("\n```", 1)[0] for part in section.split("```sh\n")[1:]]
    assert len(blocks) == 1, body
    lines = blocks[0].splitlines()
    cosign = [line for line in lines if not line.startswith("gh ")]
    assert lines[:len(cosign)] == cosign, lines  # gh's lines last
    return lines


def _images_section(body: str) -> list[str]:
    """The block's cosign lines."""
    return [line for line in _image_lines(body) if not line.startswith("gh ")]


def _gh_lines(body: str) -> list[str]:
    return [line for line in _image_lines(body) if line.startswith("gh ")]


def _image_block(body: str) -> list[str]:
    """The lines of the body's image block that check the images' own signatures and attestations (the
    last line, the runner's test-result attestation, is _result_line's)."""
    lines = _images_section(body)
    assert TEST_RESULT in lines[-1] and not any(TEST_RESULT in line for line in lines[:-1]), lines
    return lines[:-1]


def _result_line(body: str) -> str:
    return _images_section(body)[-1]


def _images(release: Path) -> dict[str, str]:
    summary = load_document(ReleaseSummary, release / "summary.json")
    return {"runner": summary.images.runner.ref, "api": summary.images.api.ref}


@pytest.fixture()
def published(release_copy: Path, tmp_path: Path, consumer_env: None, sign_release_images: Any) -> Path:
    release = _publish(release_copy, tmp_path / "dist")
    # What tag.yml's build job did for this release: both images signed at its tag and commit.
    sign_release_images(REPOSITORY, TAG, _images(release).values(), commit=RELEASE_COMMIT)
    return release


def test_body_prints_the_image_commands_verify_image_runs(published: Path) -> None:
    lines = _image_block((published / "body.md").read_text())
    policy = image_identity(REPOSITORY, TAG, RELEASE_COMMIT)
    # The attestation lines name the root the release publishes (trusted_root.json), as the test-result line does.
    expected = [args for ref in _images(published).values()
                for args in image_check_args(ref, policy, offline=True, trusted_root=Path("trusted_root.json"))]
    assert len(lines) == len(expected) == 6  # 2 images x (signature, SLSA provenance, CycloneDX SBOM)
    for line, args in zip(lines, expected, strict=True):
        argv = shlex.split(line)
        # cosign <exactly verify-image's argv>: the root as the published asset, no host path, no env prefix
        assert argv[0] == "cosign" and argv[1:] == args
        assert not [a for a in argv if a.startswith("/") or "/tmp/" in a or str(published) in a], line  # no host path
    text = "\n".join(lines)
    for pin in (f"--certificate-identity https://github.com/{REPOSITORY}/.github/workflows/tag.yml@refs/tags/{TAG}",
                "--certificate-oidc-issuer https://token.actions.githubusercontent.com",
                f"--certificate-github-workflow-repository {REPOSITORY}",
                f"--certificate-github-workflow-ref refs/tags/{TAG}",
                f"--certificate-github-workflow-sha {RELEASE_COMMIT}"):
        assert text.count(pin) == 6, pin
    assert sum("verify-attestation --new-bundle-format --type https://slsa.dev/provenance/v1" in line
               for line in lines) == 2
    assert sum("verify-attestation --new-bundle-format --type https://cyclonedx.org/bom" in line for line in lines) == 2


def test_image_commands_run_as_printed(published: Path) -> None:
    lines = _image_block((published / "body.md").read_text())
    assert run_commands(lines, published) == lines


def test_a_passed_image_command_is_not_run_again_for_its_root(published: Path, sigstore_instance: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With the root the lines were printed for, a line that passed is answered from its record
    (pipeline.attest.passed); an edited line still runs and fails; without the root nothing is recorded."""
    import pipeline.local.release as release_module

    lines = _image_block((published / "body.md").read_text())
    records = Path(os.environ["BENCHSEAL_HOME"]) / "cache" / "image-checks"
    assert run_commands(lines, published) == lines and not records.exists()  # no root named: nothing recorded
    assert run_commands(lines, published, sigstore_instance.trusted_root) == lines
    assert len(list(records.glob("*.json"))) == 6
    ran: list[str] = []
    real_run = release_module.subprocess.run

    def counting(argv: list[str], **kwargs: Any) -> Any:
        ran.append(shlex.join(argv))
        return real_run(argv, **kwargs)

    monkeypatch.setattr(release_module.subprocess, "run", counting)
    assert run_commands(lines, published, sigstore_instance.trusted_root) == lines and ran == []
    edited = lines[0].replace(f"--certificate-github-workflow-sha {RELEASE_COMMIT}", f"--certificate-github-workflow-sha {OTHER}")
    with pytest.raises(CheckFailed, match="verification command failed"):
        run_commands([edited], published, sigstore_instance.trusted_root)
    assert len(ran) == 1 and len(list(records.glob("*.json"))) == 6


@pytest.mark.parametrize(("old", "new"), [
    (f"--certificate-github-workflow-sha {RELEASE_COMMIT}", f"--certificate-github-workflow-sha {OTHER}"),
    (f"--certificate-github-workflow-sha {RELEASE_COMMIT}", f"--certificate-github-workflow-sha {RELEASE_COMMIT.upper()}"),
    (f"--certificate-github-workflow-sha {RELEASE_COMMIT}", f"--certificate-github-workflow-sha {RELEASE_COMMIT[:7]}"),
    (f"tag.yml@refs/tags/{TAG}", "tag.yml@refs/tags/v9.9.8"),
    (f"tag.yml@refs/tags/{TAG}", f"other.yml@refs/tags/{TAG}"),
    (f"https://github.com/{REPOSITORY}/", "https://github.com/fork/widget/"),
    (f"--certificate-github-workflow-repository {REPOSITORY}", "--certificate-github-workflow-repository fork/widget"),
    (f"--certificate-github-workflow-ref refs/tags/{TAG}", "--certificate-github-workflow-ref refs/heads/main"),
    ("--certificate-oidc-issuer https://token.actions.githubusercontent.com",
     "--certificate-oidc-issuer https://accounts.example.com"),
], ids=["sha", "sha-upper-case", "sha-prefix", "tag", "workflow", "identity-repository", "repository-pin", "ref-pin",
        "issuer"])
def test_an_edited_identity_fails(published: Path, old: str, new: str) -> None:
    lines = _image_block((published / "body.md").read_text())
    for line in lines:
        assert old in line, line
        with pytest.raises(CheckFailed, match="verification command failed"):
            run_commands([line.replace(old, new)], published)


# --- gh's lines beside cosign's (issue 37.2) ---------------------------------------------------------

def test_body_prints_gh_lines_for_each_image_and_they_run_as_printed(published: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After cosign's, one `gh attestation verify oci://REF --bundle-from-oci` line per image and attestation
    (SLSA provenance, CycloneDX SBOM) with the pins cosign's lines state (gh_image_args), naming the published
    root's JSON Lines twin; run as printed they pass with no token of the caller's (run_commands gives gh its
    placeholder through the environment), and each edited pin fails."""
    monkeypatch.delenv("GH_TOKEN", raising=False)
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    lines = _gh_lines((published / "body.md").read_text())
    policy = image_identity(REPOSITORY, TAG, RELEASE_COMMIT)
    assert (published / "trusted_root.jsonl").is_file()
    expected = [shlex.join(["gh", *gh_image_args(ref, policy, predicate_type,
                                                 trusted_root_jsonl=Path("trusted_root.jsonl"))])
                for ref in _images(published).values() for predicate_type in (SLSA_PROVENANCE, CYCLONEDX)]
    assert lines == expected and len(lines) == 4
    assert not any("TOKEN" in line for line in lines)
    assert run_commands(lines, published) == lines
    for old, new in ((f"--source-digest {RELEASE_COMMIT}", f"--source-digest {OTHER}"),
                     (f"--source-ref refs/tags/{TAG}", "--source-ref refs/heads/main"),
                     (f"--repo {REPOSITORY}", "--repo fork/widget"),
                     (f"--predicate-type {SLSA_PROVENANCE}", "--predicate-type https://spdx.dev/Document")):
        edited = [line.replace(old, new) for line in lines if old in line]
        assert edited, old
        with pytest.raises(CheckFailed, match="verification command failed"):
            run_commands(edited[:1], published)


# --- the runner's test-result attestation (issue 26.1) ----------------------------------------------

def test_the_test_result_line_runs_as_printed_once_attached(published: Path, sigstore_instance: Any) -> None:
    """The body's last image line checks the runner's test-result attestation with the evidence's signer
    (here the private instance's own identity: the local profile, as the release's bundles are); it
    passes as printed once the release's bundle is attached to the runner, and fails with the identity,
    issuer, type or image edited."""
    line = _result_line((published / "body.md").read_text())
    seal = expectation(None, "local", repository=REPOSITORY, tag=TAG)
    runner = _images(published)["runner"]
    argv = shlex.split(line)
    assert argv[0] == "cosign"
    # The root the release publishes beside it (issue 37.4), the instance's own bytes, named relative to the
    # release directory the line runs in.
    root = Path(argv[argv.index("--trusted-root") + 1])
    assert root == Path("trusted_root.json")
    assert (published / root).read_bytes() == Path(sigstore_instance.trusted_root).read_bytes()
    assert argv[1:] == result_attestation_args(runner, seal, trusted_root=root)
    attach_test_result(published, runner)
    assert run_commands([line], published) == [line]
    for old, new in ((f"--certificate-identity {seal.identity}", f"--certificate-identity {seal.identity}x"),
                     (f"--certificate-oidc-issuer {seal.issuer}", "--certificate-oidc-issuer https://accounts.example.com"),
                     (f"--type {TEST_RESULT}", "--type https://cyclonedx.org/bom"),
                     (f" {runner}", f" {_images(published)['api']}")):
        assert old in line, old
        with pytest.raises(CheckFailed, match="verification command failed"):
            run_commands([line.replace(old, new)], published)


# --- benchseal verify --images ----------------------------------------------------------------------

def _verify(release: Path, sigstore_instance: Any, *extra: str) -> Any:
    return CliRunner().invoke(app, ["verify", str(release), "--repo", REPOSITORY, "--tag", TAG, "--trusted-root",
                                    str(sigstore_instance.trusted_root), "--offline", "--images", *extra])


def test_verify_images_refuses_the_ref_signed_at_another_commit(published: Path, sigstore_instance: Any,
                                                                tmp_path: Path) -> None:
    """`benchseal verify --images` pins the commit the verified summary is bound to: the images
    signed by the right workflow at the right ref, built from another commit, are refused. (A
    fixed tag of this test's own, so no other test's signature of these shared images counts.)"""
    ref = f"refs/tags/pin-{uuid.uuid4().hex[:12]}"
    endpoints = _endpoints(sigstore_instance)
    sign_as(sigstore_instance, endpoints, tmp_path, dict(_images(published)), ref=ref, sha=OTHER,
            repository=REPOSITORY)
    refused = _verify(published, sigstore_instance, "--image-ref", ref)
    assert refused.exit_code == 1 and isinstance(refused.exception, CheckFailed), refused.output
    assert f"at commit {RELEASE_COMMIT}" in str(refused.exception) and "not verified" in str(refused.exception)
    sign_as(sigstore_instance, endpoints, tmp_path, dict(_images(published)), ref=ref, sha=RELEASE_COMMIT,
            repository=REPOSITORY)
    ok = _verify(published, sigstore_instance, "--image-ref", ref)
    assert ok.exit_code == 0, ok.output


def test_verify_images_passes_for_the_release_workflow(published: Path, sigstore_instance: Any) -> None:
    done = _verify(published, sigstore_instance)
    assert done.exit_code == 0, done.output
    wrong = _verify(published, sigstore_instance, "--image-workflow", "other.yml")
    assert wrong.exit_code == 1 and isinstance(wrong.exception, CheckFailed)


def _endpoints(instance: Any) -> SigstoreEndpoints:
    return SigstoreEndpoints.private(instance.url, instance.trusted_root)
