"""The two independent verifiers beside sigstore-python: cosign and sigstore-js.

Also the consumer's command lines (``sha256sum -c``, ``cosign verify-blob ...``,
``benchseal verify --repo --tag``) for the release body: ``cosign_commands(dir, repository=, tag=)``.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat import asn1

from pipeline import paths
from pipeline.contracts import GITHUB_ISSUER
from pipeline.errors import InfrastructureError
from pipeline.evidence import sigstore_local
from pipeline.layout import (
    BUNDLE_SUFFIX,
    CHECKSUMS,
    CHECKSUMS_BUNDLE,
    MANIFESTS,
    PROVENANCE_IMAGES,
    PROVENANCE_SUMMARY,
    SUMMARY,
    bundle_name,
)
from pipeline.node import node_binary, node_env
from pipeline.verify.policy import expectation

SIGSTORE_JS = Path(__file__).with_name("sigstore_js_verify.js")
# What it requires (found through pipeline.node: $BENCHSEAL_NODE_MODULES or <project>/node_modules).
SIGSTORE_JS_PACKAGES = ("@sigstore/bundle", "@sigstore/protobuf-specs", "@sigstore/verify")
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
_ISSUER_OID = "1.3.6.1.4.1.57264.1.8"


def cosign_path() -> Path | None:
    """The cosign that scripts/install-tools.sh installed, else one on PATH."""
    tools = paths.home() / "tools" / "bin" / "cosign"
    if tools.exists():
        return tools
    found = shutil.which("cosign")
    return Path(found) if found else None


# cosign reads its trust from these when set: they come only from the endpoints (``environ``), never
# from whatever the calling process inherited (a leftover test setting would replace public-good).
_COSIGN_TRUST_VARIABLES = frozenset({
    "SIGSTORE_ROOT_FILE", "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE", "SIGSTORE_REKOR_PUBLIC_KEY",
    "SIGSTORE_TSA_CERTIFICATE_FILE", "SIGSTORE_TRUST_REKOR_API_PUBLIC_KEY", "TUF_ROOT", "TUF_MIRROR",
})


def cosign_environment(endpoint_env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment cosign runs with: the inherited one without any trust setting, then the endpoints'."""
    base = os.environ if inherited is None else inherited
    return {**{k: v for k, v in base.items() if k not in _COSIGN_TRUST_VARIABLES}, **endpoint_env}


@dataclass(frozen=True)
class Outcome:
    ok: bool
    output: str


def cosign_verify(target: Path, bundle: Path, identity: str, issuer: str, *, trusted_root: Path | None,
                  dsse: bool = False, check_claims: bool = True) -> Outcome:
    """Run the real cosign; ok when it exits 0."""
    cosign = cosign_path()
    if cosign is None:
        raise InfrastructureError("cosign is not installed (run scripts/install-tools.sh)")
    argv = [str(cosign), *_cosign_args(str(target), str(bundle), identity, issuer,
                                        str(trusted_root) if trusted_root else None, dsse, check_claims)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=cosign_environment({}))
    return Outcome(done.returncode == 0, (done.stderr + done.stdout).strip())


def _cosign_args(target: str, bundle: str, identity: str, issuer: str, trusted_root: str | None,
                 dsse: bool, check_claims: bool) -> list[str]:
    verb = ["verify-blob-attestation", "--type", SLSA_PROVENANCE] if dsse else ["verify-blob"]
    args = [*verb, "--new-bundle-format", "--bundle", bundle,
            "--certificate-identity", identity, "--certificate-oidc-issuer", issuer]
    if dsse and not check_claims:
        args.append("--check-claims=false")
    if trusted_root:
        args += ["--trusted-root", trusted_root, "--offline"]
    return [*args, target]


def sigstore_js_verify(trusted_root: Path, jobs: list[dict[str, str | None]]) -> list[Outcome]:
    """Verify many bundles with @sigstore/verify in one node process (offline)."""
    node, env = node_binary(), node_env(SIGSTORE_JS_PACKAGES)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"trusted_root": str(trusted_root), "jobs": jobs}, handle)
        spec = Path(handle.name)
    try:
        done = subprocess.run([node, str(SIGSTORE_JS), str(spec)], capture_output=True, text=True, check=False,
                              timeout=120, cwd=str(paths.REPO_ROOT), env=env)
    finally:
        spec.unlink(missing_ok=True)
    if done.returncode not in (0, 1):
        raise InfrastructureError(f"sigstore-js verifier failed: {done.stderr.strip()}")
    results = json.loads(done.stdout)["results"]
    return [Outcome(bool(r["ok"]), str(r.get("error") or "")) for r in results]


