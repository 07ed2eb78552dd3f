"""``benchseal verify DIR --repo OWNER/NAME --tag TAG [--infra-repo OWNER/INFRA] [--builder OWNER/REPO@REF] [--policy FILE] [--infra-policy-digest sha256:HEX] [--trusted-root FILE] [--offline] [--images]``,
or ``benchseal verify OWNER/REPO@TAG [--token-file FILE] ...`` (the same options, without --repo and --tag).

The argument is a directory when that path exists; otherwise ``OWNER/REPO@TAG`` names a GitHub
release: its evidence is fetched through the API (``pipeline.verify.fetch``; ``GITHUB_API_URL``,
the token from ``--token-file``, ``GITHUB_TOKEN`` or ``GH_TOKEN``, none for a public release) into
a private temporary directory, verified there and removed. The reference is the expected
repository and tag, so ``--repo`` and ``--tag`` are refused beside it (exit 2).

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
from typing import TYPE_CHECKING

import typer

from pipeline.core.errors import CLI_ERROR_PREFIX, CheckFailed, Error, UsageError, ValidationError, escape_text
from pipeline.core.layout import CHECKSUMS_BUNDLE

if TYPE_CHECKING:  # the verdict's types, not imported at run time (pipeline.verify.release costs 224 ms)
    from pipeline.core.documents import Comparison, ReleaseSummary
    from pipeline.verify.release import VerifiedRelease

_TARGET = typer.Argument(..., metavar="DIR|OWNER/REPO@TAG",
                         help="A release or artifacts directory (a path that exists), or OWNER/REPO@TAG: the GitHub "
                              "release of that repository at that tag, whose assets are fetched through the API "
                              "and verified as that repository's release at that tag.")
_REPO = typer.Option(None, "--repo", help="The source repository OWNER/NAME the release must be for "
                                          "(required unless the policy pins expect.repository).")
_TOKEN_FILE = typer.Option(None, "--token-file", help="With OWNER/REPO@TAG: a file holding the GitHub token "
                                                       "(default $GITHUB_TOKEN or $GH_TOKEN; none for a public "
                                                       "release). Never on the command line.")
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
_POLICY_DIGEST = typer.Option(None, "--infra-policy-digest", help="sha256:HEX of the infra repository's "
                                                                     "policies/infra.yaml you expect the run was run and "
                                                                     "graded under (summary.json policy_digest): "
                                                                     "another one, or none, is refused.")
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
    target: str = _TARGET,
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
    token_file: Path | None = _TOKEN_FILE,
    infra_policy_digest: str | None = _POLICY_DIGEST,
) -> None:
    """Verify every bundle, every checksum and the bindings of the release of --repo at --tag (DIR), or of
    the GitHub release OWNER/REPO@TAG; print what was verified and its score."""
    # lazy: pipeline.verify.release (sigstore) costs 224 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.verify.release import load_summary, verify_release

    def check(directory: Path, repository: str | None,
              release_tag: str | None) -> tuple[VerifiedRelease, str | None, ReleaseSummary]:
        done = verify_release(directory, repository=repository, tag=release_tag, policy=policy,
                              trusted_root=trusted_root, offline=offline, profile=profile,
                              infra_repository=infra_repo, builder=builder, infra_policy_digest=infra_policy_digest)
        images_identity = _verify_images(done, trusted_root, image_workflow, image_ref) if images else None
        return done, images_identity, load_summary(done.directory)  # read only once every check passed

    reference = None
    try:
        if images and builder is not None and image_workflow is not None:
            raise UsageError("--image-workflow: with --builder the images are signed by the builder's release.yml; "
                             "drop --image-workflow")
        if not Path(target).exists() and "@" in target:
            # lazy: PyGithub costs 170 ms at start, and a directory is read, not fetched (2026-12-05)
            from pipeline.verify.fetch import fetched_release, parse_reference, read_token

            reference = parse_reference(target)
            if repo is not None or tag is not None:
                raise UsageError(f"--repo/--tag: {target} already names the repository and tag you expect; drop them")
            with fetched_release(reference, token=read_token(token_file)) as directory:
                done, images_identity, summary = check(directory, reference.repository, reference.tag)
        else:
            if token_file is not None:
                raise UsageError("--token-file: only with OWNER/REPO@TAG (a directory is read, not fetched)")
            if not Path(target).exists():
                raise ValidationError("DIR|OWNER/REPO@TAG", "must be an existing directory, or OWNER/REPO@TAG for "
                                      "a GitHub release", target)
            done, images_identity, summary = check(Path(target), repo, tag)
    except Error as exc:
        if not as_json:
            raise
        # One JSON object on every outcome; the message also goes to stderr as usual.
        typer.echo(json.dumps({"ok": False, "error": exc.diagnostics(), "exit_code": exc.exit_code}, sort_keys=True))
        typer.echo(CLI_ERROR_PREFIX + f"{exc.diagnostics()}", err=True)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        fetched = {"directory": None, "release": str(reference)} if reference is not None else {"release": None}
        typer.echo(json.dumps({"ok": True, **done.to_json_dict(), **fetched, "images": images_identity,
                               "score": _score_json(summary)}, sort_keys=True))
        return
    caller = (f"  signed for: {done.workflow_repository} at {done.workflow_ref}\n"
              if done.workflow_repository is not None and done.workflow_ref is not None else "")
    typer.echo(f"verified: {done.directory if reference is None else f'{reference} (GitHub release)'}\n"
               f"  identity:   {done.identity}\n"
               f"  issuer:     {done.issuer}\n"
               f"{caller}"
               f"  repository: {done.repository}\n"
               f"  tag:        {done.tag}\n"
               f"  commit:     {done.commit}\n"
               f"  bundles:    {len(done.bundles)} ({done.profile} profile)\n"
               f"  policy:     {done.policy_digest or 'none recorded'} (the infra policy it ran and was graded under"
               + (", as pinned)" if infra_policy_digest else ")")
               + (f"\n  images:     runner and api by {images_identity}" if images_identity else ""))
    typer.echo(_score_table(summary))


def _score_json(summary: ReleaseSummary) -> dict[str, object]:
    return {"status": summary.status, "score": summary.score, "counts": _plain(summary.counts),
            **{key: _plain(getattr(summary, key, None)) for key in _EXTRA}}


# summary.json fields shown when present (a summary without them omits them): the score's interval and
# the comparison with the previous release, as the verified document carries them.
_EXTRA = ("interval", "comparison")


def _plain(value: object) -> object:
    return value.model_dump(mode="json", by_alias=True) if hasattr(value, "model_dump") else value


def _score_table(summary: ReleaseSummary) -> str:
    """The verified summary.json's score, one table (and its comparison with a previous release, if any)."""
    counts = summary.counts
    score = "-" if summary.score is None else str(summary.score)
    header = ("status", "score", "completed", "resolved", "unresolved", "infra errors", "total")
    row = (summary.status, score, counts.completed, counts.resolved, counts.unresolved, counts.infra_errors,
           counts.total)
    widths = [max(len(str(h)), len(str(v))) for h, v in zip(header, row, strict=True)]
    lines = ["score:", "  " + "  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
             "  " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()]
    interval = getattr(summary, "interval", None)
    if interval is not None:
        lines.append(f"  95 % interval (Wilson): [{interval.low}, {interval.high}]")
    comparison = getattr(summary, "comparison", None)
    if comparison is not None:
        lines += _comparison_lines(comparison)
    return "\n".join(escape_text(line) for line in lines)


