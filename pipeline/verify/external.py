"""The two independent verifiers beside sigstore-python: cosign and sigstore-js.

Also the consumer's command lines (``sha256sum -c``, ``cosign verify-blob ...``, ``cosign verify``
and ``verify-attestation`` for the images, ``benchseal verify --repo --tag --infra-repo --builder``)
for the release body: ``cosign_commands(dir, repository=, tag=, infra_repository=, builder=)``; and
the one home of an image's expected signer
(``image_identity``) and of the cosign argv that checks it (``image_check_args``), used by the
worker, ``benchseal verify-image``, ``benchseal verify --images`` and the release body alike.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat import asn1
from cryptography.hazmat.primitives import serialization

from pipeline.core import paths
from pipeline.core.contracts import COMMIT_RE, GITHUB_ISSUER, builder_problem, validate_git_tag, validate_repository
from pipeline.core.digests import parse_ref
from pipeline.core.documents import TEST_RESULT as TEST_RESULT_TYPE
from pipeline.core.documents import ReleaseSummary, load_document, result_verdict
from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_bytes
from pipeline.core.layout import (
    BUNDLE_SUFFIX,
    CHECKSUMS,
    CHECKSUMS_BUNDLE,
    CLIENT_TRUST_CONFIG,
    MANIFESTS,
    PROVENANCE_IMAGES,
    PROVENANCE_SUMMARY,
    SUMMARY,
    TEST_RESULT,
    TRUSTED_ROOT,
    bundle_name,
)
from pipeline.core.node import node_binary, node_env
from pipeline.verify.policy import RELEASE_WORKFLOW, Builder, Expectation, expectation

SIGSTORE_JS = Path(__file__).with_name("sigstore_js_verify.js")
# What it requires (found through pipeline.core.node: $BENCHSEAL_NODE_MODULES or <project>/node_modules).
SIGSTORE_JS_PACKAGES = ("@sigstore/bundle", "@sigstore/protobuf-specs", "@sigstore/verify")
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
_ISSUER_OID = "1.3.6.1.4.1.57264.1.8"


def cosign_path() -> Path | None:
    """The cosign that scripts/install-tools.sh installed in the state dir, else the one setup links
    beside this interpreter (a service whose BENCHSEAL_HOME is elsewhere, such as the systemd worker,
    finds the installation's own), else one on PATH."""
    for candidate in (paths.home() / "tools" / "bin" / "cosign", Path(sys.executable).parent / "cosign"):
        if candidate.exists():
            return candidate
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


# --- images: who must have signed them, and the cosign argv that checks it -------------------------

# cosign's --type names and the predicate types they stand for.
CYCLONEDX = "https://cyclonedx.org/bom"
ATTESTATION_TYPES = {"slsaprovenance1": SLSA_PROVENANCE, "cyclonedx": CYCLONEDX}
_WORKFLOW_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,100}\.ya?ml\Z")
_REF_RE = re.compile(r"\Arefs/(heads|tags)/[A-Za-z0-9][A-Za-z0-9._/-]{0,199}\Z")
_LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ImageIdentityPolicy:
    """Whose signature an image must carry: one workflow of one repository at one exact ref and
    one exact commit. Built only by :func:`image_identity`; every field is always pinned."""

    identity: str  # the certificate SAN: https://github.com/OWNER/REPO/.github/workflows/F@REF
    issuer: str
    repository: str  # GitHub workflow repository extension (1.3.6.1.4.1.57264.1.5)
    ref: str  # GitHub workflow ref extension (1.3.6.1.4.1.57264.1.6)
    sha: str  # GitHub workflow SHA extension (1.3.6.1.4.1.57264.1.3): the payload's commit

    def flags(self) -> list[str]:
        # cosign compares each extension with the value given byte for byte: an absent extension,
        # another case or a prefix of the SHA fails.
        return ["--certificate-identity", self.identity, "--certificate-oidc-issuer", self.issuer,
                "--certificate-github-workflow-repository", self.repository,
                "--certificate-github-workflow-ref", self.ref,
                "--certificate-github-workflow-sha", self.sha]

    def describe(self) -> str:
        return f"{self.identity} at commit {self.sha}"


