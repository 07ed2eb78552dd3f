"""``benchseal verify DIR --repo OWNER/NAME --tag TAG [--infra-repo OWNER/INFRA] [--builder OWNER/REPO@REF] [--policy FILE] [--trusted-root FILE] [--offline] [--images]``.

The consumer states the release they expect (``--repo`` and ``--tag``, or ``expect:`` in
``--policy FILE``) and, for the production profile, who benchmarked and sealed it: the infra
repository (``--infra-repo``) and the builder, benchseal's repository at the exact ref the
workflows pin (``--builder``), whose reusable benchmark.yml signed the evidence for that infra
repository on main. ``--images`` checks the images with the builder's release.yml identity for
the source (without ``--builder``: the source's own ``--image-workflow``, the local profile's
case). Nothing of the expectation is taken from the release being checked.

Exit codes: 0 verified; 1 a check failed (the message names the first failure);
2 usage error (including a missing expectation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from pipeline.core.errors import CLI_ERROR_PREFIX, Error, UsageError

_DIR = typer.Argument(..., help="Release or artifacts directory.")
_REPO = typer.Option(None, "--repo", help="The source repository OWNER/NAME the release must be for "
                                          "(required unless the policy pins expect.repository).")
_TAG = typer.Option(None, "--tag", help="The tag the release must be for (required unless the policy pins expect.tag).")
_POLICY = typer.Option(None, "--policy", help="Verification policy: signer profiles and optional expect: "
                                              "{repository, tag} (default: policies/verify.yaml).")
_INFRA = typer.Option(None, "--infra-repo", help="The infra repository OWNER/NAME whose benchmark.yml sealed the "
                                                "release (required by the production profile unless the policy "
                                                "pins expect.infra_repository).")
_BUILDER = typer.Option(None, "--builder", help="The builder OWNER/REPO@REF: benchseal's repository and the exact ref "
                                                "(40-hex commit, refs/tags/NAME or refs/heads/NAME) the callers pin; "
                                                "its benchmark.yml must have sealed the evidence for --infra-repo "
                                                "(required by the production profile unless the policy pins "
                                                "expect.builder), its release.yml signed the --images.")
_ROOT = typer.Option(None, "--trusted-root", help="Sigstore trusted_root.json (selects the local profile).")
_IMAGES = typer.Option(False, "--images", help="Also check, with cosign in their registry, that the runner and api "
                                              "images carry the signature and both attestations of the builder's "
                                              "release.yml (without --builder: the source's --image-workflow) for "
                                              "the source at --image-ref and at the release's commit.")
_IMAGE_WORKFLOW = typer.Option(None, "--image-workflow", help="With --images and no --builder: the source's own "
                                                              "workflow that signed them (default tag.yml).")
_IMAGE_REF = typer.Option("tag", "--image-ref", help="With --images: the ref it ran at, 'tag' (refs/tags/TAG) or one "
                                                     "exact refs/heads/NAME or refs/tags/NAME.")


def verify(
    directory: Path = _DIR,
    repo: str | None = _REPO,
    tag: str | None = _TAG,
    infra_repo: str | None = _INFRA,
    builder: str | None = _BUILDER,
    policy: Path | None = _POLICY,
    trusted_root: Path | None = _ROOT,
    offline: bool = typer.Option(False, "--offline", help="Use the embedded public-good root; no network."),
    profile: str | None = typer.Option(None, "--profile", help="Policy profile (default: local with --trusted-root, else production)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was verified as a JSON object."),
    images: bool = _IMAGES,
    image_workflow: str | None = _IMAGE_WORKFLOW,
    image_ref: str = _IMAGE_REF,
) -> None:
    """Verify every bundle, every checksum and the bindings of the release of --repo at --tag."""
    # lazy: pipeline.verify.release (sigstore) costs 224 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.verify.release import verify_release

    try:
        if images and builder is not None and image_workflow is not None:
            raise UsageError("--image-workflow: with --builder the images are signed by the builder's release.yml; "
                             "drop --image-workflow")
        done = verify_release(directory, repository=repo, tag=tag, policy=policy, trusted_root=trusted_root,
                              offline=offline, profile=profile, infra_repository=infra_repo, builder=builder)
        images_identity = _verify_images(done, trusted_root, image_workflow, image_ref) if images else None
    except Error as exc:
        if not as_json:
            raise
        # One JSON object on every outcome; the message also goes to stderr as usual.
        typer.echo(json.dumps({"ok": False, "error": exc.diagnostics(), "exit_code": exc.exit_code}, sort_keys=True))
        typer.echo(CLI_ERROR_PREFIX + f"{exc.diagnostics()}", err=True)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        typer.echo(json.dumps({"ok": True, **done.to_json_dict(), "images": images_identity}, sort_keys=True))
        return
    caller = (f"  signed for: {done.workflow_repository} at {done.workflow_ref}\n"
              if done.workflow_repository is not None and done.workflow_ref is not None else "")
    typer.echo(f"verified: {done.directory}\n"
               f"  identity:   {done.identity}\n"
               f"  issuer:     {done.issuer}\n"
               f"{caller}"
               f"  repository: {done.repository}\n"
               f"  tag:        {done.tag}\n"
               f"  commit:     {done.commit}\n"
               f"  bundles:    {len(done.bundles)} ({done.profile} profile)"
               + (f"\n  images:     runner and api by {images_identity}" if images_identity else ""))


def _verify_images(done: Any, trusted_root: Path | None, workflow: str | None, ref: str) -> str:
    """The release's two images, by the identity built from the consumer's --repo/--tag (and
    --builder) and the commit the verified, signed summary is bound to (never from the images);
    returns that identity, described."""
    # lazy: pipeline.attest.images (sigstore, docker) costs 423 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.attest.images import SigstoreEndpoints, image_identity, verify_images
    from pipeline.verify.external import builder_image_identity
    from pipeline.verify.release import load_summary

    if done.builder is not None:
        if workflow is not None:
            raise UsageError("--image-workflow: with --builder the images are signed by the builder's release.yml; "
                             "drop --image-workflow")
        identity = builder_image_identity(done.builder, done.repository, done.tag, done.commit, ref=ref)
    else:
        identity = image_identity(done.repository, done.tag, done.commit, workflow=workflow or "tag.yml", ref=ref)
    summary = load_summary(done.directory)
    verify_images({"runner": summary.images.runner.ref, "api": summary.images.api.ref}, identity,
                  SigstoreEndpoints.verifying(trusted_root))
    return identity.describe()


def register(app: typer.Typer) -> None:
    app.command(name="verify")(verify)
