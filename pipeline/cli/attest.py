"""``benchseal attest`` and ``benchseal verify-image``: image signatures and attestations.

``attest --digests FILE`` signs each image of a digests file (cosign) and attests its SLSA provenance
and CycloneDX SBOM (Sigstore bundles attached as OCI referrers, pipeline.attest.images), as the
ambient GitHub Actions identity (the build job needs
``permissions: id-token: write`` and ``packages: write``). ``verify-image REF --repo --tag --commit``
checks them with the exact release-workflow identity, at that ref and that commit
(``pipeline.verify.external.image_identity``, the same expectation the worker and the release
body use). ``attach-result DIR|OWNER/REPO@TAG --runner REF`` pushes the release's signed test-result
attestation (the seal job's DSSE bundle, unchanged) to the runner image as an OCI referrer, where
``cosign verify-attestation --new-bundle-format --type https://in-toto.io/attestation/test-result/v0.1``
finds it (release.yml's ``attach_result`` job: ``packages: write``; no signing identity needed).

Sigstore: public-good unless ``--sigstore-url`` and ``--trusted-root`` name a private
instance on 127.0.0.1 (tests and the local release); never chosen implicitly.

Exit codes: 0 done / verified; 1 signing failed or a check failed; 2 usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.core.contracts import DigestsFile, load_model
from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError

if TYPE_CHECKING:
    from pipeline.attest.images import SigstoreEndpoints

_URL = typer.Option("--sigstore-url", envvar="BENCHSEAL_SIGSTORE_URL",
                    help="A private Sigstore instance (http://127.0.0.1:PORT); default public-good.")
_ROOT = typer.Option("--trusted-root", envvar="BENCHSEAL_TRUSTED_ROOT",
                     help="The private instance's trusted_root.json (with --sigstore-url).")
_HTTP = typer.Option("--allow-http-registry",
                     help="Plain-HTTP registry (default: only for loopback registries, 127.0.0.1/localhost).")


def sigstore_endpoints(url: str | None, trusted_root: Path | None) -> SigstoreEndpoints:
    """Public-good, or the private instance the caller named with both options (never implicit).
    An empty value (an unset Actions variable) counts as not given."""
    # lazy: pipeline.attest.images (sigstore, docker) costs 423 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.attest.images import SigstoreEndpoints

    url = url or None
    trusted_root = trusted_root if trusted_root and str(trusted_root) not in ("", ".") else None

    if (url is None) != (trusted_root is None):
        raise ValidationError("--sigstore-url/--trusted-root", "a private instance needs both (neither: public-good)")
    if url is None or trusted_root is None:
        return SigstoreEndpoints.public_good()
    if not trusted_root.is_file():
        raise ValidationError("--trusted-root", "must be an existing trusted_root.json", str(trusted_root))
    return SigstoreEndpoints.private(url, trusted_root)


def attest(
    digests: Annotated[Path, typer.Option("--digests", help="benchseal.digests/v1 file from `benchseal build`.")],
    sbom_dir: Annotated[Path, typer.Option("--sbom-dir", help="Where the attested SBOMs are written.")] = Path("sboms"),
    sigstore_url: Annotated[str | None, _URL] = None,
    trusted_root: Annotated[Path | None, _ROOT] = None,
    allow_http_registry: Annotated[bool, _HTTP] = False,
) -> None:
    """Sign each image and attest its provenance and SBOM (ambient Actions identity)."""
    # lazy: pipeline.attest.images (sigstore, docker) costs 423 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.attest.images import BuildInvocation, ImageSigner, attest_images

    try:
        document = json.loads(digests.read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError("--digests", f"must be a readable JSON digests file ({type(exc).__name__})", str(digests)) from None
    parsed = load_model(DigestsFile, document, str(digests))
    invocation = BuildInvocation.from_actions_env()
    if invocation.commit != parsed.source.commit:
        raise ValidationError("--digests", "source.commit must be the commit this workflow run built (GITHUB_SHA)",
                              parsed.source.commit)
    images: dict[str, str] = {str(role): entry.ref for role, entry in parsed.images.items()}
    # The adopter's own images (its project file's [images]) are signed by the same identity.
    images.update({name: entry.ref for name, entry in parsed.project_images.items()})
    loopback = all(parse_ref(ref).registry.split(":", 1)[0] in ("127.0.0.1", "localhost") for ref in images.values())
    signer = ImageSigner(sigstore_endpoints(sigstore_url, trusted_root), allow_http_registry=allow_http_registry or loopback)
    attest_images(images, signer, invocation, sbom_dir, agent=parsed.agent)
    for role, ref in sorted(images.items()):
        typer.echo(f"signed and attested {role}: {ref}")


def verify_image(
    ref: Annotated[str, typer.Argument(help="name@sha256:<64 hex>")],
    repo: Annotated[str, typer.Option("--repo", help="OWNER/NAME whose release workflow must have signed it.")],
    tag: Annotated[str, typer.Option("--tag", help="The release tag the workflow ran for.")],
    commit: Annotated[str, typer.Option("--commit", help="The release's source commit (40 lowercase hex): the "
                                                         "signing run must have run at exactly this commit.")],
    workflow: Annotated[str, typer.Option("--workflow", help="The release workflow's file name (without --builder).")] = "tag.yml",
    signer_ref: Annotated[str, typer.Option("--ref", help="The ref the workflow ran at: 'tag' (refs/tags/TAG) or one "
                                                          "exact refs/heads/NAME or refs/tags/NAME.")] = "tag",
    builder: Annotated[str | None, typer.Option("--builder", help="OWNER/REPO@REF: the image was signed inside "
                                                "benchseal's reusable release.yml at exactly that ref (a 40-hex "
                                                "commit), for --repo at --ref and --commit.")] = None,
    sigstore_url: Annotated[str | None, _URL] = None,
    trusted_root: Annotated[Path | None, _ROOT] = None,
    allow_http_registry: Annotated[bool, _HTTP] = False,
) -> None:
    """Check an image's signature and its provenance and SBOM attestations: exact identity, ref and commit."""
    # lazy: pipeline.attest.images (sigstore, docker) costs 423 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.attest.images import image_identity
    from pipeline.attest.images import verify_image as check
    from pipeline.verify.external import builder_image_identity
    from pipeline.verify.policy import parse_builder

    if builder is not None:
        policy = builder_image_identity(parse_builder(builder), repo, tag, commit, ref=signer_ref)
    else:
        policy = image_identity(repo, tag, commit, workflow=workflow, ref=signer_ref)
    check(ref, policy, sigstore_endpoints(sigstore_url, trusted_root), allow_http_registry=allow_http_registry)
    typer.echo(f"verified: {ref} signed and attested by {policy.describe()}")


