"""``benchseal publish``: deliver the publication outbox, or publish one run's artifacts by hand.

    benchseal publish --pending [--loop] [--json]          # outbox rows written by the worker
    benchseal publish ARTIFACTS --tag vX.Y.Z --target local|github [--repo OWNER/NAME]
                      [--infra-repo OWNER/INFRA] [--builder OWNER/REPO@REF] [--trigger manual|tag] [--json]

The GitHub token is read from $GITHUB_TOKEN (never from argv). A hand publication is
"manual": it may touch only prereleases unless --allow-full-release is given; benchmark.yml's
seal job publishes the evidence of a tag's benchmark with ``--trigger tag``. ``--infra-repo``
(the repository whose benchmark the evidence is of), ``--builder`` (benchseal's repository at the
exact ref the workflows pin: its benchmark.yml sealed the evidence, its release.yml signed the
images) and ``--trusted-root`` (a private instance's root, tests and local releases) go into the
commands the release body prints; evidence signed with a GitHub Actions identity needs both
``--infra-repo`` and ``--builder`` (exit 2 without them: the body would print a guessed signer).
Exit codes: 0 published; 1 a publication failed (the outbox row stays for a retry); 2 usage.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.core.contracts import PublicationRequest, validate_repository
from pipeline.core.errors import CheckFailed, UsageError, ValidationError
from pipeline.infra.queue.sql import open_queue

if TYPE_CHECKING:
    from pipeline.publish.targets import PublishPolicy, PublishResult


def publish(
    artifacts: Annotated[Path | None, typer.Argument(help="A run's artifacts directory (manual publication).")] = None,
    pending: bool = typer.Option(False, "--pending", help="Deliver the due rows of the infra outbox."),
    loop: bool = typer.Option(False, "--loop", help="With --pending: keep delivering until SIGTERM."),
    interval: float = typer.Option(5.0, "--interval", min=0.1, help="Seconds between outbox polls (--loop)."),
    max_attempts: int = typer.Option(5, "--max-attempts", min=1, help="Retry budget before publisher-error.json."),
    tag: str | None = typer.Option(None, "--tag", help="Release tag (manual publication)."),
    target: str = typer.Option("local", "--target", help="local or github."),
    repo: str | None = typer.Option(None, "--repo", help="OWNER/NAME for --target github."),
    api_url: str | None = typer.Option(None, "--api-url", help="GitHub API base URL (default $GITHUB_API_URL)."),
    root: Annotated[Path | None, typer.Option("--root", help="Local target root (default dist/releases).")] = None,
    allow_full_release: bool = typer.Option(False, "--allow-full-release",
                                            help="Allow a manual publication to a non-prerelease."),
    infra_repo: str | None = typer.Option(None, "--infra-repo", help="The infra repository OWNER/NAME whose "
                                          "benchmark produced ARTIFACTS (printed in the body's verify commands)."),
    builder: str | None = typer.Option(None, "--builder", help="The builder OWNER/REPO@REF (benchseal's repository "
                                       "and the exact ref the workflows pin) whose benchmark.yml sealed ARTIFACTS and "
                                       "whose release.yml signed the images: the body's commands pin it."),
    trusted_root: Annotated[str | None, typer.Option("--trusted-root", envvar="BENCHSEAL_TRUSTED_ROOT",
                                                     help="A private instance's trusted_root.json the body's commands "
                                                          "name (never for public-good; empty: unset).")] = None,
    trigger: str = typer.Option("manual", "--trigger", help="manual (a person; prereleases only unless "
                                "--allow-full-release) or tag (a tag's benchmark, from benchmark.yml's seal job)."),
    attempts: int = typer.Option(1, "--attempts", min=1, max=10, help="ARTIFACTS: tries of a retryable failure "
                                 "(5xx, rate limit, timeout), with the outbox's backoff; the seal job uses 5."),
    db: Annotated[Path | None, typer.Option("--db", help="Queue database (default: state dir infra/queue.sqlite3).")] = None,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
) -> None:
    """Publish benchmark evidence to a GitHub Release or dist/releases/<tag>/."""
    # lazy: pipeline.publish (sigstore, PyGithub) + pipeline.publish.targets (PyGithub) cost 471 ms at CLI start (bench/cli.py, 2026-12-03); the helpers below import the rest
    from pipeline.publish.targets import PublishPolicy

    policy = PublishPolicy(allow_manual_full_release=allow_full_release)
    if pending:
        if (artifacts is not None or tag is not None or infra_repo is not None or builder is not None
                or trigger != "manual" or attempts != 1):
            raise UsageError("--pending delivers the outbox; do not combine it with ARTIFACTS, --tag, --infra-repo, "
                             "--builder, --attempts or --trigger")
        _deliver_pending(policy, db=db, loop=loop, interval=interval, max_attempts=max_attempts, as_json=as_json)
        return

    if artifacts is None or tag is None:
        raise UsageError("give --pending, or ARTIFACTS and --tag")
    options = _manual_options(artifacts, target=target, trigger=trigger, infra_repo=infra_repo, builder=builder,
                              trusted_root=trusted_root, root=root, repo=repo, api_url=api_url)
    request = PublicationRequest(run_id="unknown", target=target, tag=tag,  # type: ignore[arg-type]
                                 artifacts_dir=str(artifacts.resolve()), options=options)
    result = _publish_with_retries(request, policy, attempts)
    if as_json:
        typer.echo(json.dumps(result.to_json_dict(), indent=2))
    else:
        changed = sum(1 for action in result.assets.values() if action != "kept")
        typer.echo(f"published {tag} -> {result.location} ({result.strategy}; {changed} asset(s) changed, "
                   f"body {'updated' if result.body_changed else 'unchanged'})")


def _deliver_pending(policy: PublishPolicy, *, db: Path | None, loop: bool, interval: float, max_attempts: int,
                     as_json: bool) -> None:
    """``--pending``: deliver the outbox's due rows (``--loop``: until SIGTERM); Exit(1) if one failed."""
    # lazy: pipeline.publish (sigstore, PyGithub) + pipeline.publish.targets (PyGithub) cost 471 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.publish import outbox

    queue = open_queue(db)
    config = outbox.OutboxConfig(max_attempts=max_attempts)
    targets = outbox.default_target_factory(policy)
    if loop:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        outbox.run_forever(queue, interval=interval, stop=stop, targets=targets, config=config)
        return
    report = outbox.deliver_pending(queue, targets=targets, config=config)
    if as_json:
        typer.echo(json.dumps(report.to_json_dict(), indent=2))
    else:
        for item in report.published:
            typer.echo(f"published run {item['run_id']} -> {item['location']} ({item['strategy']})")
        for item in report.failed:
            typer.echo(f"failed run {item['run_id']} (attempt {item['attempts']}, retry at {item['retry_at']}): "
                       f"{item['error']}", err=True)
    if report.failed:
        raise typer.Exit(1)


