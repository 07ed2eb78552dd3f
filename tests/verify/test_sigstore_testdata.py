"""Offline verification of real public-good and staging bundles (tests/data/sigstore)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sigstore.errors import VerificationError
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier, policy

from pipeline.verify.external import cosign_verify, sigstore_js_verify

DATA = Path(__file__).resolve().parents[1] / "data" / "sigstore"
GITHUB = "https://token.actions.githubusercontent.com"
BEACON = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
          ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main")
RFC8785 = "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2"
WHEEL = "rfc8785-0.1.2-py3-none-any.whl"


def _verifier(root: str) -> Verifier:
    return Verifier(trusted_root=TrustedRoot.from_file(str(DATA / root / "trusted_root.json")))


def _bundle(path: Path) -> Bundle:
    return Bundle.from_json(path.read_bytes())


@pytest.mark.parametrize(("root", "artifact", "bundle", "identity"), [
    ("public-good", "a.txt", "a.txt.sigstore.json", BEACON),
    ("public-good", WHEEL, WHEEL + ".sigstore", RFC8785),
    ("staging-rekor2", "a.txt", "a.txt.sigstore.json", BEACON),
])
def test_happy_artifacts_accepted(root: str, artifact: str, bundle: str, identity: str) -> None:
    _verifier(root).verify_artifact((DATA / root / artifact).read_bytes(), _bundle(DATA / root / bundle),
                                    policy.Identity(identity=identity, issuer=GITHUB))


@pytest.mark.parametrize("root", ["public-good", "staging-rekor2"])
def test_happy_dsse_accepted(root: str) -> None:
    payload_type, payload = _verifier(root).verify_dsse(_bundle(DATA / root / "a.txt.intoto.sigstore.json"),
                                                        policy.Identity(identity=BEACON, issuer=GITHUB))
    assert payload_type == "application/vnd.in-toto+json"
    assert b'"name":"a.txt"' in payload


def test_signature_mismatch_rejected() -> None:
    with pytest.raises(VerificationError):
        _verifier("public-good").verify_artifact(
            (DATA / "public-good" / "a.txt").read_bytes(),
            _bundle(DATA / "public-good" / "a.txt.signature-mismatch.sigstore.json"),
            policy.Identity(identity=BEACON, issuer=GITHUB))


def test_wrong_identity_rejected() -> None:
    with pytest.raises(VerificationError):
        _verifier("public-good").verify_artifact(
            (DATA / "public-good" / WHEEL).read_bytes(), _bundle(DATA / "public-good" / (WHEEL + ".sigstore")),
            policy.Identity(identity=RFC8785.replace("v0.1.2", "v0.1.3"), issuer=GITHUB))


def test_wrong_root_rejected() -> None:
    with pytest.raises(VerificationError):
        _verifier("staging-rekor2").verify_artifact(
            (DATA / "public-good" / WHEEL).read_bytes(), _bundle(DATA / "public-good" / (WHEEL + ".sigstore")),
            policy.Identity(identity=RFC8785, issuer=GITHUB))


def test_sigstore_js_agrees_on_real_bundles() -> None:
    pg, st = DATA / "public-good", DATA / "staging-rekor2"
    job = {"identity": BEACON, "issuer": GITHUB}
    good = sigstore_js_verify(pg / "trusted_root.json", [
        {**job, "bundle": str(pg / "a.txt.sigstore.json"), "artifact": str(pg / "a.txt")},
        {**job, "bundle": str(pg / "a.txt.intoto.sigstore.json"), "artifact": None},
        {"identity": RFC8785, "issuer": GITHUB, "bundle": str(pg / (WHEEL + ".sigstore")), "artifact": str(pg / WHEEL)},
    ])
    assert [o.ok for o in good] == [True, True, True], good
    rekor2 = sigstore_js_verify(st / "trusted_root.json", [
        {**job, "bundle": str(st / "a.txt.sigstore.json"), "artifact": str(st / "a.txt")},
        {**job, "bundle": str(st / "a.txt.intoto.sigstore.json"), "artifact": None},
    ])
    assert [o.ok for o in rekor2] == [True, True], rekor2
    bad = sigstore_js_verify(pg / "trusted_root.json", [
        {**job, "bundle": str(pg / "a.txt.signature-mismatch.sigstore.json"), "artifact": str(pg / "a.txt")},
        {**job, "identity": BEACON + "x", "bundle": str(pg / "a.txt.sigstore.json"), "artifact": str(pg / "a.txt")},
        # @sigstore/verify takes the identity as an unanchored regular expression: a prefix of the
        # signer's identity, or one with '.' standing for another character, must not pass.
        {**job, "identity": BEACON[:-4], "bundle": str(pg / "a.txt.sigstore.json"), "artifact": str(pg / "a.txt")},
        {**job, "identity": BEACON[1:], "bundle": str(pg / "a.txt.sigstore.json"), "artifact": str(pg / "a.txt")},
        {**job, "identity": BEACON[:8] + "." + BEACON[9:], "bundle": str(pg / "a.txt.sigstore.json"),
         "artifact": str(pg / "a.txt")},
    ])
    assert [o.ok for o in bad] == [False] * 5, bad
    wrong_root = sigstore_js_verify(st / "trusted_root.json", [
        {"identity": RFC8785, "issuer": GITHUB, "bundle": str(pg / (WHEEL + ".sigstore")), "artifact": str(pg / WHEEL)},
    ])
    assert not wrong_root[0].ok


def test_cosign_agrees_on_real_bundles(cosign_bin: Path, tmp_path: Path) -> None:
    pg = DATA / "public-good"
    root = pg / "trusted_root.json"
    ok = cosign_verify(pg / WHEEL, pg / (WHEEL + ".sigstore"), RFC8785, GITHUB, trusted_root=root)
    assert ok.ok, ok.output
    assert cosign_verify(pg / "a.txt", pg / "a.txt.sigstore.json", BEACON, GITHUB, trusted_root=root).ok
    assert not cosign_verify(pg / "a.txt", pg / "a.txt.signature-mismatch.sigstore.json", BEACON, GITHUB,
                             trusted_root=root).ok
    assert not cosign_verify(pg / WHEEL, pg / (WHEEL + ".sigstore"), BEACON, GITHUB, trusted_root=root).ok
    assert not cosign_verify(pg / WHEEL, pg / (WHEEL + ".sigstore"), RFC8785, GITHUB,
                             trusted_root=DATA / "staging-rekor2" / "trusted_root.json").ok
    tampered = tmp_path / WHEEL
    tampered.write_bytes((pg / WHEEL).read_bytes() + b"\0")
    assert not cosign_verify(tampered, pg / (WHEEL + ".sigstore"), RFC8785, GITHUB, trusted_root=root).ok


def test_cosign_3_verifies_rekor_v2(cosign_bin: Path) -> None:
    """cosign 3.1 (what setup installs) verifies a real Rekor v2 bundle, and only for its signer; cosign 2.5
    rejected it ("nil value in transaction log entry"), which is why bundles are still made with Rekor v1
    for consumers who have 2.5."""
    st = DATA / "staging-rekor2"
    root = st / "trusted_root.json"
    outcome = cosign_verify(st / "a.txt", st / "a.txt.sigstore.json", BEACON, GITHUB, trusted_root=root)
    assert outcome.ok, outcome.output
    assert not cosign_verify(st / "a.txt", st / "a.txt.sigstore.json", RFC8785, GITHUB, trusted_root=root).ok


def test_cosign_takes_no_trust_from_the_inherited_environment(cosign_bin: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Leftover SIGSTORE_*/TUF_* settings in the caller's environment never reach cosign: its trust
    comes only from the endpoints (the real public-good bundle still verifies, and only as it should)."""
    from pipeline.verify.external import cosign_environment

    bogus = tmp_path / "bogus.pem"
    bogus.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    for name in ("SIGSTORE_ROOT_FILE", "SIGSTORE_REKOR_PUBLIC_KEY", "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE", "TUF_ROOT"):
        monkeypatch.setenv(name, str(bogus))
    monkeypatch.setenv("BENCHSEAL_UNRELATED", "kept")
    env = cosign_environment({"SIGSTORE_ROOT_FILE": "/endpoint/fulcio.pem"})
    assert env["SIGSTORE_ROOT_FILE"] == "/endpoint/fulcio.pem" and env["BENCHSEAL_UNRELATED"] == "kept"
    assert not {"SIGSTORE_REKOR_PUBLIC_KEY", "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE", "TUF_ROOT"} & set(env)
    pg = DATA / "public-good"
    ok = cosign_verify(pg / WHEEL, pg / (WHEEL + ".sigstore"), RFC8785, GITHUB, trusted_root=pg / "trusted_root.json")
    assert ok.ok, ok.output
    assert not cosign_verify(pg / WHEEL, pg / (WHEEL + ".sigstore"), RFC8785 + "x", GITHUB,
                             trusted_root=pg / "trusted_root.json").ok
