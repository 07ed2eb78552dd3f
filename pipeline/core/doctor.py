"""``benchseal doctor``'s findings: one line per check, with the fix when it does not pass.

A check is ``ok``, ``missing`` (the setup lacks something the chain needs: exit 1), ``unknown``
(the API or the host does not say, e.g. a token's scopes for a fine-grained token: printed with
what to check by hand, not a failure) or ``skipped`` (``--offline``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipeline.core.errors import escape_text

Side = Literal["adopter", "infra", "host"]
Status = Literal["ok", "missing", "unknown", "skipped"]


class Setting(BaseModel):
    """A repository variable or secret the chain reads (docs/github.md step 6)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["variable", "secret"]
    name: str
    value: str  # what to set it to; {repository} and {prefix} (ghcr.io/<owner/name>-) filled in by `init`


# One home for what each repository defines on GitHub: `benchseal init` prints it, `benchseal doctor`
# checks it (names only: GitHub never returns a secret). The optional Sigstore overrides are for tests only.
SETTINGS: dict[str, tuple[Setting, ...]] = {
    "adopter": (
        Setting(kind="variable", name="BENCHSEAL_INFRA_REPOSITORY",
                value="the infra repository that benchmarks {repository} (e.g. acme/bench-infra)"),
        Setting(kind="variable", name="BENCHSEAL_IMAGE_PREFIX",
                value="{prefix} (the images are {prefix}runner and {prefix}api)"),
        Setting(kind="secret", name="BENCHSEAL_INFRA_DISPATCH_TOKEN",
                value="a fine-grained token for the infra repository only, Actions: Read and write "
                      "(docs/github.md step 5)"),
    ),
    "infra": (
        Setting(kind="secret", name="BENCHSEAL_PUBLISH_TOKEN",
                value="a fine-grained token for the adopters' repositories only, Contents: Read and write "
                      "(docs/github.md step 5)"),
    ),
}


def setting_lines(side: str, repository: str) -> list[str]:
    """``variable NAME = value`` / ``secret NAME = value`` for ``side``, as `init` prints them."""
    prefix = f"ghcr.io/{repository.lower()}-"
    return [f"{s.kind} {s.name} = {s.value.format(repository=repository, prefix=prefix)}" for s in SETTINGS[side]]


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    side: Side
    check: str
    status: Status
    detail: str = ""  # what was found
    fix: str = ""  # one line: what to do when the check does not pass

    def line(self) -> str:
        text = f"{self.status.upper():<7} {self.side}: {self.check}"
        if self.detail:
            text += f": {self.detail}"
        if self.status in ("missing", "unknown") and self.fix:
            text += f" -> fix: {self.fix}"
        return escape_text(text)


def ok(side: Side, check: str, detail: str = "") -> Finding:
    return Finding(side=side, check=check, status="ok", detail=detail)


def missing(side: Side, check: str, detail: str, fix: str) -> Finding:
    return Finding(side=side, check=check, status="missing", detail=detail, fix=fix)


def unknown(side: Side, check: str, detail: str, fix: str = "") -> Finding:
    return Finding(side=side, check=check, status="unknown", detail=detail, fix=fix)


def exit_code(findings: Sequence[Finding]) -> int:
    """0 when nothing is missing, 1 otherwise (a failed check is not a usage error)."""
    return 1 if any(f.status == "missing" for f in findings) else 0