def _manual_options(artifacts: Path, *, target: str, trigger: str, infra_repo: str | None, builder: str | None,
                    trusted_root: str | None, root: Path | None, repo: str | None,
                    api_url: str | None) -> dict[str, str]:
    """A hand publication's options, each checked (in this order) before anything is published."""
    # lazy: pipeline.verify.external (cryptography, the policy loader) costs 50-76 ms at CLI start (measured after pipeline.cli.main, 2026-12-04)
    from pipeline.verify.external import command_profile
    from pipeline.verify.policy import parse_builder

    if not artifacts.is_dir():
        raise ValidationError("ARTIFACTS", "must be an existing directory of sealed evidence", str(artifacts))
    if target not in ("local", "github"):
        raise UsageError(f"invalid --target: must be local or github (got {target!r})")
    if trigger not in ("manual", "tag"):
        raise UsageError(f"invalid --trigger: must be manual or tag (got {trigger!r})")
    options = {"trigger": trigger}
    if infra_repo is not None:
        options["infra_repository"] = validate_repository(infra_repo, "--infra-repo")
    if builder is not None:
        options["builder"] = str(parse_builder(builder, "--builder"))
    if command_profile(artifacts, None) == "production":
        # GitHub-identity evidence: the body pins who sealed it, as the publisher was told, never guessed.
        for option, key in (("--infra-repo", "infra_repository"), ("--builder", "builder")):
            if key not in options:
                raise UsageError(f"{option} is required: ARTIFACTS are signed with a GitHub Actions identity, and the "
                                 f"release body's commands pin the infra repository and the builder that sealed them")
    if trusted_root:
        if not Path(trusted_root).is_file():
            raise UsageError(f"invalid --trusted-root: must be an existing trusted_root.json (got {trusted_root!r})")
        options["trusted_root"] = str(Path(trusted_root).resolve())
    if root is not None:
        options["root"] = str(root.resolve())
    if target == "github":
        if not repo:
            raise UsageError("--target github needs --repo OWNER/NAME")
        options["repository"] = repo
        if api_url:
            options["api_url"] = api_url
    return options


def _publish_with_retries(request: PublicationRequest, policy: PublishPolicy, attempts: int) -> PublishResult:
    """Publish ``request``, retrying a retryable failure with the outbox's backoff; CheckFailed otherwise."""
    # lazy: pipeline.publish (sigstore, PyGithub) + pipeline.publish.targets (PyGithub) cost 471 ms at CLI start (bench/cli.py, 2026-12-03)
    from pipeline.publish import outbox
    from pipeline.publish.targets import PublishError

    backoff = outbox.OutboxConfig(max_attempts=attempts)
    for attempt in range(1, attempts + 1):
        try:
            # The evidence is checked before GitHub is asked anything.
            bundle = outbox.prepare_bundle(request)
            result = outbox.publish_request(request, outbox.default_target_factory(policy)(request), bundle=bundle)
            break
        except PublishError as exc:
            # Publication is idempotent (assets synced by digest, one section replaced): a retry
            # after a partial attempt converges on the same release.
            if not exc.retryable or attempt == attempts:
                raise CheckFailed(f"{exc.diagnostics()} (attempt {attempt} of {attempts})") from None
            wait = backoff.delay(attempt)
            typer.echo(f"publication attempt {attempt} of {attempts} failed, retrying in {wait:.0f} s: "
                       f"{exc.diagnostics()}", err=True)
            time.sleep(wait)
    return result


def register(app: typer.Typer) -> None:
    app.command(name="publish")(publish)
