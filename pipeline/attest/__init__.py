"""Image signatures and attestations, made in the build job and checked by the worker.

For every image digest the release workflow's keyless identity makes, with the real cosign:

* a Sigstore signature (``cosign sign``);
* an SLSA v1 build provenance attestation (``cosign attest --type slsaprovenance1``) whose
  builder and invocation are the workflow run that built the image;
* the CycloneDX SBOM as an attestation (``cosign attest --type cyclonedx``).

They live in the registry beside the image, in cosign's tag scheme (``sha256-<hex>.sig`` and
``.att``: the registry has no OCI referrers API). A consumer checks each with
``cosign verify`` / ``cosign verify-attestation`` and the exact identity; the worker does the
same through :func:`verify_image` before it runs a runner.

The OIDC token is always ambient, as GitHub Actions serves it (``ACTIONS_ID_TOKEN_REQUEST_URL``
and ``_TOKEN``, read by cosign's ``github-actions`` provider), so no token is ever in argv. A local
release gets the same from the private instance's Actions token endpoint; only the Sigstore
endpoints and the trust root differ (:class:`SigstoreEndpoints`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pipeline.contracts import GITHUB_ISSUER, REPOSITORY_RE, validate_git_tag
from pipeline.digests import ImageRef, parse_ref
from pipeline.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.evidence.sbom import write_sbom
from pipeline.fsutil import atomic_write_text, canonical_json
from pipeline.verify.external import cosign_environment, cosign_path

SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/benchseal/benchseal/build-types/image/v1"
# cosign's --type names and the predicate types they stand for.
ATTESTATION_TYPES = {"slsaprovenance1": SLSA_PROVENANCE, "cyclonedx": "https://cyclonedx.org/bom"}
_COSIGN_TIMEOUT = 180
_WORKFLOW_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,100}\.ya?ml\Z")


@dataclass(frozen=True)
class SigstoreEndpoints:
    """Where cosign gets certificates and logs entries, and which root it trusts.

    ``public_good()`` is production (cosign's own defaults, its TUF root). ``private()`` names an
    instance of our own: its URLs, and its trusted_root.json handed to cosign as the PEM files
    cosign reads from ``SIGSTORE_ROOT_FILE`` / ``SIGSTORE_CT_LOG_PUBLIC_KEY_FILE`` /
    ``SIGSTORE_REKOR_PUBLIC_KEY`` (``cosign sign`` has no --trusted-root).
    """

    fulcio_url: str | None = None
    rekor_url: str | None = None
    trusted_root: Path | None = None

    @classmethod
    def public_good(cls) -> SigstoreEndpoints:
        return cls()

    @classmethod
    def private(cls, url: str, trusted_root: Path) -> SigstoreEndpoints:
        if not re.fullmatch(r"http://127\.0\.0\.1:\d{1,5}", url):
            raise ValidationError("sigstore url", "a private instance must be http://127.0.0.1:PORT", url)
        return cls(fulcio_url=url, rekor_url=f"{url}/rekor", trusted_root=trusted_root)

    @property
    def is_private(self) -> bool:
        return self.trusted_root is not None

    def sign_flags(self) -> list[str]:
        flags = []
        if self.fulcio_url:
            flags += ["--fulcio-url", self.fulcio_url]
        if self.rekor_url:
            flags += ["--rekor-url", self.rekor_url]
        return flags

    def verify_flags(self) -> list[str]:
        # The private root comes through the environment; --offline keeps cosign off TUF.
        return ["--offline"] if self.is_private else []

    def environ(self, workdir: Path) -> dict[str, str]:
        """Environment for cosign: the private root as PEM files (nothing for public-good)."""
        if self.trusted_root is None:
            return {}
        root = json.loads(self.trusted_root.read_text())
        fulcio = b"".join(
            x509.load_der_x509_certificate(base64.b64decode(cert["rawBytes"])).public_bytes(serialization.Encoding.PEM)
            for ca in _current(root.get("certificateAuthorities", []))
            for cert in ca["certChain"]["certificates"]
        )
        ct_logs = _current(root.get("ctlogs", []))
        rekor_logs = [t for t in _current(root.get("tlogs", [])) if not t.get("baseUrl", "").endswith("/rekor2")]
        if not fulcio or not ct_logs or not rekor_logs:
            raise InfrastructureError(f"{self.trusted_root}: no current Fulcio CA, CT log or Rekor v1 log to trust")
        files = {
            "SIGSTORE_ROOT_FILE": ("fulcio.pem", fulcio),
            "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": ("ctlog.pem", _pem_key(ct_logs[-1]["publicKey"]["rawBytes"])),
            "SIGSTORE_REKOR_PUBLIC_KEY": ("rekor.pem", _pem_key(rekor_logs[-1]["publicKey"]["rawBytes"])),
        }
        env = {}
        for variable, (name, data) in files.items():
            (workdir / name).write_bytes(data)
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
class BuildInvocation:
    """The workflow run that built the images: the provenance's builder and invocation."""

    repository: str  # owner/name of the source repository
    ref: str  # refs/tags/vX.Y.Z
    commit: str  # 40 hex
    workflow_ref: str  # owner/name/.github/workflows/tag.yml@refs/tags/vX.Y.Z (job_workflow_ref)
    run_url: str  # https://github.com/owner/name/actions/runs/N/attempts/M
    server: str = "https://github.com"

    @classmethod
    def from_actions_env(cls, env: Mapping[str, str] | None = None) -> BuildInvocation:
        """The invocation of the Actions job we run in (GITHUB_* variables), checked."""
        env = os.environ if env is None else env
        names = ("GITHUB_REPOSITORY", "GITHUB_REF", "GITHUB_SHA", "GITHUB_WORKFLOW_REF", "GITHUB_RUN_ID")
        missing = [n for n in names if not env.get(n)]
        if missing:
            raise ValidationError(missing[0], "must be set (attestations describe the Actions run that built the images)")
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        return cls(
            repository=env["GITHUB_REPOSITORY"], ref=env["GITHUB_REF"], commit=env["GITHUB_SHA"],
            workflow_ref=env["GITHUB_WORKFLOW_REF"], server=server,
            run_url=f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
                    f"/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}",
        )

    @property
    def builder_id(self) -> str:
        return f"{self.server}/{self.workflow_ref}"


def provenance_predicate(image: ImageRef, role: str, invocation: BuildInvocation, *,
                         base: str | None = None, reproducible: bool | None = None) -> dict[str, Any]:
    """An SLSA v1 provenance predicate for one image, from the actual build's invocation.

    ``reproducible`` is recorded only when a rebuild was compared (True/False), never assumed.
    """
    dependencies: list[dict[str, Any]] = [{
        "uri": f"git+{invocation.server}/{invocation.repository}@{invocation.ref}",
        "digest": {"gitCommit": invocation.commit},
    }]
    if base is not None:
        base_ref = parse_ref(base, "base")
        dependencies.append({"uri": f"oci://{base_ref.name}", "name": "base",
                             "digest": {"sha256": base_ref.digest.removeprefix("sha256:")}})
    internal: dict[str, Any] = {"role": role, "image": image.name}
    if reproducible is not None:
        internal["reproducible_rebuild_matched"] = reproducible
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "workflow": {"repository": f"{invocation.server}/{invocation.repository}",
                             "ref": invocation.ref, "path": invocation.workflow_ref.split("@", 1)[0].split("/", 2)[2]},
                "image": role,
            },
            "internalParameters": internal,
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": invocation.builder_id},
            "metadata": {"invocationId": invocation.run_url},
        },
    }


