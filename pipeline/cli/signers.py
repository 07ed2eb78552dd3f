"""Which signer a verb signs with: the one rule for ``--signer auto|ambient|local`` (``benchseal
evidence`` and ``benchseal worker --publish``). The CLI is where the local world is wired in:
``local`` is the private instance of this state dir (pipeline/local/signing.py); everything else is
the ambient GitHub Actions credential and nothing else, never a fallback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from pipeline.core.errors import ValidationError

if TYPE_CHECKING:
    from pipeline.attest.images import SigstoreEndpoints
    from pipeline.evidence.signing import Signer

SignerKind = Literal["auto", "ambient", "local"]
SIGNER_KINDS: tuple[SignerKind, ...] = ("auto", "ambient", "local")


def signer_factory(kind: str, endpoints: SigstoreEndpoints | None = None, *,
                   rekor_version: int = 1) -> Callable[[], Signer]:
    """A factory of signers of ``kind`` (built per use: an ambient OIDC token is short-lived).
    ``endpoints`` naming a private instance: ambient signing against it (its trust config)."""
    if kind not in SIGNER_KINDS:
        raise ValidationError("--signer", "must be auto, local or ambient", kind)
    private = endpoints if endpoints is not None and endpoints.is_private else None
    if kind == "local" and private is not None:
        raise ValidationError("--signer local", "uses the private instance of this state dir; do not name another")

    def make() -> Signer:
        # lazy: pipeline.evidence.signing (sigstore) costs 380 ms at CLI start (bench/cli.py, 2026-12-03)
        from pipeline.evidence.signing import ambient_signer, default_signer, private_trust_config

        if kind == "local":
            # lazy: pipeline.local.signing costs 8 ms (python, 2026-12-04); the local world loads only with --signer local
            from pipeline.local.signing import local_signer

            return local_signer(rekor_version=rekor_version)
        if private is not None and private.fulcio_url and private.trusted_root:
            return ambient_signer(trust_config=private_trust_config(private.fulcio_url, private.trusted_root),
                                  trusted_root=private.trusted_root)
        # The ambient Actions credential and nothing else (default_signer: no fallback).
        return default_signer()

    return make
