"""Strict JSON: the one reader for documents that several programs must read alike.

Python's ``json`` accepts what other readers refuse or read differently: a key given twice (which
value wins differs between readers), ``NaN``/``Infinity`` literals, and numbers such as ``1e999``
that overflow to infinity. ``loads`` refuses all three with a ``ValueError`` (a
``json.JSONDecodeError`` for bad syntax); bytes must be UTF-8. It imports no stage (bottom layer).
A nesting deep enough to exhaust the interpreter's stack raises ``RecursionError``: callers name
that limit in their own words.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")  # readers disagree on which one wins
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def loads(data: str | bytes) -> Any:
    """``data`` parsed strictly (see the module docstring); ValueError when it is not such JSON."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
