"""Durable delivery of the publication outbox.

The worker writes a publication row in the same transaction that makes a run
terminal (``Queue.complete``, on either backend). This loop delivers those rows:

- claim a due row with a lease (two publishers never deliver one row at once; a
  publisher that dies leaves the lease to expire and the row to be claimed again);
- run the target's idempotent ``publish`` (re-delivery after a crash between the
  publication and ``mark_published`` changes nothing: exactly once in effect);
- on failure record the error and a retry time with exponential backoff;
- after the retry budget, write ``publisher-error.json`` into the run's artifacts
  (re-checksummed and re-signed with the rest) and keep the row for a later retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.contracts import PublicationRequest
from pipeline.core.documents import PublisherError, ReleaseSummary, dump_document, load_document
from pipeline.core.errors import Error, ValidationError
from pipeline.core.layout import PUBLISHER_ERROR, SUMMARY
from pipeline.core.paths import REPO_ROOT
from pipeline.evidence.signing import default_signer
from pipeline.evidence.writer import reseal as evidence_reseal
from pipeline.publish.bundle import ReleaseBundle, load_bundle
from pipeline.publish.targets import (
    GitHubTarget,
    LocalTarget,
    PublishError,
    PublishPolicy,
    PublishResult,
    Target,
    github_repo,
)
from pipeline.verify.external import cosign_commands, image_command_lines, sigstore_commands
from pipeline.verify.gh import gh_commands, gh_image_lines
from pipeline.verify.policy import Builder, parse_builder

log = logging.getLogger(__name__)

DEFAULT_LOCAL_ROOT = REPO_ROOT / "dist" / "releases"


class OutboxQueue(Protocol):
    """The part of ``pipeline.infra.queue.sql.Queue`` (SQLite or PostgreSQL) the publisher uses."""

    def pending_publications(self, limit: int = 10, now: Any = None) -> list[Any]: ...
    def claim_publication(self, pub_id: int, lease_seconds: float) -> bool: ...
    def mark_published(self, pub_id: int, result: Any) -> None: ...
    def record_publication_failure(self, pub_id: int, error: str, retry_at: Any) -> None: ...


TargetFactory = Callable[[PublicationRequest], Target]
Resealer = Callable[[Path], None]
"""Re-checksums and re-signs an artifacts dir after publisher-error.json was written."""


@dataclass(frozen=True)
class OutboxConfig:
    max_attempts: int = 5
    base_delay: float = 2.0
    max_delay: float = 300.0
    later_delay: float = 3600.0  # after the budget: how long until the row is tried again
    lease_seconds: float = 300.0
    batch: int = 10

    def delay(self, attempts: int) -> float:
        """Backoff before attempt ``attempts + 1`` (``attempts`` failures so far)."""
        if attempts >= self.max_attempts:
            return self.later_delay
        return float(min(self.max_delay, self.base_delay * 2 ** max(0, attempts - 1)))


@dataclass
class DeliveryReport:
    published: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        return {"published": self.published, "failed": self.failed, "skipped": self.skipped}


def default_target_factory(policy: PublishPolicy | None = None) -> TargetFactory:
    """local -> LocalTarget(options.root or dist/releases); github -> GitHubTarget(options.repository)."""

    def make(request: PublicationRequest) -> Target:
        if request.target == "local":
            return LocalTarget(Path(request.options.get("root") or DEFAULT_LOCAL_ROOT),
                               repository=request.options.get("repository") or None)
        repository = request.options.get("repository")
        if not repository:
            raise PublishError("publication options.repository is required for the github target", retryable=False)
        release_id = request.options.get("release_id")
        if release_id is not None and not release_id.isdigit():
            raise PublishError(f"publication options.release_id must be digits (got {release_id!r})", retryable=False)
        return GitHubTarget(github_repo(repository, base_url=request.options.get("api_url")), policy,
                            release_id=int(release_id) if release_id else None)

    return make


def verify_commands(artifacts_dir: Path, *, repository: str, tag: str, trusted_root: Path | None = None,
                    infra_repository: str | None = None, builder: Builder | None = None) -> list[str]:
    """The command lines the release body shows (from the evidence stage), stating the release
    the consumer must expect: ``repository`` at ``tag``, sealed for ``infra_repository`` by
    ``builder``'s benchmark.yml (``options.infra_repository`` and ``options.builder``: the
    publisher's statement of who sealed it, required for GitHub-identity bundles, never read
    from them).

    They name plain ``cosign``, ``gh`` and ``benchseal``: the consumer's own, not this machine's tools path.
    ``trusted_root`` (``options.trusted_root`` of a local publication) is the private instance's
    root a consumer of that release needs; public-good releases need none.
    """
    cosign = cosign_commands(artifacts_dir, repository=repository, tag=tag, trusted_root=trusted_root,
                             cosign="cosign", benchseal="benchseal", infra_repository=infra_repository, builder=builder)
    # The same attestations for gh users: `gh attestation verify` with the same signer pinned.
    gh = gh_commands(artifacts_dir, repository=repository, tag=tag, trusted_root=trusted_root,
                     infra_repository=infra_repository, builder=builder)
    # sigstore-python's and sigstore-js's, before the benchseal line (cosign_commands' last).
    others = sigstore_commands(artifacts_dir, repository=repository, tag=tag, trusted_root=trusted_root,
                               infra_repository=infra_repository, builder=builder)
    return [*cosign[:-1], *others, cosign[-1], *gh]


def image_commands(artifacts_dir: Path, *, repository: str, tag: str, trusted_root: Path | None = None,
                   builder: Builder | None = None, infra_repository: str | None = None) -> list[str]:
    """The body's cosign lines for the runner and api images (plain ``cosign``, as the consumer's):
    for ``repository`` at ``tag`` and the release's commit, signed by ``builder``'s release.yml
    (without one: the source's tag.yml, as ``benchseal verify-image`` expects by default); and the
    runner's test-result attestation, sealed by ``builder``'s benchmark.yml for ``infra_repository``; then
    gh's checks of each image's provenance and SBOM by the same signer and of the test result (plain ``gh``)."""
    cosign = image_command_lines(artifacts_dir, repository, tag, binary="cosign", trusted_root=trusted_root,
                                 builder=builder, infra_repository=infra_repository)
    return [*cosign, *gh_image_lines(artifacts_dir, repository=repository, tag=tag, builder=builder,
                                     trusted_root=trusted_root, infra_repository=infra_repository)]


def _body_repository(request: PublicationRequest, artifacts: Path) -> str:
    """The repository the printed commands expect: where a GitHub publication goes; for a local
    directory without ``options.repository``, the source the run's own summary names."""
    repository = request.options.get("repository")
    if repository:
        return repository
    if request.target == "github":
        raise PublishError("publication options.repository is required for the github target", retryable=False)
    try:
        return load_document(ReleaseSummary, artifacts / SUMMARY).source.repository
    except (OSError, ValidationError) as exc:
        raise PublishError(f"{artifacts}/{SUMMARY} names no source.repository for the verify commands: {exc}",
                           retryable=False) from None


def default_resealer(signer: Any = None) -> Resealer:
    """Re-checksum and re-sign through the evidence stage (SHA256SUMS then covers publisher-error.json)."""

    def reseal(artifacts_dir: Path) -> None:
        evidence_reseal(artifacts_dir, signer=signer or default_signer())

    return reseal


def prepare_bundle(request: PublicationRequest) -> ReleaseBundle:
    """Everything a publication carries, checked before any request is made (no network)."""
    artifacts = Path(request.artifacts_dir)
    root = request.options.get("trusted_root")
    try:
        repository = _body_repository(request, artifacts)
        stated = request.options.get("builder")
        builder = parse_builder(stated, "options.builder") if stated else None
        commands = verify_commands(artifacts, repository=repository, tag=request.tag,
                                   trusted_root=Path(root) if root else None,
                                   infra_repository=request.options.get("infra_repository") or None, builder=builder)
        images = image_commands(artifacts, repository=repository, tag=request.tag,
                                trusted_root=Path(root) if root else None, builder=builder,
                                infra_repository=request.options.get("infra_repository") or None)
        bundle = load_bundle(artifacts, request.tag, commands, images)
    except ValidationError as exc:
        # Bad summary content or an over-long body: waiting cannot heal it.
        raise PublishError(exc.diagnostics(), retryable=False) from exc
    if request.run_id != "unknown" and bundle.run_id not in {request.run_id, "unknown"}:
        raise PublishError(
            f"{artifacts}/summary.json is for run {bundle.run_id}, the publication for {request.run_id}",
            retryable=False,
        )
    return bundle


def publish_request(request: PublicationRequest, target: Target, *, bundle: ReleaseBundle | None = None) -> PublishResult:
    """One delivery attempt of one publication (the unit the outbox retries)."""
    bundle = bundle or prepare_bundle(request)
    return target.publish(bundle, manual=request.options.get("trigger") == "manual")


def _write_publisher_error(request: PublicationRequest, attempts: int, error: str, reseal: Resealer) -> None:
    artifacts = Path(request.artifacts_dir)
    document = PublisherError(run_id=request.run_id, tag=request.tag, target=request.target, attempts=attempts,
                              error=error, at=datetime.now(UTC).replace(microsecond=0))
    dump_document(document, artifacts / PUBLISHER_ERROR)
    reseal(artifacts)


def deliver_pending(
    queue: OutboxQueue,
    *,
    targets: TargetFactory | None = None,
    config: OutboxConfig | None = None,
    reseal: Resealer | None = None,
    run_id: str | None = None,
) -> DeliveryReport:
    """Deliver every due outbox row once (only ``run_id``'s when given); returns what happened.

    Wall-clock time throughout: the queue's leases and due times are wall-clock too.
    """
    config = config or OutboxConfig()
    targets = targets or default_target_factory()
    reseal = reseal or default_resealer()
    report = DeliveryReport()
    for pub in queue.pending_publications(limit=config.batch, now=_as_dt(time.time())):
        if run_id is not None and pub.request.run_id != run_id:
            continue  # e.g. `release --local` delivers its own run only
        if not queue.claim_publication(pub.id, config.lease_seconds):
            report.skipped += 1  # another publisher holds it
            continue
        request: PublicationRequest = pub.request
        try:
            # The bundle first: a publication that cannot be made fails before the target is
            # built (building a GitHub target already reads the repository).
            bundle = prepare_bundle(request)
            result = publish_request(request, targets(request), bundle=bundle)
        except Exception as exc:
            message = exc.diagnostics() if isinstance(exc, Error) else f"{type(exc).__name__}: {exc}"
            retryable = not isinstance(exc, PublishError) or exc.retryable
            attempts = pub.attempts + 1  # claim_publication counted this attempt
            # A failure that waiting cannot heal uses up the budget at once.
            exhausted = not retryable or attempts >= config.max_attempts
            if exhausted:
                try:
                    _write_publisher_error(request, attempts, message, reseal)
                except Exception as seal_exc:  # the row must still record the failure
                    log.error("could not write %s for run %s: %s", PUBLISHER_ERROR, request.run_id, seal_exc)
            delay = config.later_delay if exhausted else config.delay(attempts)
            retry_at = _as_dt(time.time() + delay)
            queue.record_publication_failure(pub.id, message, retry_at)
            log.warning("publication %s (run %s) failed, attempt %d: %s", pub.id, request.run_id, attempts, message)
            report.failed.append({"id": pub.id, "run_id": request.run_id, "attempts": attempts, "error": message,
                                  "retry_at": retry_at.isoformat()})
            continue
        queue.mark_published(pub.id, result.to_json_dict())
        report.published.append({"id": pub.id, "run_id": request.run_id, **result.to_json_dict()})
    return report


def run_forever(
    queue: OutboxQueue,
    *,
    interval: float = 5.0,
    stop: threading.Event | None = None,
    **kwargs: Any,
) -> None:
    """The publisher loop (``benchseal publish --pending --loop``): until ``stop`` is set."""
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            deliver_pending(queue, **kwargs)
        except Error as exc:
            log.error("publisher loop: %s", exc.diagnostics())
        stop.wait(interval)


def _as_dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
