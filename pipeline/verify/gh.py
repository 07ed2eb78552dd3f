"""``gh attestation verify``: the GitHub CLI as a consumer's verifier, beside cosign and sigstore-js.

gh verifies with sigstore-go. Two things differ from the other verifiers and are handled here:

* ``--custom-trusted-root`` reads JSON Lines (one trusted root per line), not the pretty-printed
  ``trusted_root.json`` a release publishes: ``trusted_root_lines`` writes that form;
* gh pins the signer by GitHub's certificate claims, not by a full identity: ``--signer-workflow``
  (the workflow that signed: benchseal's reusable workflow), ``--source-ref`` and ``--repo``/``--owner``
  (the repository whose workflow *ran*: for a reusable workflow that is the caller, the infra
  repository for the score's evidence), ``--predicate-type``, and its OIDC issuer
  (``--cert-oidc-issuer``, Actions' by default). The body's lines pin the exact identity
  (``--cert-identity``: benchseal's benchmark.yml at the builder's ref) rather than gh's
  ``--signer-workflow`` prefix, which would accept any ref of the builder.

gh's own output names only the issuer when a check fails (``verifying with issuer "…"``); the outcome
carries that line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.contracts import GITHUB_ISSUER
from pipeline.core.digests import parse_ref
from pipeline.core.documents import TEST_RESULT as TEST_RESULT_TYPE
from pipeline.core.errors import InfrastructureError
from pipeline.core.fsutil import atomic_write_bytes
from pipeline.core.layout import MANIFESTS, PROVENANCE_IMAGES, PROVENANCE_SUMMARY, SUMMARY, TEST_RESULT, bundle_name
from pipeline.verify.external import (
    CYCLONEDX,
    SLSA_PROVENANCE,
    ImageIdentityPolicy,
    command_profile,
    printed_root,
    release_image_policy,
    result_signer,
)
from pipeline.verify.policy import Builder, Expectation, expectation

# gh got ``attestation verify`` in 2.49; Debian 12's 2.23 has none.
MIN_VERSION = (2, 49)


@dataclass(frozen=True)
class GhOutcome:
    ok: bool
    output: str


@dataclass(frozen=True)
class GhPins:
    """What ``gh attestation verify`` is told to require: each field one flag, all of them required."""

    repository: str  # --repo OWNER/NAME: the repository whose workflow run signed (a reusable workflow's caller)
    identity: str  # --cert-identity: the exact certificate identity (the signing workflow at its ref)
    source_ref: str  # --source-ref refs/...: the ref the run was for
    predicate_type: str  # --predicate-type URI
    issuer: str = GITHUB_ISSUER  # --cert-oidc-issuer

    def flags(self) -> list[str]:
        return ["--repo", self.repository, "--cert-identity", self.identity, "--source-ref", self.source_ref,
                "--predicate-type", self.predicate_type, "--cert-oidc-issuer", self.issuer]


def pins_for(expect: Expectation, predicate_type: str) -> GhPins | None:
    """gh's pins for the signer ``expect`` states; None where gh cannot state it (a signer that is not a
    GitHub Actions workflow run for a caller: the local profile's own identity)."""
    if expect.issuer != GITHUB_ISSUER or expect.workflow_repository is None or expect.workflow_ref is None:
        return None
    return GhPins(repository=expect.workflow_repository, identity=expect.identity, source_ref=expect.workflow_ref,
                  predicate_type=predicate_type, issuer=expect.issuer)


def _version(binary: Path) -> tuple[int, int] | None:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) < 3 or words[0] != "gh":
        return None
    try:
        major, minor = (int(part) for part in words[2].split(".")[:2])
    except ValueError:
        return None
    return major, minor


