"""Issue 26.1: the release's signed test-result bundle attached to the runner image, as cosign's new
bundle format stores attestations (pipeline.attest.testresult), against the real registry (Debian's
distribution, no OCI referrers API: the referrers tag schema's index) and checked with the real cosign.

The bundle is signed once: the bytes in the registry are the release asset's bytes. Attaching again adds
nothing; another bundle joins the index beside it; a bundle that is not the DSSE envelope of the shipped
statement, or whose statement is not about that runner, is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.attest.testresult import BUNDLE_MEDIA_TYPE, attach_test_result
from pipeline.core.digests import parse_ref
from pipeline.core.documents import TEST_RESULT
from pipeline.core.errors import CheckFailed
from pipeline.verify.external import cosign_environment, cosign_trust_env, result_attestation_args
from pipeline.verify.policy import expectation
from tests.fixtures.sigstore import PushedImage, make_inputs, push_unique_image

pytestmark = pytest.mark.slow
STATEMENT, BUNDLE = "test-result.intoto.json", "test-result.intoto.json.sigstore.json"


@pytest.fixture()
def fresh_release(tmp_path: Path, signer_v1: Any, handmade_api_image: PushedImage) -> Iterator[tuple[Path, str]]:
    """A release sealed for a runner image no other test (or earlier run) has attached anything to."""
    from pipeline.evidence.writer import write_evidence
    from tests.fixtures.trials import evidence_for

    runner = push_unique_image("benchseal-test/attach-runner", "attach")
    grading, payload = make_inputs({"runner": runner, "api": handmade_api_image.ref})
    evidence_for(grading, tmp_path / "run" / "artifacts" / "evidence")
    yield write_evidence(tmp_path / "run", grading, payload, signer=signer_v1).artifacts, runner


def _get(ref: str, reference: str, kind: str = "manifests") -> requests.Response:
    image = parse_ref(ref)
    session = requests.Session()
    session.trust_env = False
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    return session.get(f"http://{image.registry}/v2/{image.repository}/{kind}/{reference}", headers={"Accept": accept},
                       timeout=30)


def _cosign(args: list[str], root: Path, work: Path) -> subprocess.CompletedProcess[str]:
    from pipeline.verify.external import cosign_path

    env = cosign_environment(cosign_trust_env(root, work))
    return subprocess.run([str(cosign_path()), *args], env=env, capture_output=True, text=True, check=False,
                          timeout=120)


def test_the_release_bundle_is_attached_as_cosigns_new_bundle_format(fresh_release: tuple[Path, str], tmp_path: Path,
                                                                     sigstore_instance: Any) -> None:
    release, runner = fresh_release
    digest = parse_ref(runner).digest
    bundle = (release / BUNDLE).read_bytes()
    attached = attach_test_result(release, runner)
    assert attached.added and attached.fallback_tag == digest.replace(":", "-") and attached.runner == runner
    # The referrers tag schema's index (distribution 2.8 has no referrers API: GET .../referrers answers 404).
    assert _get(runner, digest, "referrers").status_code == 404
    index = _get(runner, attached.fallback_tag).json()
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [entry] = index["manifests"]
    assert (entry["digest"], entry["artifactType"]) == (attached.manifest, BUNDLE_MEDIA_TYPE)
    assert entry["annotations"]["dev.sigstore.bundle.predicateType"] == TEST_RESULT
    # The referrer: cosign's layout (BUNDLE_SPEC.md), the runner as its subject.
    manifest_bytes = _get(runner, attached.manifest).content
    assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == attached.manifest
    manifest = json.loads(manifest_bytes)
    assert manifest["artifactType"] == BUNDLE_MEDIA_TYPE
    assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    assert manifest["subject"]["digest"] == digest
    assert manifest["annotations"]["dev.sigstore.bundle.content"] == "dsse-envelope"
    [layer] = manifest["layers"]
    assert layer["mediaType"] == BUNDLE_MEDIA_TYPE
    # Signed once: the registry holds the release asset's exact bytes.
    assert _get(runner, layer["digest"], "blobs").content == bundle
    # The real cosign finds and verifies it (the signer the evidence has: the local profile here).
    seal = expectation(None, "local", repository="acme/widget", tag="v9.9.9")
    root = sigstore_instance.trusted_root
    done = _cosign(result_attestation_args(runner, seal, trusted_root=root), root, tmp_path / "trust")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["payloadType"] == "application/vnd.in-toto+json"


def test_attaching_again_adds_nothing_and_another_bundle_joins_the_index(fresh_release: tuple[Path, str],
                                                                         signer_v1: Any) -> None:
    release, runner = fresh_release
    first = attach_test_result(release, runner)
    again = attach_test_result(release, runner)
    assert (again.manifest, again.added) == (first.manifest, False)
    assert first.fallback_tag is not None
    assert [e["digest"] for e in _get(runner, first.fallback_tag).json()["manifests"]] == [first.manifest]
    signer_v1.sign_statement(release / STATEMENT)  # a new signature of the same statement: another bundle
    other = attach_test_result(release, runner)
    assert other.added and other.manifest != first.manifest
    assert [e["digest"] for e in _get(runner, first.fallback_tag).json()["manifests"]] == [first.manifest,
                                                                                         other.manifest]


def _one_line(release: Path, runner: str, match: str) -> None:
    with pytest.raises(CheckFailed, match=match) as caught:
        attach_test_result(release, runner)
    assert "\n" not in str(caught.value)


def test_a_bundle_for_another_image_or_statement_is_refused(fresh_release: tuple[Path, str], tmp_path: Path,
                                                            handmade_api_image: PushedImage) -> None:
    release, runner = fresh_release
    # Not the statement's subject: the api image.
    _one_line(release, handmade_api_image.ref, "its subject does not name the runner image")
    # The statement edited after signing: the bundle no longer carries it.
    edited = tmp_path / "edited"
    shutil.copytree(release, edited)
    statement = json.loads((edited / STATEMENT).read_text())
    statement["predicate"]["result"] = "FAILED"
    (edited / STATEMENT).write_text(json.dumps(statement))
    _one_line(edited, runner, "the signed statement differs from test-result.intoto.json")
    # A message signature (another file's bundle) in its place: not a DSSE envelope.
    shutil.copy(release / "summary.json.sigstore.json", edited / BUNDLE)
    _one_line(edited, runner, "not a Sigstore bundle v0.3 holding a DSSE envelope")
    (edited / BUNDLE).unlink()
    _one_line(edited, runner, "test-result.intoto.json.sigstore.json: missing")
    assert _nothing_attached(runner)


def _nothing_attached(runner: str) -> bool:
    """Nothing refused was pushed: the runner has no referrers index at all."""
    return _get(runner, parse_ref(runner).digest.replace(":", "-")).status_code == 404
