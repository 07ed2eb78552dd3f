"""The release's test-result attestation, attached to the runner image as cosign's new bundle format
stores attestations: signed once, shipped twice.

The seal job signs ``test-result.intoto.json`` as a DSSE Sigstore bundle (release asset
``test-result.intoto.json.sigstore.json``). That same bundle, byte for byte, is pushed to the
runner image's repository as an OCI referrer (pipeline.attest.referrers: the one mechanism that also
attaches the images' provenance and SBOM; referrers API or the tag schema's fallback index).
cosign's ``verify-attestation --new-bundle-format`` and ``gh attestation verify --bundle-from-oci``
read either, so

    cosign verify-attestation --new-bundle-format --type https://in-toto.io/attestation/test-result/v0.1 \\
      --certificate-identity .../benchmark.yml@REF --certificate-oidc-issuer ... \\
      --certificate-github-workflow-repository OWNER/INFRA --certificate-github-workflow-ref refs/heads/main \\
      RUNNER@sha256:...

checks the seal job's own signature (``pipeline.verify.external.result_attestation_args`` is that argv).
Attaching needs push access to the runner's repository and no signing identity: release.yml's
``attach_result`` job (``packages: write``) runs it once the benchmark succeeded, the local release
after publishing. Nothing here vouches for the bundle: it is pushed only when it is the DSSE envelope
of exactly the shipped statement, whose subject is that runner; cosign then checks the signer.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from pipeline.attest.referrers import BUNDLE_MEDIA_TYPE, Attached, attach_bundle, referrer_manifest
from pipeline.core import strictjson
from pipeline.core.digests import parse_ref
from pipeline.core.documents import TEST_RESULT as TEST_RESULT_TYPE
from pipeline.core.documents import ResultStatement, parse_document
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.layout import TEST_RESULT, bundle_name

__all__ = ["BUNDLE_MEDIA_TYPE", "Attached", "attach_test_result", "referrer_manifest", "shipped_bundle"]

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def shipped_bundle(directory: Path) -> tuple[bytes, ResultStatement]:
    """The release's test-result bundle (its exact bytes) and statement, when the bundle is a Sigstore
    bundle v0.3 whose DSSE envelope carries exactly the shipped ``test-result.intoto.json``;
    CheckFailed (one line) otherwise. The signature itself is the consumer's to check."""
    statement_path, bundle_path = directory / TEST_RESULT, directory / bundle_name(TEST_RESULT)
    try:
        statement_bytes, bundle = statement_path.read_bytes(), bundle_path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckFailed(f"{Path(str(exc.filename)).name}: missing (the release's test-result attestation)") from None
    try:
        document = strictjson.loads(bundle)
    except (ValueError, RecursionError) as exc:
        raise CheckFailed(f"{bundle_path.name}: not valid JSON ({exc})") from None
    envelope = document.get("dsseEnvelope") if isinstance(document, dict) else None
    if not isinstance(document, dict) or document.get("mediaType") != BUNDLE_MEDIA_TYPE or not isinstance(envelope, dict):
        raise CheckFailed(f"{bundle_path.name}: not a Sigstore bundle v0.3 holding a DSSE envelope")
    if envelope.get("payloadType") != INTOTO_PAYLOAD_TYPE:
        raise CheckFailed(f"{bundle_path.name}: DSSE payload type is {envelope.get('payloadType')!r}, "
                          f"not {INTOTO_PAYLOAD_TYPE!r}")
    try:
        payload = base64.b64decode(str(envelope.get("payload", "")), validate=True)
    except (ValueError, binascii.Error):
        raise CheckFailed(f"{bundle_path.name}: the DSSE payload is not base64") from None
    if payload != statement_bytes:
        raise CheckFailed(f"{bundle_path.name}: the signed statement differs from {TEST_RESULT}")
    try:
        statement = parse_document(ResultStatement, strictjson.loads(statement_bytes), TEST_RESULT)
    except (ValueError, RecursionError) as exc:
        raise CheckFailed(f"{TEST_RESULT}: not valid JSON ({exc})") from None
    except ValidationError as exc:
        raise CheckFailed(f"{exc.field}: {exc.rule}") from None
    return bundle, statement


def attach_test_result(directory: Path, runner: str) -> Attached:
    """Attach the release's signed test-result bundle (``directory``: a release or artifacts dir) to the
    runner image ``runner`` (``name@sha256:...``), which the statement's subject must name."""
    image = parse_ref(runner, "runner")
    bundle, statement = shipped_bundle(directory)
    if (image.name, image.digest.removeprefix("sha256:")) not in {(s.name, s.digest.sha256) for s in statement.subject}:
        raise CheckFailed(f"{TEST_RESULT}: its subject does not name the runner image {image.ref}")
    return attach_bundle(image, bundle, TEST_RESULT_TYPE)
