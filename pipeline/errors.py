"""The one error hierarchy of benchseal.

Every error carries a human message from ``diagnostics()`` and the exit code
the CLI returns for it: 2 for usage errors (bad input from the caller), 1 for
failed checks (the world is not as it must be).
"""

from __future__ import annotations


class Error(Exception):
    """Base of every error benchseal raises on purpose."""

    exit_code: int = 1

    def diagnostics(self) -> str:
        return str(self)


class UsageError(Error):
    """The caller gave input that breaks a rule: exit 2."""

    exit_code = 2


class ValidationError(UsageError):
    """A named field breaks a named rule."""

    def __init__(self, field: str, rule: str, value: object | None = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule}")

    def diagnostics(self) -> str:
        shown = "" if self.value is None else f" (got {_shorten(self.value)})"
        return f"invalid {self.field}: {self.rule}{shown}"


class CheckFailed(Error):
    """A check that guards the chain did not pass: exit 1."""

    exit_code = 1


class InfrastructureError(Error):
    """Something the pipeline depends on (engine, registry, network) failed."""

    exit_code = 1


def _shorten(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