def image_identity(repository: str, tag: str, commit: str, *, workflow: str = "tag.yml",
                   ref: str = "tag", builder: str | None = None) -> ImageIdentityPolicy:
    """The one expectation every image check uses: ``workflow`` of ``repository`` at ``ref``
    (``tag``: ``refs/tags/<tag>``, else one exact ``refs/heads/NAME`` / ``refs/tags/NAME``), run at
    exactly ``commit``, for every signer kind: a tag can be deleted and pushed again at another
    commit, so the tag alone does not name the release's source.

    ``builder``: the signature comes from a reusable workflow (benchseal's, pinned by the caller):
    the certificate identity is the builder's ``job_workflow_ref``, while the workflow repository,
    ref and SHA extensions still name the source (``repository`` at ``ref`` and ``commit``), as
    Fulcio certifies them for a reusable workflow: the builder cannot be forged by the caller, and
    the source cannot be swapped by the builder.

    Every argument comes from the payload, the infra policy or the consumer's expectation, never
    from the image or its signatures."""
    validate_repository(repository, "repository")
    validate_git_tag(tag, "tag")
    if not isinstance(workflow, str) or not _WORKFLOW_RE.match(workflow):
        raise ValidationError("workflow", "must be a workflow file name ending in .yml or .yaml", workflow)
    if not isinstance(commit, str) or not COMMIT_RE.match(commit):
        raise ValidationError("commit", "must be the source commit as 40 lowercase hex", commit)
    if ref == "tag":
        ref = f"refs/tags/{tag}"
    elif (not isinstance(ref, str) or not _REF_RE.match(ref) or ".." in ref or "//" in ref
          or ref.endswith(("/", ".", ".lock"))):
        raise ValidationError("ref", "must be 'tag' or one exact refs/heads/NAME or refs/tags/NAME (no patterns)", ref)
    if builder is not None:
        problem = builder_problem(builder)
        if problem:
            raise ValidationError("builder", problem, builder)
        identity = f"https://github.com/{builder}"
    else:
        identity = f"https://github.com/{repository}/.github/workflows/{workflow}@{ref}"
    return ImageIdentityPolicy(identity=identity, issuer=GITHUB_ISSUER, repository=repository, ref=ref, sha=commit)


def builder_image_identity(builder: Builder, repository: str, tag: str, commit: str, *,
                           ref: str = "tag") -> ImageIdentityPolicy:
    """The images of ``repository``'s release at ``tag`` and ``commit``, signed by ``builder``'s
    reusable release.yml (what ``benchseal verify --images --builder`` and the release body expect)."""
    return image_identity(repository, tag, commit, ref=ref, builder=builder.workflow(RELEASE_WORKFLOW))


def is_loopback_registry(ref: str) -> bool:
    return parse_ref(ref, "image").registry.split(":", 1)[0] in _LOOPBACK


def image_check_args(ref: str, policy: ImageIdentityPolicy, *, offline: bool,
                     attestations: tuple[str, ...] = tuple(ATTESTATION_TYPES),
                     allow_http_registry: bool = False, trusted_root: Path | None = None) -> list[list[str]]:
    """cosign's argv (without the binary) for the signature and each attestation of the image
    ``ref`` by ``policy``: what ``benchseal verify-image`` and the worker run, and what the release
    body prints. A loopback registry is plain HTTP.

    The signature (``cosign sign``) and the attestations (pipeline.attest.images) are Sigstore bundles
    attached as OCI referrers, checked in cosign 3's bundle format (its default) against, for a private
    instance, its ``trusted_root`` (public-good: cosign's TUF root); each attestation with its predicate
    type's URI, which cosign 3.1 compares (2.5 did not: GHSA-w6c6-c85g-mmv6). cosign 3's ``verify`` of
    an image with bundles accepts any bundle of the signer about the digest (a signature's or an
    attestation's). The legacy ``.sig`` / ``.att`` forms are not read: no fallback between the two."""
    image = parse_ref(ref, "image")
    unknown = [a for a in attestations if a not in ATTESTATION_TYPES]
    if unknown:
        raise ValidationError("attestations", f"must be among {sorted(ATTESTATION_TYPES)}", unknown)
    http = ["--allow-http-registry"] if allow_http_registry or is_loopback_registry(image.ref) else []
    offline_flag = ["--offline"] if offline else []
    trust = ["--trusted-root", str(trusted_root)] if trusted_root is not None else []
    return [["verify", *policy.flags(), *trust, *offline_flag, *http, image.ref],
            *(["verify-attestation", "--new-bundle-format", "--type", ATTESTATION_TYPES[kind], *policy.flags(),
               *trust, *offline_flag, *http, image.ref] for kind in attestations)]


