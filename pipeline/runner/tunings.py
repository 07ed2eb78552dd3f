"""What ``pipeline.runner.engine_env`` and ``harbor_env`` change in Harbor's per-trial work (docs/infra.md), by name.

Harbor-free, so the worker (which passes ``BENCHSEAL_HARBOR_DISABLE`` into the runner) and the
runner's environment class share it without importing each other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pipeline.core.errors import ValidationError

# engine-api: benchseal's engine environment (pipeline.runner.engine_env) instead of Harbor's compose one
# (pipeline.runner.harbor_env); the compose one alone reads stop-signal, never-pull and no-predown (the engine
# environment always removes with SIGKILL, never pulls, never removes before it creates); both read async-stop;
# prestart (the engine environment's): the next trials' agent environments start while they wait for a slot.
TUNINGS = ("engine-api", "stop-signal", "never-pull", "no-predown", "async-stop", "prestart")
DISABLE_ENV = "BENCHSEAL_HARBOR_DISABLE"


def enabled_tunings(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """``TUNINGS`` minus the ones named in ``BENCHSEAL_HARBOR_DISABLE`` (an unknown name is an error)."""
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    disabled = {item.strip() for item in raw.split(",") if item.strip()}
    unknown = sorted(disabled - set(TUNINGS))
    if unknown:
        raise ValidationError(DISABLE_ENV, f"unknown names {unknown}; known: {', '.join(TUNINGS)}")
    return frozenset(TUNINGS) - disabled


