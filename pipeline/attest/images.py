"""Image signatures and attestations, made in the build job and checked by the worker.

For every image digest the release workflow's keyless identity makes:

* a Sigstore signature (``cosign sign``, cosign 3's bundle format: a DSSE bundle of predicate
  ``https://sigstore.dev/cosign/sign/v1`` attached as an OCI referrer beside the attestations);
* an SLSA v1 build provenance attestation (in-toto Statement v1, predicate
  ``https://slsa.dev/provenance/v1``, build type ``IMAGE_BUILD_TYPE``, docs/build-types.md) whose
  builder and invocation are the workflow run that built the image;
* the CycloneDX SBOM as an attestation (predicate ``https://cyclonedx.org/bom``).

The two attestations are signed with sigstore-python as DSSE Sigstore bundles (v0.3), as every other
benchseal attestation is, and attached to the image as OCI referrers (pipeline.attest.referrers: the
referrers API where the registry has one, the tag schema's fallback index otherwise). The statement's
bytes are ours: nothing re-serialises the predicate (cosign's ``attest`` wrote ``invocationID`` and a
v0.1 statement). ``cosign verify-attestation --new-bundle-format``, ``gh attestation verify
oci://... --bundle-from-oci`` and ``cosign tree`` find them; the worker checks them through
:func:`verify_image` before it runs a runner. cosign's legacy ``.att`` attachments are no longer made
(docs/evidence.md "Image attestations").

Who must have signed an image is ``image_identity`` (pipeline.verify.external, re-exported here):
the source's workflow at its ref AND the payload's commit, for every signer kind.

The OIDC token is always ambient, as GitHub Actions serves it (``ACTIONS_ID_TOKEN_REQUEST_URL``
and ``_TOKEN``: cosign's ``github-actions`` provider reads them, and the bundles' signer asks the same
endpoint with audience ``sigstore``), so no token is ever in argv. A local release gets the same from
the private instance's Actions token endpoint; only the Sigstore endpoints and the trust root differ
(:class:`SigstoreEndpoints`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests
from sigstore.models import ClientTrustConfig

from pipeline.attest.passed import check_key, passed_before, record_pass
from pipeline.attest.referrers import attach_bundle
from pipeline.attest.taglock import digest_tags_locked
from pipeline.core.contracts import AgentArtifact, builder_problem, sri_hex
from pipeline.core.digests import ImageRef, parse_ref
from pipeline.core.documents import STATEMENT_TYPE, agent_purl
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.core.fsutil import atomic_write_bytes, atomic_write_json, canonical_json
from pipeline.evidence.provenance import BUILD_TYPE as IMAGE_BUILD_TYPE
from pipeline.evidence.sbom import write_sbom
from pipeline.evidence.signing import Signer, certificate_identity, private_signing_config, private_trust_config
from pipeline.verify.external import (
    ATTESTATION_TYPES,
    CYCLONEDX,
    SLSA_PROVENANCE,
    ImageIdentityPolicy,
    cosign_environment,
    cosign_path,
    cosign_trust_env,
    image_check_args,
    image_identity,
)

__all__ = ["ATTESTATION_TYPES", "IMAGE_BUILD_TYPE", "SLSA_PROVENANCE", "BuildInvocation", "ImageIdentityPolicy", "ImageSigner", "SigstoreEndpoints",
           "attest_images", "image_identity", "image_statement", "provenance_predicate", "verify_image", "verify_images"]

_COSIGN_TIMEOUT = 180


@dataclass(frozen=True)
class SigstoreEndpoints:
    """Where cosign gets certificates and logs entries, and which root it trusts.

    ``public_good()`` is production (cosign's own defaults: the signing config and trusted root of
    its TUF repository). ``private()`` names an instance of our own: cosign signs with its signing
    config (``--signing-config``: Fulcio's v2 API, Rekor v1, the TSA) and checks against its
    ``--trusted-root``; verifiers get the same root (and, for the blob and legacy forms, the PEM files
    of :meth:`environ`).
    """

    fulcio_url: str | None = None
    trusted_root: Path | None = None

    @classmethod
    def public_good(cls) -> SigstoreEndpoints:
        return cls()

    @classmethod
    def verifying(cls, trusted_root: Path | None) -> SigstoreEndpoints:
        """Only what a check needs: the private root (then --offline), or public-good for None."""
        return cls(trusted_root=trusted_root)

    @classmethod
    def private(cls, url: str, trusted_root: Path) -> SigstoreEndpoints:
        if not re.fullmatch(r"http://127\.0\.0\.1:\d{1,5}", url):
            raise ValidationError("sigstore url", "a private instance must be http://127.0.0.1:PORT", url)
        return cls(fulcio_url=url, trusted_root=trusted_root)

    @property
    def is_private(self) -> bool:
        return self.trusted_root is not None

    def sign_flags(self, workdir: Path) -> list[str]:
        """``cosign sign``'s service flags: none for public-good; for a private instance its signing
        config (written into ``workdir``) and trusted root. cosign 3 refuses --fulcio-url/--rekor-url
        beside a signing config, and takes its signing config from TUF unless given one."""
        if self.fulcio_url is None or self.trusted_root is None:
            return []
        config = workdir / "signing_config.json"
        atomic_write_json(config, private_signing_config(self.fulcio_url))
        return ["--signing-config", str(config), "--trusted-root", str(self.trusted_root)]

    def environ(self, workdir: Path) -> dict[str, str]:
        """Environment for cosign: the private root as PEM files (nothing for public-good)."""
        return {} if self.trusted_root is None else cosign_trust_env(self.trusted_root, workdir)


@dataclass(frozen=True)
class BuildInvocation:
    """The workflow run that built the images: the provenance's builder and invocation."""

    repository: str  # owner/name of the source repository
    ref: str  # refs/tags/vX.Y.Z
    commit: str  # 40 hex
    workflow_ref: str  # the run's workflow: owner/name/.github/workflows/release.yml@refs/tags/vX.Y.Z
    run_url: str  # https://github.com/owner/name/actions/runs/N/attempts/M
    server: str = "https://github.com"
    # The reusable workflow that built (benchseal's, as the caller pinned it: its job_workflow_ref);
    # None: the run's own workflow built. The provenance's builder is this one.
    builder_ref: str | None = None

    @classmethod
    def from_actions_env(cls, env: Mapping[str, str] | None = None) -> BuildInvocation:
        """The invocation of the Actions job we run in (GITHUB_* variables), checked."""
        env = os.environ if env is None else env
        names = ("GITHUB_REPOSITORY", "GITHUB_REF", "GITHUB_SHA", "GITHUB_WORKFLOW_REF", "GITHUB_RUN_ID")
        missing = [n for n in names if not env.get(n)]
        if missing:
            raise ValidationError(missing[0], "must be set (attestations describe the Actions run that built the images)")
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        # GITHUB_WORKFLOW_REF is the caller's workflow; a reusable workflow learns its own ref from its
        # OIDC token (job_workflow_ref) and hands it on as BENCHSEAL_BUILDER_REF.
        builder_ref = env.get(BUILDER_REF_ENV) or None
        problem = None if builder_ref is None else builder_problem(builder_ref)
        if problem is not None:
            raise ValidationError(BUILDER_REF_ENV, problem, builder_ref)
        return cls(
            repository=env["GITHUB_REPOSITORY"], ref=env["GITHUB_REF"], commit=env["GITHUB_SHA"],
            workflow_ref=env["GITHUB_WORKFLOW_REF"], server=server, builder_ref=builder_ref,
            run_url=f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
                    f"/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}",
        )

    @property
    def builder_id(self) -> str:
        return f"{self.server}/{self.builder_ref or self.workflow_ref}"


def agent_dependency(agent: AgentArtifact) -> dict[str, Any]:
    """The release's agent as an SLSA resolved dependency: its package URL and the digest the build checked."""
    algorithm, digest = sri_hex(agent.integrity)
    return {"uri": agent_purl(agent), "name": f"agent:{agent.name}", "digest": {algorithm: digest},
            "annotations": {"sourceCommit": agent.source_commit, "integrity": agent.integrity}}


def provenance_predicate(image: ImageRef, role: str, invocation: BuildInvocation, *,
                         base: str | None = None, reproducible: bool | None = None,
                         agent: AgentArtifact | None = None) -> dict[str, Any]:
    """An SLSA v1 provenance predicate for one image, from the actual build's invocation, of the image
    build type (``IMAGE_BUILD_TYPE``: the same parameters as the release's provenance-images.intoto.json).

    ``reproducible`` is recorded only when a rebuild was compared (True/False), never assumed.
    ``agent``: the release's agent the runner carries, a resolved dependency with its digest.
    """
    dependencies: list[dict[str, Any]] = [{
        "uri": f"git+{invocation.server}/{invocation.repository}@{invocation.ref}",
        "digest": {"gitCommit": invocation.commit},
    }]
    if base is not None:
        base_ref = parse_ref(base, "base")
        dependencies.append({"uri": f"oci://{base_ref.name}", "name": "base",
                             "digest": {"sha256": base_ref.digest.removeprefix("sha256:")}})
    if agent is not None:
        dependencies.append(agent_dependency(agent))
    internal: dict[str, Any] = {"images": [role]}
    if reproducible is not None:
        internal["reproducible"] = reproducible
    return {
        "buildDefinition": {
            "buildType": IMAGE_BUILD_TYPE,
            "externalParameters": {
                "source": {"repository": invocation.repository, "ref": invocation.ref},
                "workflow": invocation.workflow_ref,
            },
            "internalParameters": internal,
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": invocation.builder_id},
            "metadata": {"invocationId": invocation.run_url},
        },
    }


def image_statement(image: ImageRef, predicate_type: str, predicate: Mapping[str, Any]) -> bytes:
    """The in-toto Statement v1 about ``image`` (its repository and manifest digest), as signed: canonical JSON."""
    return canonical_json({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image.name, "digest": {"sha256": image.digest.removeprefix("sha256:")}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }).encode()


_ACTIONS_TOKEN_ENV = ("ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")
BUILDER_REF_ENV = "BENCHSEAL_BUILDER_REF"


@dataclass(frozen=True)
class ImageSigner:
    """Signs images with cosign and attests them with sigstore-python, as the ambient Actions identity.

    ``actions_env`` is the job's token-request environment; default: this process's own
    (what GitHub Actions gives a job). Only cosign's environment and the token request receive it,
    never argv.
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
            common = ["--yes", "--oidc-provider", "github-actions", *self.endpoints.sign_flags(work),
                      *self._registry_flags()]
            env = dict(credential)  # the trust root travels as --trusted-root (sign_flags)
            # cosign rewrites the digest's referrers fallback index whole: one writer at a time
            # (pipeline.attest.taglock).
            with digest_tags_locked(image):
                _cosign(["sign", *common, image.ref], env, f"signing {image.ref}")
            try:
                sbom_document = json.loads(sbom.read_text("utf-8"))
            except (OSError, ValueError) as exc:
                raise InfrastructureError(f"{sbom}: not a readable CycloneDX JSON document ({exc})") from None
            signer = self._bundle_signer(credential)
            try:
                for name, predicate_type, predicate in (("provenance", SLSA_PROVENANCE, provenance),
                                                        ("sbom", CYCLONEDX, sbom_document)):
                    statement = work / f"{name}.intoto.json"
                    atomic_write_bytes(statement, image_statement(image, predicate_type, predicate))
                    bundle = signer.sign_statement(statement)
                    attach_bundle(image, bundle.read_bytes(), predicate_type)
            finally:
                signer.close()

    def _bundle_signer(self, credential: Mapping[str, str]) -> Signer:
        """sigstore-python's signer (pipeline.evidence.signing) for the job's ambient token: public-good,
        or the private instance the endpoints name (Rekor v1: a consumer's cosign 2.5 verifies no Rekor v2 entry)."""
        first = actions_token(credential)
        identity, issuer = certificate_identity(first)
        tokens = iter([first])
        endpoints = self.endpoints
        trust = (private_trust_config(endpoints.fulcio_url, endpoints.trusted_root)
                 if endpoints.fulcio_url is not None and endpoints.trusted_root is not None
                 else ClientTrustConfig.production())
        return Signer(trust_config=trust, token=lambda: next(tokens, None) or actions_token(credential),
                      identity=identity, issuer=issuer, trusted_root=endpoints.trusted_root, rekor_version=1)

    def _registry_flags(self) -> list[str]:
        return ["--allow-http-registry"] if self.allow_http_registry else []


def actions_token(credential: Mapping[str, str], audience: str = "sigstore") -> str:
    """An OIDC token from the Actions job's token endpoint (``ACTIONS_ID_TOKEN_REQUEST_URL`` with the
    bearer ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``), as GitHub serves it: ``{"value": JWT}``."""
    url = credential["ACTIONS_ID_TOKEN_REQUEST_URL"]
    url += ("&" if "?" in url else "?") + urlencode({"audience": audience})
    try:
        answer = requests.get(url, headers={"Authorization": f"bearer {credential['ACTIONS_ID_TOKEN_REQUEST_TOKEN']}"},
                              timeout=30)
        value = answer.json().get("value") if answer.status_code == 200 else None
    except (requests.RequestException, ValueError, AttributeError) as exc:
        raise InfrastructureError(f"the Actions OIDC token endpoint did not answer: {type(exc).__name__}") from None
    if not isinstance(value, str) or not value:
        raise InfrastructureError(f"the Actions OIDC token endpoint gave no token (HTTP {answer.status_code})")
    return value


def attest_images(images: Mapping[str, str], signer: ImageSigner, invocation: BuildInvocation, sbom_dir: Path,
                  agent: AgentArtifact | None = None) -> dict[str, Path]:
    """Sign every image (role -> ref) and attest its provenance and SBOM; returns role -> SBOM path.

    ``agent`` (the digests file's): named in the runner's provenance."""

    sbom_dir.mkdir(parents=True, exist_ok=True)
    sboms: dict[str, Path] = {}
    for role, ref in sorted(images.items()):
        image = parse_ref(ref, f"images.{role}")
        sboms[role] = write_sbom(image.ref, sbom_dir / f"sbom-{role}.cdx.json")
        predicate = provenance_predicate(image, role, invocation, agent=agent if role == "runner" else None)
        signer.sign_and_attest(image.ref, provenance=predicate, sbom=sboms[role])
    return sboms


def verify_image(ref: str, policy: ImageIdentityPolicy, endpoints: SigstoreEndpoints, *,
                 attestations: Sequence[str] = tuple(ATTESTATION_TYPES), allow_http_registry: bool = False) -> None:
    """Raise CheckFailed unless ``ref`` carries a signature and each attestation by ``policy``'s
    identity at its commit: the argv of ``image_check_args``, the same the release body prints."""
    image = parse_ref(ref, "image")
    checks = image_check_args(image.ref, policy, offline=endpoints.is_private, attestations=tuple(attestations),
                              allow_http_registry=allow_http_registry, trusted_root=endpoints.trusted_root)
    # A check that passed for this digest, identity, trust root and cosign passes again (pipeline.attest.passed).
    cosign = _cosign_binary()
    keys = [check_key(args, cosign, endpoints.trusted_root) for args in checks]
    pending = [(args, key) for args, key in zip(checks, keys, strict=True) if not passed_before(key)]
    if not pending:
        return
    with tempfile.TemporaryDirectory(prefix="benchseal-verify-image-") as tmp:
        env = endpoints.environ(Path(tmp))

        def check(args: list[str], key: str | None) -> None:
            what = "signature" if args[0] == "verify" else f"{args[args.index('--type') + 1]} attestation"
            _check(args, env, f"{image.ref}: {what} by {policy.describe()}")
            record_pass(key)

        # The signature first: a refusal (unsigned, another identity) costs one cosign run. The attestation checks
        # then run side by side (independent reads of the registry, each still required: the first failing one in
        # the argv's order is raised once all have ended).
        first = [item for item in pending if item[0][0] == "verify"]
        for args, key in first:
            check(args, key)
        rest = [item for item in pending if item[0][0] != "verify"]
        if len(rest) > 1:
            with ThreadPoolExecutor(max_workers=len(rest)) as pool:
                futures = [pool.submit(check, args, key) for args, key in rest]
            for future in futures:
                future.result()
        elif rest:
            check(*rest[0])


def verify_images(images: Mapping[str, str], policy: ImageIdentityPolicy, endpoints: SigstoreEndpoints) -> None:
    """Each image (role -> ref) carries the signature and both attestations of ``policy``."""
    for _role, ref in sorted(images.items()):
        verify_image(ref, policy, endpoints)


def _cosign_binary() -> Path:
    cosign = cosign_path()
    if cosign is None:
        raise InfrastructureError("cosign is not installed (run scripts/install-tools.sh)")
    return cosign


def _run(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(_cosign_binary()), *args], env=cosign_environment(env), capture_output=True, text=True,
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
