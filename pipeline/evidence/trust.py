"""The trust material of a release signed by a private Sigstore instance, in the form each tool takes.

A release signed on public-good Sigstore needs none (cosign, gh, sigstore-python and benchseal
know that root) and carries none. A release signed by a private instance (``release --local``,
tests) carries its root three ways, each listed in SHA256SUMS:

* ``trusted_root.json``: the instance's trusted root as it wrote it (cosign ``--trusted-root``,
  ``benchseal verify --trusted-root``);
* ``trusted_root.jsonl``: the same root as one JSON line (gh ``attestation verify
  --custom-trusted-root`` reads JSON Lines and refuses the pretty-printed form);
* ``client_trust_config.json``: a sigstore-python ClientTrustConfig (``sigstore --trust-config``)
  holding that same root and the signing config the signer used.

These are published for convenience: whether to trust a private root is the consumer's decision,
and a root vouching for the signatures it checks proves nothing by itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.layout import CLIENT_TRUST_CONFIG, TRUST_FILES, TRUSTED_ROOT, TRUSTED_ROOT_LINES
from pipeline.evidence.signing import Signer

__all__ = ["write_trust_files"]

CLIENT_TRUST_CONFIG_TYPE = "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json"


def write_trust_files(artifacts: Path, signer: Signer) -> tuple[Path, ...]:
    """Write the three trust files for a private-instance signer into ``artifacts``; for a public-good
    signer (no ``trusted_root``) remove any left by an earlier seal and write none."""
    if signer.trusted_root is None:
        for name in TRUST_FILES:
            (artifacts / name).unlink(missing_ok=True)
        return ()
    try:
        text = signer.trusted_root.read_text("utf-8")
        root = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"{signer.trusted_root}: the signer's trusted root cannot be read as JSON ({exc})") from None
    if not isinstance(root, dict) or "mediaType" not in root:
        raise CheckFailed(f"{signer.trusted_root}: not a Sigstore trusted root (no mediaType)")
    # The signer's own signing config (its inner protobuf model is the only serialisation sigstore-python
    # offers), with the very root published beside it.
    signing = json.loads(signer.trust_config._inner.to_json()).get("signingConfig")
    if not signing:
        raise CheckFailed("the signer's trust config has no signing config")
    config = {"mediaType": CLIENT_TRUST_CONFIG_TYPE, "trustedRoot": root, "signingConfig": signing}
    written = []
    for name, content in ((TRUSTED_ROOT, text if text.endswith("\n") else text + "\n"),
                          (TRUSTED_ROOT_LINES, json.dumps(root, separators=(",", ":")) + "\n"),
                          (CLIENT_TRUST_CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")):
        atomic_write_text(artifacts / name, content)
        written.append(artifacts / name)
    return tuple(written)
