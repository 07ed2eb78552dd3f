"""The API image the infra host runs (deploy/benchseal-api.service), checked like a runner before it runs.

The image is named by digest only (``benchseal host install --api-image REF@sha256:...``). It is
admitted when a release the infra accepted carries it as its ``api`` image (a run in the queue
whose payload names exactly that reference), the policy still admits that image name for the
release's repository, and cosign verifies its signature and its provenance and SBOM attestations
by one identity the policy's ``signer`` entries admit for that release, at its tag and commit
(``signer_identities``: the worker's own rule for the images of a run). Then it is pulled by
digest on the host's engine (``pull_by_digest``: RepoDigests must list exactly that reference).

Reading the queue here (read-only, on the host, where the queue's directory is writable) also
leaves a SQLite queue's ``-wal`` and ``-shm`` files in place, which the API's container, seeing
that directory read-only, needs to read it (``pipeline.infra.queue.sqlite``).
"""

from __future__ import annotations

from dataclasses import dataclass

import docker
import docker.errors

from pipeline.attest.images import SigstoreEndpoints
from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed, InfrastructureError, ValidationError
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.queue.sql import Queue
from pipeline.infra.worker.config import InfraFailure
from pipeline.infra.worker.images import pull_by_digest
from pipeline.infra.worker.loop import signed_by_one_of, signer_identities

# Releases tried, newest first: one reproducible API image can be every release's, each signed anew.
MAX_RELEASES = 5


@dataclass(frozen=True)
class CheckedImage:
    ref: str
    image_id: str
    release: str  # OWNER/NAME@TAG whose signature admitted it
    signer: str  # the certificate identity that signed it


def _verify(ref: str, queue: Queue, policy: InfraPolicy, trust: SigstoreEndpoints) -> tuple[str, str]:
    image = parse_ref(ref, "api image")
    carried = [r for r in reversed(queue.list_runs()) if r.payload.api == image.ref]
    if not carried:
        raise CheckFailed(f"api image {image.ref}: no release the infra accepted carries it (no run in the queue "
                          f"{getattr(queue, 'location', '')} names it as its api image): run the API image of a "
                          "release the infra scored")
    refusals: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for record in carried:
        source = record.payload.source
        key = (source.repository, source.tag, source.commit)
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > MAX_RELEASES:
            break
        release = f"{source.repository}@{source.tag}"
        try:
            entry = policy.source(source.repository)
            policy.check_image("api", image, field="api image", repository=entry.repository)
        except ValidationError as exc:
            refusals.append(f"{release}: {exc}")
            continue
        try:
            signer, refused = signed_by_one_of(image, signer_identities(record.payload, entry), trust, "api image")
        except InfraFailure as exc:
            raise InfrastructureError(str(exc)) from None
        if signer is not None:
            return release, signer.identity
        refusals += [f"{release}, {refusal}" for refusal in refused]
    raise CheckFailed(f"api image {image.ref} is not signed by any identity the policy admits for the releases "
                      "that carry it: " + "; ".join(refusals))


def check_api_image(ref: str, queue: Queue, trust: SigstoreEndpoints, *, policy: InfraPolicy | None = None,
                    client: object | None = None) -> CheckedImage:
    """Verify ``ref`` (see the module docstring) and pull it by digest; CheckFailed when it is not admitted."""
    release, signer = _verify(ref, queue, policy or load_policy(), trust)
    image = parse_ref(ref, "api image")
    try:
        engine = client if client is not None else docker.from_env(timeout=300)
        image_id = pull_by_digest(engine, image)
    except (InfraFailure, docker.errors.DockerException) as exc:
        raise InfrastructureError(f"api image {image.ref}: {exc}") from None
    return CheckedImage(ref=image.ref, image_id=image_id, release=release, signer=signer)
