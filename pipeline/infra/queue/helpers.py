"""Small things both queue backends use: the DB-API cursor they share, times, one-line messages, URLs."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from pipeline.core.errors import ValidationError

T = TypeVar("T")
log = logging.getLogger("benchseal.queue")


class Cursor(Protocol):
    """The DB-API cursor subset both backends provide (``?`` placeholders)."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def epoch(moment: datetime | None) -> float:
    if moment is None:
        return time.time()
    if moment.tzinfo is None:
        raise ValidationError("now", "datetimes must be timezone-aware (UTC)", moment.isoformat())
    return moment.timestamp()


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def redact_url(url: str) -> str:
    """A connection URL without its password (and without query parameters, which may carry one)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        user = f"{parts.username}@" if parts.username else ""
    except ValueError:
        return f"{url.partition(':')[0]}://..."
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"