def result_attestation_args(ref: str, expect: Expectation, *, trusted_root: Path | None) -> list[str]:
    """cosign's argv (without the binary) that checks the test-result attestation attached to the runner
    image ``ref`` (the release's DSSE bundle as an OCI referrer, ``pipeline.attest.testresult``) by the
    signer that sealed the evidence (``expect``: the same identity, issuer and workflow repository and
    ref pins as every evidence bundle): what the release body prints and the local release runs."""
    image = parse_ref(ref, "runner")
    return ["verify-attestation", "--new-bundle-format", "--type", TEST_RESULT_TYPE, *expectation_flags(expect),
            *(["--trusted-root", str(trusted_root), "--offline"] if trusted_root is not None else []),
            *(["--allow-http-registry"] if is_loopback_registry(image.ref) else []), image.ref]


def cosign_trust_env(trusted_root: Path, workdir: Path) -> dict[str, str]:
    """A private instance's trusted_root.json as the PEM files cosign reads from
    ``SIGSTORE_ROOT_FILE`` / ``SIGSTORE_CT_LOG_PUBLIC_KEY_FILE`` / ``SIGSTORE_REKOR_PUBLIC_KEY``
    (what cosign 2.5 needed for a ``.sig`` image signature; cosign 3, given ``--trusted-root`` on every
    image line, does not read them), written into ``workdir``; returns the variables."""
    root = json.loads(trusted_root.read_text())
    fulcio = b"".join(
        x509.load_der_x509_certificate(base64.b64decode(cert["rawBytes"])).public_bytes(serialization.Encoding.PEM)
        for ca in _current(root.get("certificateAuthorities", []))
        for cert in ca["certChain"]["certificates"]
    )
    ct_logs = _current(root.get("ctlogs", []))
    rekor_logs = [t for t in _current(root.get("tlogs", [])) if not t.get("baseUrl", "").endswith("/rekor2")]
    if not fulcio or not ct_logs or not rekor_logs:
        raise InfrastructureError(f"{trusted_root}: no current Fulcio CA, CT log or Rekor v1 log to trust")
    files = {
        "SIGSTORE_ROOT_FILE": ("fulcio.pem", fulcio),
        "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": ("ctlog.pem", _pem_key(ct_logs[-1]["publicKey"]["rawBytes"])),
        "SIGSTORE_REKOR_PUBLIC_KEY": ("rekor.pem", _pem_key(rekor_logs[-1]["publicKey"]["rawBytes"])),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    env = {}
    for variable, (name, data) in files.items():
        atomic_write_bytes(workdir / name, data)
        env[variable] = str(workdir / name)
    return env


def _current(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries still valid (no end): a private instance keeps retired keys with an end date."""
    def end(entry: dict[str, Any]) -> object:
        holder = entry.get("publicKey", entry)
        return (holder.get("validFor") or {}).get("end")
    return [e for e in entries if not end(e)]


def _pem_key(raw: str) -> bytes:
    key = serialization.load_der_public_key(base64.b64decode(raw))
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    output: str


def cosign_verify(target: Path, bundle: Path, identity: str, issuer: str, *, trusted_root: Path | None,
                  dsse: bool = False, check_claims: bool = True, workflow_repository: str | None = None,
                  workflow_ref: str | None = None) -> Outcome:
    """Run the real cosign; ok when it exits 0. ``workflow_repository`` / ``workflow_ref``: the
    certificate's GitHub workflow extensions must be exactly these (a reusable workflow's caller)."""
    cosign = cosign_path()
    if cosign is None:
        raise InfrastructureError("cosign is not installed (run scripts/install-tools.sh)")
    flags = signer_flags(identity, issuer, workflow_repository, workflow_ref)
    argv = [str(cosign), *_cosign_args(str(target), str(bundle), flags,
                                        str(trusted_root) if trusted_root else None, dsse, check_claims)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=cosign_environment({}))
    return Outcome(done.returncode == 0, (done.stderr + done.stdout).strip())


def signer_flags(identity: str, issuer: str, workflow_repository: str | None = None,
                 workflow_ref: str | None = None) -> list[str]:
    """cosign's flags for a blob signer: identity and issuer, and the caller of a reusable workflow
    (cosign compares the GitHub workflow repository / ref extensions byte for byte; an absent
    extension fails)."""
    flags = ["--certificate-identity", identity, "--certificate-oidc-issuer", issuer]
    if workflow_repository is not None:
        flags += ["--certificate-github-workflow-repository", workflow_repository]
    if workflow_ref is not None:
        flags += ["--certificate-github-workflow-ref", workflow_ref]
    return flags


def expectation_flags(expect: Expectation) -> list[str]:
    return signer_flags(expect.identity, expect.issuer, expect.workflow_repository, expect.workflow_ref)


def _cosign_args(target: str, bundle: str, signer: list[str], trusted_root: str | None,
                 dsse: bool, check_claims: bool, predicate_type: str = SLSA_PROVENANCE) -> list[str]:
    verb = ["verify-blob-attestation", "--type", predicate_type] if dsse else ["verify-blob"]
    args = [*verb, "--new-bundle-format", "--bundle", bundle, *signer]
    if dsse and not check_claims:
        args.append("--check-claims=false")
    if trusted_root:
        args += ["--trusted-root", trusted_root, "--offline"]
    return [*args, target]


def sigstore_js_jobs(directory: Path, expect: Expectation) -> list[dict[str, str | None]]:
    """The sigstore-js jobs for every bundle of a release directory (and its SHA256SUMS), each held
    to the same signer as ``benchseal verify`` holds it: identity, issuer and, when the profile pins
    them, the caller's workflow repository and ref (both Fulcio forms of each)."""
    return signer_jobs(directory, expect.identity, expect.issuer, expect.workflow_repository, expect.workflow_ref)


def signer_jobs(directory: Path, identity: str, issuer: str, workflow_repository: str | None,
                workflow_ref: str | None) -> list[dict[str, str | None]]:
    """:func:`sigstore_js_jobs` with the signer stated flag by flag (``benchseal sigstore-js``)."""
    jobs: list[dict[str, str | None]] = [{"checksums": str(directory / CHECKSUMS)}]
    for bundle in sorted(directory.glob(bundle_name("*"))):
        target = directory / bundle.name.removesuffix(BUNDLE_SUFFIX)
        dsse = _is_dsse(bundle)
        jobs.append({"bundle": str(bundle), "identity": identity, "issuer": issuer,
                     "workflow_repository": workflow_repository, "workflow_ref": workflow_ref,
                     "artifact": None if dsse else str(target), "payload_file": str(target) if dsse else None})
    return jobs


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


def instance_root(directory: Path, trusted_root: Path | None, profile: str | None = None) -> Path | None:
    """The private instance's trusted root file on this machine: the one given, else for a local-profile
    release the instance's own (when there is one), else none (public-good)."""
    if trusted_root is None and command_profile(directory, profile) == "local":
        default_root = paths.local_trusted_root()
        return default_root if default_root.is_file() else None
    return trusted_root


def printed_root(directory: Path, trusted_root: Path | None, profile: str | None = None) -> Path | None:
    """The trusted root the printed commands name: when a root is needed (``instance_root``) and the
    release carries its signer's root (``trusted_root.json``, pipeline.evidence.trust), that asset by
    its name (the commands run inside the release; its JSON Lines twin is ``trusted_root.jsonl``), so
    the body names no path of the publishing host; else the instance's file; else none (public-good)."""
    root = instance_root(directory, trusted_root, profile)
    if root is not None and (directory / TRUSTED_ROOT).is_file():
        return Path(TRUSTED_ROOT)
    return root


def cosign_commands(directory: Path, *, repository: str, tag: str, policy: Path | None = None,
                    trusted_root: Path | None = None, profile: str | None = None, cosign: str | None = None,
                    benchseal: str = "benchseal", infra_repository: str | None = None,
                    builder: Builder | None = None) -> list[str]:
    """Consumer command lines for the release of ``repository`` at ``tag``, to run inside the
    release directory: ``sha256sum -c``, one cosign line per bundle, and ``benchseal verify``
    with the expectation stated explicitly (the images' own lines, which need their registry, are
    :func:`image_command_lines`).

    The signer comes from the policy profile with ``repository``/``tag``, ``infra_repository``
    (whose benchmark the evidence is of) and ``builder`` (whose reusable benchmark.yml sealed it)
    filled in, never from the release: for the production profile the builder's identity, and
    ``--certificate-github-workflow-repository``/``-ref`` pinning the infra repository on main.
    Bundles made by the local instance get ``--trusted-root`` (that instance's root) and
    ``--offline``; public-good bundles need neither.
    """

    directory = Path(directory)
    chosen = command_profile(directory, profile)
    expect = expectation(policy, chosen, repository=repository, tag=tag, infra_repository=infra_repository,
                         builder=builder)
    signer = expectation_flags(expect)
    root = printed_root(directory, trusted_root, profile)
    binary = cosign or ("cosign" if shutil.which("cosign") or root is None else str(cosign_path() or "cosign"))
    lines = [f"sha256sum -c {CHECKSUMS}"]
    for bundle in sorted(directory.glob(bundle_name("*"))):
        target = bundle.name.removesuffix(BUNDLE_SUFFIX)
        dsse = _is_dsse(bundle)
        if dsse and target == PROVENANCE_SUMMARY:
            # Check the claim that matters: summary.json is the statement's subject.
            args = _cosign_args(SUMMARY, bundle.name, signer, str(root) if root else None, True, True)
        elif dsse and target == TEST_RESULT:
            # The result's subjects are the runner image (checked in its registry) and summary.json.
            args = _cosign_args(SUMMARY, bundle.name, signer, str(root) if root else None, True, True,
                                TEST_RESULT_TYPE)
        elif dsse and target == PROVENANCE_IMAGES:
            # The subjects are image manifests: check each published manifest is one.
            for manifest in (directory / name for name in sorted(MANIFESTS.values()) if (directory / name).is_file()):
                lines.append(shlex.join([binary, *_cosign_args(manifest.name, bundle.name, signer,
                                                               str(root) if root else None, True, True)]))
            continue
        else:
            args = _cosign_args(target, bundle.name, signer, str(root) if root else None, dsse, False)
        lines.append(shlex.join([binary, *args]))
    verify = [benchseal, "verify", ".", "--repo", expect.repository, "--tag", expect.tag]
    if expect.infra_repository is not None:
        verify += ["--infra-repo", expect.infra_repository]
    if expect.builder is not None:
        verify += ["--builder", str(expect.builder)]
    if policy is not None:
        verify += ["--policy", str(policy)]
    if root is not None:
        verify += ["--trusted-root", str(root), "--offline"]
    if chosen != ("local" if root is not None else "production"):
        verify += ["--profile", chosen]
    lines.append(shlex.join(verify))
    return lines


def sigstore_commands(directory: Path, *, repository: str, tag: str, trusted_root: Path | None = None,
                      profile: str | None = None, infra_repository: str | None = None,
                      builder: Builder | None = None, python: str = "python",
                      benchseal: str = "benchseal") -> list[str]:
    """sigstore-python's and sigstore-js's lines for the release body, with the signer
    :func:`cosign_commands` pins (run inside the release directory).

    sigstore-python's own CLI (``python -m sigstore verify github|identity``): the message-signed files in one
    line (each beside its ``FILE.sigstore.json``), then summary.json against its provenance (the file's digest
    must be a subject). A private instance's release names its published ``client_trust_config.json``
    (``--trust-config``, ``--offline``); without one no sigstore-python line. Its CLI pins no predicate type.

    sigstore-js: ``benchseal sigstore-js``, every bundle through ``@sigstore/verify`` (sigstore-js's own CLI,
    ``@sigstore/cli`` 0.10, reads trust from TUF only and pins no workflow repository or ref, so it can check
    neither a private instance's release nor the caller). It takes a trusted root file: printed only when the
    release names one (``trusted_root.json``)."""
    directory = Path(directory)
    expect = expectation(None, command_profile(directory, profile), repository=repository, tag=tag,
                         infra_repository=infra_repository, builder=builder)
    root = printed_root(directory, trusted_root, profile)
    github = expect.issuer == GITHUB_ISSUER and expect.workflow_repository is not None and expect.workflow_ref is not None
    pins = (["github", "--cert-identity", expect.identity, "--repository", str(expect.workflow_repository),
             "--ref", str(expect.workflow_ref)] if github else
            ["identity", "--cert-identity", expect.identity, "--cert-oidc-issuer", expect.issuer])
    lines: list[str] = []
    config = root is not None and (directory / CLIENT_TRUST_CONFIG).is_file()
    if root is None or config:
        head = [python, "-m", "sigstore", *(["--trust-config", CLIENT_TRUST_CONFIG] if config else []), "verify",
                pins[0], *(["--offline"] if config else []), *pins[1:]]
        blobs = [bundle.name.removesuffix(BUNDLE_SUFFIX) for bundle in sorted(directory.glob(bundle_name("*")))
                 if not _is_dsse(bundle)]
        # SHA256SUMS first: with `sha256sum -c` it covers every asset.
        blobs.sort(key=lambda name: name != CHECKSUMS)
        if blobs:
            lines.append(shlex.join([*head, *blobs]))
        if (directory / bundle_name(PROVENANCE_SUMMARY)).is_file():
            lines.append(shlex.join([*head, "--bundle", bundle_name(PROVENANCE_SUMMARY), SUMMARY]))
    if root is not None:
        js = [benchseal, "sigstore-js", ".", "--trusted-root", str(root), "--cert-identity", expect.identity,
              "--cert-oidc-issuer", expect.issuer]
        if expect.workflow_repository is not None:
            js += ["--repository", expect.workflow_repository]
        if expect.workflow_ref is not None:
            js += ["--ref", expect.workflow_ref]
        lines.append(shlex.join(js))
    return lines


def release_image_policy(directory: Path, repository: str, tag: str, *, workflow: str = "tag.yml", ref: str = "tag",
                         builder: Builder | None = None) -> tuple[ReleaseSummary, ImageIdentityPolicy] | None:
    """The release's summary.json and who must have signed its images: ``repository`` at ``tag`` and the
    commit summary.json is bound to, by ``builder``'s release.yml (else the source's own ``workflow``).
    The one policy the body's cosign and gh image lines pin. No summary.json: None."""
    summary_path = directory / SUMMARY
    if not summary_path.is_file():
        return None
    summary = load_document(ReleaseSummary, summary_path)
    policy = (image_identity(repository, tag, summary.source.commit, workflow=workflow, ref=ref)
              if builder is None else builder_image_identity(builder, repository, tag, summary.source.commit, ref=ref))
    return summary, policy


def image_command_lines(directory: Path, repository: str, tag: str, *, binary: str | None = None,
                        trusted_root: Path | None = None, profile: str | None = None, workflow: str = "tag.yml",
                        ref: str = "tag", builder: Builder | None = None,
                        infra_repository: str | None = None) -> list[str]:
    """``cosign verify`` and ``verify-attestation --new-bundle-format`` for the release's runner and api digests, with
    the identity ``image_identity`` builds for ``repository`` at ``tag`` and the commit the
    release's summary.json is bound to: exactly the argv ``benchseal verify-image`` runs
    (``image_check_args``). With ``builder``, the images were signed by its reusable release.yml
    for the source (:func:`builder_image_identity`); else by the source's own ``workflow``. A
    private instance's root reaches cosign as ``--trusted-root`` naming the published root
    (``printed_root``: a release asset, named relative to the release directory, so no line carries a
    host path); public-good needs none. No summary.json: no image lines.

    Then, when the result is PASSED (a run that SUCCEEDED and passed its regression gate), the runner's
    test-result attestation (:func:`result_attestation_args`) by the signer of the evidence, which
    ``infra_repository`` and ``builder`` name (as for :func:`cosign_commands`; without them under the
    production profile, no such line): the release workflow attaches it once the benchmark succeeded
    (a failed or gated run fails its dispatch: nothing is attached, so nothing is printed)."""
    found = release_image_policy(directory, repository, tag, workflow=workflow, ref=ref, builder=builder)
    if found is None:
        return []
    summary, policy = found
    # Every image check is of a Sigstore bundle (cosign 3's format): the published root is all cosign needs.
    bundle_root = printed_root(directory, trusted_root, profile)
    binary = binary or ("cosign" if shutil.which("cosign") else str(cosign_path() or "cosign"))
    lines = []
    for image in (summary.images.runner.ref, summary.images.api.ref):
        for args in image_check_args(image, policy, offline=bundle_root is not None, trusted_root=bundle_root):
            lines.append(shlex.join([binary, *args]))
    seal = result_signer(directory, summary, repository=repository, tag=tag, profile=profile,
                         infra_repository=infra_repository, builder=builder)
    if seal is not None:
        args = result_attestation_args(summary.images.runner.ref, seal, trusted_root=bundle_root)
        lines.append(shlex.join([binary, *args]))
    return lines


def result_signer(directory: Path, summary: ReleaseSummary, *, repository: str, tag: str, profile: str | None,
                  infra_repository: str | None, builder: Builder | None) -> Expectation | None:
    """Who must have signed the runner's test-result attestation, when the body prints its checks (cosign's
    and gh's): the result is PASSED (a run that SUCCEEDED and passed its regression gate: only then does the
    release workflow attach it) and the release carries the statement; the signer is the evidence's, named by
    ``infra_repository`` and ``builder``. None: no such line (under the production profile without them, no
    signer to pin)."""
    if result_verdict(summary) != "PASSED" or not (directory / TEST_RESULT).is_file():
        return None
    try:
        return expectation(None, command_profile(directory, profile), repository=repository, tag=tag,
                           infra_repository=infra_repository, builder=builder)
    except ValidationError:
        return None