def _is_dsse(bundle: Path) -> bool:
    try:
        data = json.loads(bundle.read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "dsseEnvelope" in data


def bundle_issuer(bundle: Path) -> str | None:
    """The OIDC issuer recorded in a bundle's signing certificate (None if unreadable)."""
    try:
        data = json.loads(bundle.read_text("utf-8"))
        material = data["verificationMaterial"]
        raw = (material.get("certificate") or material["x509CertificateChain"]["certificates"][0])["rawBytes"]
        return certificate_issuer(x509.load_der_x509_certificate(base64.b64decode(raw)))
    except (OSError, KeyError, IndexError, TypeError, ValueError, x509.ExtensionNotFound):
        return None


def certificate_issuer(cert: x509.Certificate) -> str:
    """Fulcio's OIDC issuer (v2) extension: a DER UTF8String, decoded by ``cryptography``'s
    ASN.1 reader (any length form; a value of another type raises ValueError)."""
    ext = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(_ISSUER_OID))
    if not isinstance(ext.value, x509.UnrecognizedExtension):
        raise ValueError(f"extension {_ISSUER_OID} is not an opaque DER value")
    issuer: str = asn1.decode_der(str, ext.value.value)
    return issuer


def local_benchseal() -> str:
    """The ``benchseal`` of this environment (the venv's console script), else the one on PATH."""

    found = shutil.which("benchseal")
    if found:
        return found
    sibling = Path(sys.executable).with_name("benchseal")
    return str(sibling) if sibling.is_file() else "benchseal"


def command_profile(directory: Path, profile: str | None) -> str:
    """Which policy profile the printed commands use: explicit, else production for bundles
    signed with a GitHub Actions identity (what benchmark.yml's seal job makes; ``release
    --local`` signs with such identities too, only under another root), else local (the private
    instance's own identity, or a bundle whose issuer cannot be read: nothing a consumer could
    check against the production identity either).

    This only chooses how to *print* the producer's own release; ``benchseal verify`` never
    picks anything from the release it checks.
    """
    if profile is not None:
        return profile
    if bundle_issuer(directory / CHECKSUMS_BUNDLE) == GITHUB_ISSUER:
        return "production"
    return "local"


def cosign_commands(directory: Path, *, repository: str, tag: str, policy: Path | None = None,
                    trusted_root: Path | None = None, profile: str | None = None, cosign: str | None = None,
                    benchseal: str = "benchseal", infra_repository: str | None = None) -> list[str]:
    """Consumer command lines for the release of ``repository`` at ``tag``, to run inside the
    release directory: ``sha256sum -c``, one cosign line per bundle, and ``benchseal verify``
    with the expectation stated explicitly.

    The identity and issuer come from the policy profile with ``repository``/``tag`` (and
    ``infra_repository``, the repository whose benchmark.yml sealed it, for the production
    profile) filled in (never from the release). Bundles made by the local instance get ``--trusted-root``
    (that instance's root) and ``--offline``; public-good bundles need neither.
    """

    directory = Path(directory)
    chosen = command_profile(directory, profile)
    expect = expectation(policy, chosen, repository=repository, tag=tag, infra_repository=infra_repository)
    root = trusted_root
    if chosen == "local" and root is None:
        default_root = sigstore_local.default_state() / "trusted_root.json"
        root = default_root if default_root.is_file() else None
    binary = cosign or ("cosign" if shutil.which("cosign") or root is None else str(cosign_path() or "cosign"))
    lines = [f"sha256sum -c {CHECKSUMS}"]
    for bundle in sorted(directory.glob(bundle_name("*"))):
        target = bundle.name.removesuffix(BUNDLE_SUFFIX)
        dsse = _is_dsse(bundle)
        if dsse and target == PROVENANCE_SUMMARY:
            # Check the claim that matters: summary.json is the statement's subject.
            args = _cosign_args(SUMMARY, bundle.name, expect.identity, expect.issuer,
                                str(root) if root else None, True, True)
        elif dsse and target == PROVENANCE_IMAGES:
            # The subjects are image manifests: check each published manifest is one.
            for manifest in (directory / name for name in sorted(MANIFESTS.values()) if (directory / name).is_file()):
                lines.append(shlex.join([binary, *_cosign_args(manifest.name, bundle.name, expect.identity,
                                                               expect.issuer, str(root) if root else None, True, True)]))
            continue
        else:
            args = _cosign_args(target, bundle.name, expect.identity, expect.issuer,
                                str(root) if root else None, dsse, False)
        lines.append(shlex.join([binary, *args]))
    verify = [benchseal, "verify", ".", "--repo", expect.repository, "--tag", expect.tag]
    if expect.infra_repository is not None:
        verify += ["--infra-repo", expect.infra_repository]
    if policy is not None:
        verify += ["--policy", str(policy)]
    if root is not None:
        verify += ["--trusted-root", str(root), "--offline"]
    if chosen != ("local" if root is not None else "production"):
        verify += ["--profile", chosen]
    lines.append(shlex.join(verify))
    return lines
