"""What a publication carries: the release section and the asset files of one run.

Built from a run's ``artifacts/`` directory. Only files the evidence stage vouched
for are published: the top-level files named in SHA256SUMS (re-hashed here, so a
file changed after checksumming is never published), SHA256SUMS itself and the
Sigstore bundles. The section ends with the record of those assets (name and sha256), which is
how a later publication tells benchseal's assets from the maintainers'.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.documents import ReleaseSummary, load_document
from pipeline.core.errors import CheckFailed
from pipeline.core.fsutil import sha256_file
from pipeline.core.layout import (
    CHECKSUMS,
    CLIENT_TRUST_CONFIG,
    EVIDENCE_ARCHIVE,
    NESTED_SUMS,
    SUMMARY,
    TRUST_FILES,
    TRUSTED_ROOT,
    TRUSTED_ROOT_LINES,
    bundle_name,
    parse_checksums,
)
from pipeline.publish.body import (
    END,
    START,
    SectionFacts,
    check_body_length,
    facts_from_summary,
    render_section,
    with_asset_record,
)

__all__ = ["Asset", "ReleaseBundle", "load_bundle", "sha256_file"]


@dataclass(frozen=True)
class Asset:
    name: str
    path: Path
    sha256: str  # hex
    size: int

    @property
    def digest(self) -> str:
        """In the form GitHub's release-asset ``digest`` field uses."""
        return f"sha256:{self.sha256}"


@dataclass(frozen=True)
class ReleaseBundle:
    tag: str
    run_id: str
    artifacts_dir: Path
    facts: SectionFacts
    section: str
    assets: tuple[Asset, ...]


def asset_notes(names: Collection[str]) -> list[str]:
    """Body lines naming the logs behind the score (the evidence archive) and a private instance's trust
    files, when the release carries them (after the verify commands)."""
    lines: list[str] = []
    if EVIDENCE_ARCHIVE in names and NESTED_SUMS in names:
        lines += ["", f"The logs behind the score (each trial's result.json, verifier output, agent log and trajectory) "
                  f"are in `{EVIDENCE_ARCHIVE}`, which SHA256SUMS signs; check every file against `{NESTED_SUMS}`:",
                  "", "```sh", f"tar -xzf {EVIDENCE_ARCHIVE} && sha256sum -c {NESTED_SUMS}", "```"]
    if all(name in names for name in TRUST_FILES):
        lines += ["", "Signed by a private Sigstore instance, not public-good: its trusted root is published in each "
                  f"tool's form: `{TRUSTED_ROOT}` (cosign `--trusted-root`, `benchseal verify --trusted-root`), "
                  f"`{TRUSTED_ROOT_LINES}` (gh's `--custom-trusted-root`), `{CLIENT_TRUST_CONFIG}` "
                  f"(sigstore-python: `sigstore --trust-config {CLIENT_TRUST_CONFIG} verify identity ...`). "
                  "Trust it only as far as you trust that instance."]
    return lines


def load_bundle(artifacts_dir: Path, tag: str, verify_commands: Sequence[str] = (),
                image_commands: Sequence[str] = ()) -> ReleaseBundle:
    """Read and check a run's artifacts; raise CheckFailed when they are not publishable."""
    artifacts_dir = artifacts_dir.resolve()
    sums_path = artifacts_dir / CHECKSUMS
    summary_path = artifacts_dir / SUMMARY
    for required in (sums_path, summary_path):
        if not required.is_file():
            raise CheckFailed(f"cannot publish {artifacts_dir}: {required.name} is missing")
    sums = parse_checksums(sums_path.read_bytes(), str(sums_path))  # bytes: undecodable is a CheckFailed
    if SUMMARY not in sums:
        raise CheckFailed(f"{sums_path}: does not cover {SUMMARY}")
    assets: list[Asset] = []
    # Flat names only (the parser's rule): nested trial evidence stays in the run dir.
    for name, expected in sorted(sums.items()):
        path = artifacts_dir / name
        actual = sha256_file(path) if path.is_file() else "(missing)"
        if actual != expected:
            raise CheckFailed(f"{path}: sha256 {actual} does not match SHA256SUMS ({expected}); re-run evidence")
        assets.append(Asset(name, path, actual, path.stat().st_size))
    extra = [sums_path, *sorted(artifacts_dir.glob(bundle_name("*")))]
    for path in extra:
        if path.name not in sums:
            assets.append(Asset(path.name, path, sha256_file(path), path.stat().st_size))
    facts = facts_from_summary(load_document(ReleaseSummary, summary_path), tag)
    # The section records the assets by digest: a target later replaces or removes only those.
    section = "\n".join([render_section(facts, verify_commands, image_commands), *asset_notes({a.name for a in assets})])
    section = with_asset_record(section, ((a.name, a.sha256) for a in assets))
    # The smallest body the section can be in: over GitHub's limit, refuse before any request.
    check_body_length(f"{START}\n{section}\n{END}\n", f"release body for {tag} (the benchmark section alone)")
    return ReleaseBundle(
        tag=tag,
        run_id=facts.run_id,
        artifacts_dir=artifacts_dir,
        facts=facts,
        section=section,
        assets=tuple(sorted(assets, key=lambda a: a.name)),
    )
