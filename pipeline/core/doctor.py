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