def _comparison_lines(comparison: Comparison) -> list[str]:
    previous = comparison.previous
    if previous is None:
        return ["compared with: nothing (the repository's first scored release of this suite)"]
    lines = [f"compared with: {previous.tag} (run {previous.run_id}, summary.json {previous.summary_digest}), "
             f"score {previous.score} -> change {comparison.score_delta:+}"]
    for change in comparison.changed:
        before = "-" if change.previous is None else f"{change.previous.resolved}/{change.previous.completed}"
        after = "-" if change.current is None else f"{change.current.resolved}/{change.current.completed}"
        lines.append(f"  {change.task}: {change.change} ({before} -> {after})")
    if comparison.gate is None:
        lines.append("gate: none set for the suite")
    else:
        lines.append("gate: GATED: " + "; ".join(comparison.reasons) if comparison.gated else "gate: passed")
    return lines


def _verify_images(done: VerifiedRelease, trusted_root: Path | None, workflow: str | None, ref: str) -> str:
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


_JS_DIR = typer.Argument(..., help="The release directory (its SHA256SUMS and every *.sigstore.json).")
_JS_ROOT = typer.Option(..., "--trusted-root", help="The Sigstore trusted_root.json to verify against.")


def sigstore_js(
    directory: Path = _JS_DIR,
    trusted_root: Path = _JS_ROOT,
    identity: str = typer.Option(..., "--cert-identity", help="The exact certificate identity (SAN) every bundle "
                                                               "must carry."),
    issuer: str = typer.Option(..., "--cert-oidc-issuer", help="The exact OIDC issuer of the certificate."),
    repository: str | None = typer.Option(None, "--repository", help="The GitHub workflow repository the signer "
                                                                    "ran for (a reusable workflow's caller)."),
    ref: str | None = typer.Option(None, "--ref", help="The ref that caller ran at (refs/heads/... or refs/tags/...)."),
) -> None:
    """Verify every bundle of DIR, and its SHA256SUMS, with sigstore-js (@sigstore/verify), offline: the body's
    sigstore-js line (sigstore-js's own CLI reads trust from TUF only and pins no workflow repository or ref)."""
    # lazy: pipeline.verify.external (cryptography, sigstore models) costs 795 ms at CLI start (2026-12-07)
    from pipeline.verify.external import signer_jobs, sigstore_js_verify

    if not directory.is_dir():
        raise ValidationError("DIR", "must be an existing release directory", str(directory))
    if not trusted_root.is_file():
        raise ValidationError("--trusted-root", "must be an existing trusted_root.json", str(trusted_root))
    # Fail closed: a directory whose SHA256SUMS nothing signs would otherwise pass with zero bundles checked.
    if not (directory / CHECKSUMS_BUNDLE).is_file():
        raise CheckFailed(f"{directory}: {CHECKSUMS_BUNDLE} is missing: nothing signs the release's SHA256SUMS")
    # node runs in the project directory: absolute paths
    jobs = signer_jobs(directory.resolve(), identity, issuer, repository, ref)
    outcomes = sigstore_js_verify(trusted_root.resolve(), jobs)
    refused = [f"{Path(str(job.get('bundle') or job.get('checksums'))).name}: {outcome.output}"
               for job, outcome in zip(jobs, outcomes, strict=True) if not outcome.ok]
    if refused:
        raise CheckFailed("sigstore-js refused " + "; ".join(refused))
    typer.echo(f"verified with sigstore-js: {len(jobs) - 1} bundles and SHA256SUMS, signed by {identity}"
               + (f" for {repository} at {ref}" if repository or ref else ""))


def register(app: typer.Typer) -> None:
    app.command(name="verify")(verify)
    app.command(name="sigstore-js")(sigstore_js)
