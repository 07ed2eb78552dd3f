"""benchseal verify on a signed release, and the tamper matrix: every tampering must be
rejected by all three verifiers (sigstore-python via benchseal verify, sigstore-js, cosign)."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import (
    CheckFailed,
    ChecksumMismatch,
    EntryNotPlain,
    SignatureRefused,
    SummaryInvalid,
)
from pipeline.verify.external import cosign_commands, sigstore_js_verify
from pipeline.verify.release import verify_release

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# What the signed_release fixture was made for (tests/fixtures/sigstore.py make_inputs): the
# consumer's expectation, stated explicitly as every caller of verify must.
SOURCE_REPO, SOURCE_TAG = "acme/widget", "v9.9.9"
EXPECT = ("--repo", SOURCE_REPO, "--tag", SOURCE_TAG)


def _policy(path: Path, identity: str, issuer: str) -> Path:
    path.write_text(
        "schema: benchseal.verify-policy/v1\nprofiles:\n"
        f"  local:\n    identity: {identity}\n    issuer: {issuer}\n"
        "  production:\n    identity: x\n    issuer: y\n")
    return path


def _python(directory: Path, root: Path, policy: Path | None) -> tuple[bool, str]:
    try:
        verify_release(directory, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, policy=policy,
                       offline=True)
    except CheckFailed as exc:
        return False, str(exc)
    return True, ""


def _js(directory: Path, root: Path, identity: str, issuer: str) -> tuple[bool, str]:
    jobs: list[dict[str, str | None]] = [{"checksums": str(directory / "SHA256SUMS")}]
    for bundle in sorted(directory.glob("*.sigstore.json")):
        target = directory / bundle.name.removesuffix(".sigstore.json")
        dsse = b'"dsseEnvelope"' in bundle.read_bytes()
        jobs.append({"bundle": str(bundle), "identity": identity, "issuer": issuer,
                     "artifact": None if dsse else str(target), "payload_file": str(target) if dsse else None})
    results = sigstore_js_verify(root, jobs)
    return all(r.ok for r in results), "; ".join(r.output for r in results if not r.ok)


def _cosign(directory: Path, root: Path, policy: Path | None, cosign: Path) -> tuple[bool, str]:
    # The release was signed by the private instance's own identity: the local profile, stated (a
    # tampered bundle's issuer cannot tell which profile printed the commands).
    lines = cosign_commands(directory, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root, policy=policy,
                            cosign=str(cosign), profile="local")
    # The last line is `benchseal verify` (sigstore-python, checked above): cosign's lines only here.
    assert shlex.split(lines[-1])[1:3] == ["verify", "."]
    for line in lines[:-1]:
        done = subprocess.run(shlex.split(line), cwd=directory, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            return False, f"{line}: {(done.stderr or done.stdout).strip()[-300:]}"
    return True, ""


@pytest.fixture()
def verifiers(sigstore_instance: object, signer_v1: object, cosign_bin: Path):  # type: ignore[no-untyped-def]
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    identity, issuer = signer_v1.identity, signer_v1.issuer  # type: ignore[attr-defined]

    def run(directory: Path, policy: Path | None = None, js_identity: str | None = None) -> dict[str, tuple[bool, str]]:
        return {
            "sigstore-python": _python(directory, root, policy),
            "sigstore-js": _js(directory, root, js_identity or identity, issuer),
            "cosign": _cosign(directory, root, policy, cosign_bin),
        }

    return run


def _cli(directory: Path, *args: str, expect: tuple[str, ...] = EXPECT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "verify", str(directory), *expect, *args],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)


def test_release_verifies_everywhere(signed_release: Path, verifiers, sigstore_instance: object) -> None:  # type: ignore[no-untyped-def]
    names = sorted(p.name for p in signed_release.iterdir() if p.is_file())
    assert names == sorted([
        "SHA256SUMS", "SHA256SUMS.sigstore.json", "manifest-api.oci.json", "manifest-runner.oci.json",
        "provenance-images.intoto.json", "provenance-images.intoto.json.sigstore.json",
        "provenance-summary.intoto.json", "provenance-summary.intoto.json.sigstore.json",
        "sbom-api.cdx.json", "sbom-api.cdx.json.sigstore.json", "sbom-runner.cdx.json",
        "sbom-runner.cdx.json.sigstore.json", "summary.json", "summary.json.sigstore.json",
        # the trial evidence: its listing, every file it lists (one archive), and the plan and result.json
        # files the score is graded from
        "evidence-SHA256SUMS", "evidence-logs.tar.gz", "trial-results.json",
        # the private instance's root in each tool's form (a public-good release carries none)
        "trusted_root.json", "trusted_root.jsonl", "client_trust_config.json",
        # the result as in-toto's test-result attestation (DSSE; attached to the runner image too)
        "test-result.intoto.json", "test-result.intoto.json.sigstore.json",
        # the exports for the charting tools (Bencher, github-action-benchmark), signed through SHA256SUMS
        "bencher.bmf.json", "github-action-benchmark.json"])
    assert [p.name for p in signed_release.iterdir() if p.is_dir()] == ["evidence"]  # nested: not an asset
    results = verifiers(signed_release)
    assert all(ok for ok, _ in results.values()), results
    done = _cli(signed_release, "--trusted-root", str(sigstore_instance.trusted_root))  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    # SHA256SUMS covers every file but itself and its bundle
    listed = {line.split("  ")[1] for line in (signed_release / "SHA256SUMS").read_text().splitlines()}
    assert listed == set(names) - {"SHA256SUMS", "SHA256SUMS.sigstore.json"}


def _flip_signature(bundle: Path) -> None:
    data = json.loads(bundle.read_text())
    holder = data["messageSignature"] if "messageSignature" in data else data["dsseEnvelope"]["signatures"][0]
    key = "signature" if "messageSignature" in data else "sig"
    raw = bytearray(base64.b64decode(holder[key]))
    raw[len(raw) // 2] ^= 0x01
    holder[key] = base64.b64encode(bytes(raw)).decode()
    bundle.write_text(json.dumps(data))


def _flip_certificate(bundle: Path) -> None:
    data = json.loads(bundle.read_text())
    cert = data["verificationMaterial"]["certificate"]
    raw = bytearray(base64.b64decode(cert["rawBytes"]))
    raw[len(raw) // 2] ^= 0x01
    cert["rawBytes"] = base64.b64encode(bytes(raw)).decode()
    bundle.write_text(json.dumps(data))


def _flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


FILES = ["summary.json", "sbom-runner.cdx.json", "sbom-api.cdx.json", "manifest-runner.oci.json",
         "manifest-api.oci.json", "provenance-images.intoto.json", "provenance-summary.intoto.json", "SHA256SUMS",
         "trial-results.json", "evidence-SHA256SUMS", "bencher.bmf.json", "github-action-benchmark.json"]
BUNDLES = [f + ".sigstore.json" for f in FILES
           if not f.startswith(("manifest-", "trial-", "evidence-", "bencher.", "github-action-"))]


@pytest.mark.parametrize("name", FILES)
def test_flipped_byte_in_artifact_is_rejected(name: str, release_copy: Path, verifiers) -> None:  # type: ignore[no-untyped-def]
    _flip_byte(release_copy / name)
    results = verifiers(release_copy)
    assert not any(ok for ok, _ in results.values()), results


@pytest.mark.parametrize("part", ["signature", "certificate"])
@pytest.mark.parametrize("name", BUNDLES)
def test_flipped_byte_in_bundle_is_rejected(name: str, part: str, release_copy: Path, verifiers) -> None:  # type: ignore[no-untyped-def]
    (_flip_signature if part == "signature" else _flip_certificate)(release_copy / name)
    results = verifiers(release_copy)
    assert not any(ok for ok, _ in results.values()), results
    assert name in results["sigstore-python"][1]


@pytest.mark.parametrize(("a", "b"), [
    ("summary.json.sigstore.json", "sbom-runner.cdx.json.sigstore.json"),
    ("provenance-images.intoto.json.sigstore.json", "provenance-summary.intoto.json.sigstore.json"),
    ("SHA256SUMS.sigstore.json", "sbom-api.cdx.json.sigstore.json"),
])
def test_swapped_bundles_are_rejected(a: str, b: str, release_copy: Path, verifiers) -> None:  # type: ignore[no-untyped-def]
    first, second = (release_copy / a).read_bytes(), (release_copy / b).read_bytes()
    (release_copy / a).write_bytes(second)
    (release_copy / b).write_bytes(first)
    results = verifiers(release_copy)
    assert not any(ok for ok, _ in results.values()), results


def test_other_identity_in_policy_is_rejected(signed_release: Path, tmp_path: Path, verifiers,  # type: ignore[no-untyped-def]
                                              signer_v1: object, sigstore_instance: object) -> None:
    other = "https://benchseal.invalid/signers/someone-else"
    policy = _policy(tmp_path / "verify.yaml", other, signer_v1.issuer)  # type: ignore[attr-defined]
    results = verifiers(signed_release, policy=policy, js_identity=other)
    assert not any(ok for ok, _ in results.values()), results
    done = _cli(signed_release, "--trusted-root", str(sigstore_instance.trusted_root), "--policy", str(policy))  # type: ignore[attr-defined]
    assert done.returncode == 1
    assert "SHA256SUMS.sigstore.json: signature does not verify" in done.stderr
    wrong_issuer = _policy(tmp_path / "issuer.yaml", signer_v1.identity, "https://token.actions.githubusercontent.com")  # type: ignore[attr-defined]
    assert not _python(signed_release, sigstore_instance.trusted_root, wrong_issuer)[0]  # type: ignore[attr-defined]


def test_correctly_signed_but_unbound_summary_is_rejected(release_copy: Path, signer_v1: object,
                                                          sigstore_instance: object) -> None:
    """Validly signed by the right signer, but summary.json names an image by tag: rejected."""
    from pipeline.evidence.writer import reseal

    summary = json.loads((release_copy / "summary.json").read_text())
    name = summary["images"]["runner"]["name"]
    summary["images"]["runner"]["ref"] = f"{name}:latest"
    (release_copy / "summary.json").write_text(json.dumps(summary))
    signer_v1.sign_file(release_copy / "summary.json")  # type: ignore[attr-defined]
    reseal(release_copy, signer=signer_v1)  # type: ignore[arg-type]
    with pytest.raises(SummaryInvalid):  # images.runner.ref by tag: the model's digest-pinning rule
        verify_release(release_copy, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    done = _cli(release_copy, "--trusted-root", str(sigstore_instance.trusted_root))  # type: ignore[attr-defined]
    assert done.returncode == 1 and "must be pinned by digest" in done.stderr


def test_missing_bundle_and_extra_file(release_copy: Path, sigstore_instance: object) -> None:
    root = sigstore_instance.trusted_root  # type: ignore[attr-defined]
    (release_copy / "body.md").write_text("release notes are not an asset\n")
    verify_release(release_copy, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root)
    (release_copy / "stray.txt").write_text("x")
    with pytest.raises(ChecksumMismatch) as uncovered:
        verify_release(release_copy, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root)
    assert uncovered.value.subject == "stray.txt"
    (release_copy / "stray.txt").unlink()
    (release_copy / "sbom-api.cdx.json.sigstore.json").unlink()
    with pytest.raises(ChecksumMismatch) as missing:  # SHA256SUMS still lists the bundle
        verify_release(release_copy, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=root)
    assert missing.value.subject == "SHA256SUMS" and "sbom-api.cdx.json.sigstore.json" in str(missing.value)


def test_cli_usage_errors_exit_2(tmp_path: Path, signed_release: Path) -> None:
    assert _cli(tmp_path / "nope").returncode == 2
    assert _cli(signed_release, expect=()).returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: something-else\n")
    done = _cli(signed_release, "--policy", str(bad), "--trusted-root", str(tmp_path / "missing.json"))
    assert done.returncode == 2, done.stderr
    assert _cli(signed_release, "--profile", "nonexistent", "--offline").returncode == 2


def test_wrong_trusted_root_is_rejected(signed_release: Path) -> None:
    """Local bundles do not verify under the public-good root (offline, embedded)."""
    staging = REPO / "tests" / "data" / "sigstore" / "public-good" / "trusted_root.json"
    with pytest.raises(SignatureRefused) as refused:
        verify_release(signed_release, repository=SOURCE_REPO, tag=SOURCE_TAG, trusted_root=staging, profile="local")
    assert refused.value.subject == "SHA256SUMS.sigstore.json"


def _link_summary_outside(release: Path, outside: Path) -> None:
    outside.mkdir()
    shutil.copy2(release / "summary.json", outside / "summary.json")  # same bytes: only the link is wrong
    (release / "summary.json").unlink()
    (release / "summary.json").symlink_to(outside / "summary.json")


def _link_nested_dir_outside(release: Path, outside: Path) -> None:
    outside.mkdir()
    (outside / "x").write_text("x\n")
    (release / "evidence").mkdir(exist_ok=True)
    (release / "evidence" / "sneaky").symlink_to(outside, target_is_directory=True)


def _unlisted_nested_link(release: Path, outside: Path) -> None:
    (release / "evidence" / "trial").mkdir(parents=True)
    (release / "evidence" / "trial" / "hostname").symlink_to("/etc/hostname")


def _nested_fifo(release: Path, outside: Path) -> None:
    (release / "evidence" / "trial").mkdir(parents=True)
    os.mkfifo(release / "evidence" / "trial" / "pipe")


def _body_is_a_directory(release: Path, outside: Path) -> None:
    (release / "body.md" / "anything").mkdir(parents=True)
    (release / "body.md" / "anything" / "payload.sh").write_text("echo hi\n")


@pytest.mark.parametrize("plant, entry", [
    (_link_summary_outside, "summary.json"),
    (_link_nested_dir_outside, "evidence/sneaky"),
    (_unlisted_nested_link, "evidence/trial/hostname"),
    (_nested_fifo, "evidence/trial/pipe"),
    (_body_is_a_directory, "body.md"),
])
def test_a_release_holds_only_regular_files(release_copy: Path, tmp_path: Path, sigstore_instance: object,
                                            plant: Any, entry: str) -> None:
    """Links (anywhere on a path, listed or not), FIFOs and a body.md that is not a file are refused
    before anything they name is read: a link could point outside the release and change between reads."""
    plant(release_copy, tmp_path / "outside")
    with pytest.raises(EntryNotPlain) as refused:
        verify_release(release_copy, repository=SOURCE_REPO, tag=SOURCE_TAG,
                       trusted_root=sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    assert refused.value.subject == entry