_ACTIONS_TOKEN_ENV = ("ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")


@dataclass(frozen=True)
class ImageSigner:
    """Signs and attests images with cosign as the ambient Actions identity.

    ``actions_env`` is the job's token-request environment; default: this process's own
    (what GitHub Actions gives a job). Only cosign's environment receives it, never argv.
    """

    endpoints: SigstoreEndpoints
    allow_http_registry: bool = False  # loopback test registries only
    actions_env: Mapping[str, str] | None = None

    def _credential_env(self) -> dict[str, str]:
        source = os.environ if self.actions_env is None else self.actions_env
        if not all(source.get(name) for name in _ACTIONS_TOKEN_ENV):
            raise InfrastructureError("no ambient OIDC credential: image signing runs in GitHub Actions with "
                                      "`permissions: id-token: write`")
        return {"GITHUB_ACTIONS": "true", **{name: source[name] for name in _ACTIONS_TOKEN_ENV}}

    def sign_and_attest(self, ref: str, *, provenance: Mapping[str, Any], sbom: Path) -> None:
        image = parse_ref(ref, "image")
        credential = self._credential_env()
        with tempfile.TemporaryDirectory(prefix="benchseal-attest-") as tmp:
            work = Path(tmp)
            predicate = work / "provenance.json"
            atomic_write_text(predicate, canonical_json(dict(provenance)))
            common = ["--yes", "--oidc-provider", "github-actions", *self.endpoints.sign_flags(), *self._registry_flags()]
            env = {**self.endpoints.environ(work), **credential}
            _cosign(["sign", *common, image.ref], env, f"signing {image.ref}")
            _cosign(["attest", *common, "--type", "slsaprovenance1", "--predicate", str(predicate), image.ref], env,
                    f"attesting the provenance of {image.ref}")
            _cosign(["attest", *common, "--type", "cyclonedx", "--predicate", str(sbom), image.ref], env,
                    f"attesting the SBOM of {image.ref}")

    def _registry_flags(self) -> list[str]:
        return ["--allow-http-registry"] if self.allow_http_registry else []


def attest_images(images: Mapping[str, str], signer: ImageSigner, invocation: BuildInvocation, sbom_dir: Path) -> dict[str, Path]:
    """Sign every image (role -> ref) and attest its provenance and SBOM; returns role -> SBOM path."""

    sbom_dir.mkdir(parents=True, exist_ok=True)
    sboms: dict[str, Path] = {}
    for role, ref in sorted(images.items()):
        image = parse_ref(ref, f"images.{role}")
        sboms[role] = write_sbom(image.ref, sbom_dir / f"sbom-{role}.cdx.json")
        signer.sign_and_attest(image.ref, provenance=provenance_predicate(image, role, invocation), sbom=sboms[role])
    return sboms


