"""Wiring for the infra host's long-running worker: the evidence finalizer and the
publisher loop that ``benchseal worker --publish ...`` adds to infra's worker loop.

``benchseal worker`` without ``--publish`` runs trials and grades only (no evidence, no
outbox rows): what deploy/benchseal-worker.service runs; benchmark.yml's seal job signs. With
``--publish github|local`` (``--signer local``, or inside an Actions job) every terminal run
carries signed evidence and a publication row written in the same transaction. ``--with-publisher`` delivers the
outbox in a thread beside the worker; it may also run as its own unit
(``benchseal publish --pending --loop``): delivery is idempotent and leased, so both at
once are safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pipeline.infra.queue.sql import open_queue
from pipeline.publish import outbox
from pipeline.publish.finalize import evidence_finalizer
from pipeline.verify.policy import parse_builder


def worker_finalizer(target: Literal["github", "local"], make_signer: Callable[[], Any], *,
                     infra_repository: str | None = None, local_root: Path | None = None,
                     api_url: str | None = None, trusted_root: Path | None = None,
                     builder: str | None = None) -> Any:
    """The finalizer that seals every terminal run with ``make_signer`` and writes its publication
    row: ``infra_repository`` is the repository the signing job ran for and ``builder``
    (``OWNER/REPO@REF``) the reusable workflow's repository and ref that signs (both printed in the
    body; a GitHub-identity publication without them is refused), ``trusted_root`` the private
    instance's root a consumer of a local-instance release needs."""
    options: dict[str, str] = {}
    if infra_repository:
        options["infra_repository"] = infra_repository
    if builder:
        options["builder"] = str(parse_builder(builder, "builder"))
    if target == "local" and local_root is not None:
        options["root"] = str(local_root.resolve())
    if target == "github" and api_url:
        options["api_url"] = api_url
    if trusted_root is not None:
        options["trusted_root"] = str(trusted_root.resolve())
    return evidence_finalizer(target=target, signer=make_signer, options=options)


def start_publisher(db: Path | None, stop: threading.Event, interval: float) -> threading.Thread:

    def publish_loop() -> None:
        with open_queue(db) as queue:
            outbox.run_forever(queue, interval=interval, stop=stop)

    publisher = threading.Thread(target=publish_loop, name="publisher")
    publisher.start()
    return publisher