def gh_path() -> Path | None:
    """A gh that has ``attestation verify``: the one setup links into the state dir's tools (as cosign's:
    an installed benchseal in another venv finds it there), this venv's, then the PATH's."""
    candidates = [paths.home() / "tools" / "bin" / "gh", Path(sys.executable).with_name("gh")]
    found = shutil.which("gh")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        version = _version(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
        if version is not None and version >= MIN_VERSION:
            return candidate
    return None


def trusted_root_lines(trusted_root: Path, out: Path) -> Path:
    """``trusted_root`` as gh's ``--custom-trusted-root`` reads it: one JSON document on one line."""
    document = json.loads(trusted_root.read_text())
    atomic_write_bytes(out, (json.dumps(document, separators=(",", ":")) + "\n").encode())
    return out


def gh_attestation_verify(artifact: Path, bundle: Path, pins: GhPins, *, trusted_root_jsonl: Path | None) -> GhOutcome:
    """Run the real gh offline against one bundle; ok when it exits 0. ``trusted_root_jsonl``: the
    private instance's root (``trusted_root_lines``); None for public-good Sigstore and GitHub's own."""
    return _run_gh(["attestation", "verify", str(artifact), "--bundle", str(bundle), *pins.flags()], trusted_root_jsonl)


def image_pins(policy: ImageIdentityPolicy, predicate_type: str) -> list[str]:
    """gh's pins for an image attestation by ``policy`` (pipeline.verify.external.image_identity): the same
    identity, issuer, source repository, ref and commit cosign's flags pin, and the predicate type."""
    return ["--repo", policy.repository, "--cert-identity", policy.identity, "--source-ref", policy.ref,
            "--source-digest", policy.sha, "--predicate-type", predicate_type, "--cert-oidc-issuer", policy.issuer]


def gh_image_args(ref: str, policy: ImageIdentityPolicy, predicate_type: str, *,
                  trusted_root_jsonl: Path | None) -> list[str]:
    """gh's argv (without the binary) that checks one attestation of the image ``ref``: the Sigstore bundles
    attached to it as OCI referrers (pipeline.attest.referrers), read from the registry."""
    image = parse_ref(ref, "image")
    trust = ["--custom-trusted-root", str(trusted_root_jsonl)] if trusted_root_jsonl is not None else []
    return ["attestation", "verify", f"oci://{image.ref}", "--bundle-from-oci", *image_pins(policy, predicate_type),
            *trust]


def gh_result_args(ref: str, pins: GhPins, *, trusted_root_jsonl: Path | None) -> list[str]:
    """gh's argv (without the binary) that checks the test-result attestation attached to the runner image
    ``ref`` (the release's DSSE bundle as an OCI referrer, pipeline.attest.testresult) by the signer that sealed
    the evidence: ``pins`` are the evidence lines' (``pins_for`` the test-result type: the infra repository as
    ``--repo``, benchmark.yml at the builder's ref, ``refs/heads/main``), as cosign's
    :func:`pipeline.verify.external.result_attestation_args` pins them. No ``--source-digest``: the infra
    repository's commit is no part of the consumer's expectation (cosign's line pins no SHA either)."""
    image = parse_ref(ref, "runner")
    trust = ["--custom-trusted-root", str(trusted_root_jsonl)] if trusted_root_jsonl is not None else []
    return ["attestation", "verify", f"oci://{image.ref}", "--bundle-from-oci", *pins.flags(), *trust]


def gh_verify_image(ref: str, policy: ImageIdentityPolicy, predicate_type: str, *,
                    trusted_root_jsonl: Path | None) -> GhOutcome:
    """Run the real gh against the image's attestations in its registry (a loopback registry is plain
    HTTP to gh's registry client); ok when it exits 0."""
    return _run_gh(gh_image_args(ref, policy, predicate_type, trusted_root_jsonl=None), trusted_root_jsonl)


def _run_gh(args: list[str], trusted_root_jsonl: Path | None) -> GhOutcome:
    gh = gh_path()
    if gh is None:
        raise InfrastructureError(f"no gh >= {MIN_VERSION[0]}.{MIN_VERSION[1]} with 'attestation verify' found "
                                  "(make setup installs one into the project's venv)")
    argv = [str(gh), *args]
    if trusted_root_jsonl is not None:
        argv += ["--custom-trusted-root", str(trusted_root_jsonl)]
    # Offline: no GitHub API call is made with --bundle / --bundle-from-oci, but gh insists on a token being
    # set; it is never sent anywhere. Its config and caches go to a directory of their own, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="benchseal-gh-") as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GH_TOKEN": "unused-offline", "HOME": home,
               "GH_CONFIG_DIR": home, "XDG_CACHE_HOME": home, "GH_NO_UPDATE_NOTIFIER": "1", "NO_COLOR": "1"}
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)
    return GhOutcome(done.returncode == 0, (done.stderr + done.stdout).strip())