def attach_result(
    source: Annotated[str, typer.Argument(help="The release: a directory holding its evidence, or OWNER/REPO@TAG "
                                                "(the GitHub release's evidence, fetched through the API).")],
    runner: Annotated[str, typer.Option("--runner", help="The runner image the release was benchmarked with "
                                                         "(name@sha256:<64 hex>): the statement's subject.")],
    token_file: Annotated[Path | None, typer.Option("--token-file", help="With OWNER/REPO@TAG: a file holding the "
                                                    "GitHub token (default GITHUB_TOKEN / GH_TOKEN; none for a public "
                                                    "release).")] = None,
) -> None:
    """Attach the release's signed test-result attestation to the runner image (an OCI referrer, cosign's
    new bundle format; pushed with the registry credentials docker login left)."""
    # lazy: pipeline.verify.fetch (PyGithub) and pipeline.attest.testresult cost 140-160 ms and 7 ms at CLI start (2026-12-05)
    from pipeline.attest.testresult import attach_test_result
    from pipeline.verify.fetch import fetched_release, parse_reference, read_token

    if not Path(source).exists() and "@" in source:
        reference = parse_reference(source)
        with fetched_release(reference, token=read_token(token_file)) as directory:
            attached = attach_test_result(directory, runner)
    else:
        if token_file is not None:
            raise ValidationError("--token-file", "only with OWNER/REPO@TAG (a directory is read, not fetched)")
        if not Path(source).is_dir():
            raise ValidationError("DIR|OWNER/REPO@TAG", "must be an existing directory, or OWNER/REPO@TAG for a GitHub "
                                  "release", source)
        attached = attach_test_result(Path(source), runner)
    where = f"referrers tag {attached.fallback_tag}" if attached.fallback_tag else "the registry's referrers API"
    typer.echo(f"attached: the test-result attestation of {source} to {attached.runner} (manifest {attached.manifest}, "
               f"{where}{'' if attached.added else ', already there'})")


def register(app: typer.Typer) -> None:
    app.command(name="attest")(attest)
    app.command(name="verify-image")(verify_image)
    app.command(name="attach-result")(attach_result)