_REF_RE = re.compile(r"\Arefs/(heads|tags)/[A-Za-z0-9][A-Za-z0-9._/-]{0,199}\Z")
_COMMIT_RE = re.compile(r"\A[0-9a-f]{40}\Z")


@dataclass(frozen=True)
class ImageIdentityPolicy:
    """Whose signature an image must carry: one workflow of one repository at one exact ref
    (and, for a branch ref, one exact commit)."""

    identity: str
    issuer: str = GITHUB_ISSUER
    repository: str | None = None  # also checked through the certificate's GitHub extensions
    ref: str | None = None
    sha: str | None = None  # the certificate's GitHub workflow SHA (1.3.6.1.4.1.57264.1.3)

    @classmethod
    def release_workflow(cls, repository: str, tag: str, workflow: str = "tag.yml", *, ref: str | None = None,
                         commit: str | None = None) -> ImageIdentityPolicy:
        """``workflow`` of ``repository`` at ``refs/tags/<tag>`` (default), or at the exact ``ref`` given
        (e.g. ``refs/heads/main``). A branch ref names no release, so it needs ``commit``: the signing
        run must have run at exactly that commit."""
        if not REPOSITORY_RE.match(repository):
            raise ValidationError("repository", "must be 'owner/name'", repository)
        validate_git_tag(tag, "tag")
        if not _WORKFLOW_RE.match(workflow):
            raise ValidationError("workflow", "must be a workflow file name ending in .yml or .yaml", workflow)
        if ref is None:
            ref = f"refs/tags/{tag}"
        elif not _REF_RE.match(ref) or ".." in ref or ref.endswith(("/", ".", ".lock")):
            raise ValidationError("ref", "must be one exact refs/heads/NAME or refs/tags/NAME (no patterns)", ref)
        if commit is not None and not _COMMIT_RE.match(commit):
            raise ValidationError("commit", "must be 40 lowercase hex", commit)
        if ref.startswith("refs/heads/") and commit is None:
            raise ValidationError("commit", "is required for a branch ref: a branch names no release, the signing "
                                            "run's commit must be the release's", ref)
        return cls(identity=f"https://github.com/{repository}/.github/workflows/{workflow}@{ref}",
                   repository=repository, ref=ref, sha=commit)

    def flags(self) -> list[str]:
        flags = ["--certificate-identity", self.identity, "--certificate-oidc-issuer", self.issuer]
        if self.repository:
            flags += ["--certificate-github-workflow-repository", self.repository]
        if self.ref:
            flags += ["--certificate-github-workflow-ref", self.ref]
        if self.sha:
            flags += ["--certificate-github-workflow-sha", self.sha]
        return flags


def verify_image(ref: str, policy: ImageIdentityPolicy, endpoints: SigstoreEndpoints, *,
                 attestations: Sequence[str] = tuple(ATTESTATION_TYPES), allow_http_registry: bool = False) -> None:
    """Raise CheckFailed unless ``ref`` carries a signature and each attestation by ``policy``'s identity."""
    image = parse_ref(ref, "image")
    unknown = [a for a in attestations if a not in ATTESTATION_TYPES]
    if unknown:
        raise ValidationError("attestations", f"must be among {sorted(ATTESTATION_TYPES)}", unknown)
    registry = ["--allow-http-registry"] if allow_http_registry else []
    with tempfile.TemporaryDirectory(prefix="benchseal-verify-image-") as tmp:
        env = endpoints.environ(Path(tmp))
        common = [*policy.flags(), *endpoints.verify_flags(), *registry, "--output", "json"]
        _check(["verify", *common, image.ref], env, f"{image.ref}: signature by {policy.identity}")
        for kind in attestations:
            _check(["verify-attestation", "--type", kind, *common, image.ref], env,
                   f"{image.ref}: {kind} attestation by {policy.identity}")


def _run(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    cosign = cosign_path()
    if cosign is None:
        raise InfrastructureError("cosign is not installed (run scripts/install-tools.sh)")
    return subprocess.run([str(cosign), *args], env=cosign_environment(env), capture_output=True, text=True,
                          check=False, timeout=_COSIGN_TIMEOUT)


def _cosign(args: list[str], env: Mapping[str, str], what: str) -> None:
    done = _run(args, env)
    if done.returncode != 0:
        raise InfrastructureError(f"{what}: cosign exited {done.returncode}: {_last_error(done.stderr)}")


def _check(args: list[str], env: Mapping[str, str], what: str) -> None:
    done = _run(args, env)
    if done.returncode != 0:
        raise CheckFailed(f"{what}: not verified: {_last_error(done.stderr)}")


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip().lower().startswith("error")]
    if lines:
        return lines[-1][:400]
    text = stderr.strip()
    return text.splitlines()[-1][:400] if text else "no output"
