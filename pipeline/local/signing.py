"""A Signer for the private Sigstore instance on 127.0.0.1: what ``release --local``, ``--signer local``
and the tests sign with. The Signer is production's (pipeline/evidence/signing.py); only its trust
config and token come from the local instance."""

from __future__ import annotations

from pathlib import Path

from sigstore.models import ClientTrustConfig

from pipeline.core.contracts import GITHUB_ISSUER
from pipeline.core.errors import ValidationError
from pipeline.evidence.signing import Signer
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob


def local_signer(*, rekor_version: int = 1, state: Path | None = None, subject: str | None = None,
                 github_job: GitHubJob | None = None) -> Signer:
    """A signer for the private instance on 127.0.0.1 (started if needed). Used only when asked for
    (``--signer local``, ``release --local``, tests): nothing falls back to it.

    With ``github_job`` it signs as that GitHub Actions job (issuer, certificate identity and
    Fulcio extensions exactly as public-good Fulcio issues them), under the local trust root.
    """


    instance = sigstore_local.ensure_running(state)
    config = ClientTrustConfig.from_json(instance.client_trust_config(rekor_version).read_text())
    if github_job is not None:
        if subject is not None:
            raise ValidationError("subject", "cannot be combined with a GitHub job identity", subject)
        job = github_job
        return Signer(
            trust_config=config,
            token=lambda: sigstore_local.mint_github_token(instance, job),
            identity=job.identity,
            issuer=GITHUB_ISSUER,
            trusted_root=instance.trusted_root,
            rekor_version=rekor_version,
        )
    identity = subject or instance.identity
    return Signer(
        trust_config=config,
        token=lambda: sigstore_local.mint_token(instance, subject=identity),
        identity=identity,
        issuer=instance.issuer,
        trusted_root=instance.trusted_root,
        rekor_version=rekor_version,
    )
