"""The suite's own setup, the same for every module whatever runs first."""

from __future__ import annotations

from hypothesis import settings


def test_the_hypothesis_profile_applies_to_every_module() -> None:
    assert settings.default.deadline is None
    assert settings.default.max_examples == 200