# Each attestation of a release and what its statement is about, with the predicate type it must carry
# (stated here, never read from the statement being checked).
_ATTESTED = ((PROVENANCE_SUMMARY, SLSA_PROVENANCE), (TEST_RESULT, TEST_RESULT_TYPE))


def gh_commands(directory: Path, *, repository: str, tag: str, infra_repository: str | None,
                builder: Builder | None, trusted_root: Path | None = None, profile: str | None = None,
                gh: str = "gh") -> list[str]:
    """The ``gh attestation verify`` lines for a release directory (run inside it), beside the cosign
    lines of :func:`pipeline.verify.external.cosign_commands` and with the same expectation: the
    evidence's provenance and test result of summary.json, and the images' provenance of each published
    manifest. ``trusted_root``: the private instance's root; the lines name its JSON Lines form beside
    it (the instance writes both). Public-good releases need none. No GitHub signer to pin: no lines."""
    chosen = command_profile(directory, profile)
    expect = expectation(None, chosen, repository=repository, tag=tag, infra_repository=infra_repository,
                         builder=builder)
    root = printed_root(directory, trusted_root, profile)
    trust = ["--custom-trusted-root", str(root.with_suffix(".jsonl"))] if root is not None else []
    lines: list[str] = []
    for statement, predicate_type in _ATTESTED:
        pins = pins_for(expect, predicate_type)
        if pins is not None and (directory / bundle_name(statement)).is_file():
            lines.append(shlex.join([gh, "attestation", "verify", SUMMARY, "--bundle", bundle_name(statement),
                                     *pins.flags(), *trust]))
    pins = pins_for(expect, SLSA_PROVENANCE)
    if pins is not None and (directory / bundle_name(PROVENANCE_IMAGES)).is_file():
        for manifest in sorted(MANIFESTS.values()):
            if (directory / manifest).is_file():
                lines.append(shlex.join([gh, "attestation", "verify", manifest, "--bundle",
                                         bundle_name(PROVENANCE_IMAGES), *pins.flags(), *trust]))
    return lines


def gh_image_lines(directory: Path, *, repository: str, tag: str, builder: Builder | None,
                   trusted_root: Path | None = None, profile: str | None = None, gh: str = "gh",
                   infra_repository: str | None = None) -> list[str]:
    """The ``gh attestation verify oci://REF --bundle-from-oci`` lines for the release's runner and api
    images, beside :func:`pipeline.verify.external.image_command_lines`' cosign lines and with the same
    signer (:func:`pipeline.verify.external.release_image_policy`): each image's SLSA provenance and SBOM,
    read from its registry; then, where cosign's line for it is printed
    (:func:`pipeline.verify.external.result_signer`), the runner's test-result attestation by the evidence's
    signer (:func:`gh_result_args`; a signer gh cannot pin, the local profile's own identity: no line).
    ``trusted_root``: the private instance's root; the lines name the JSON Lines form beside the published
    root (as :func:`gh_commands`). gh reads GH_TOKEN even offline (it sends it nowhere here): the consumer's
    own login serves. No summary.json: no lines."""
    found = release_image_policy(directory, repository, tag, builder=builder)
    if found is None:
        return []
    summary, policy = found
    root = printed_root(directory, trusted_root, profile)
    jsonl = root.with_suffix(".jsonl") if root is not None else None
    lines = [shlex.join([gh, *gh_image_args(image, policy, predicate_type, trusted_root_jsonl=jsonl)])
             for image in (summary.images.runner.ref, summary.images.api.ref)
             for predicate_type in (SLSA_PROVENANCE, CYCLONEDX)]
    seal = result_signer(directory, summary, repository=repository, tag=tag, profile=profile,
                         infra_repository=infra_repository, builder=builder)
    pins = pins_for(seal, TEST_RESULT_TYPE) if seal is not None else None
    if pins is not None:
        lines.append(shlex.join([gh, *gh_result_args(summary.images.runner.ref, pins, trusted_root_jsonl=jsonl)]))
    return lines
