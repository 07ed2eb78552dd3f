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

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pipeline.evidence.signing import ambient_signer, default_signer, local_signer
from pipeline.infra.queue import open_queue
from pipeline.publish import outbox
from pipeline.publish.finalize import evidence_finalizer

SignerKind = Literal["auto", "ambient", "local"]


def signer_factory(kind: SignerKind) -> Callable[[], Any]:
    # Built lazily: an ambient OIDC token is short-lived, so it is fetched per run.
    def make() -> Any:
        if kind == "ambient":
            return ambient_signer()
        if kind == "local":
            return local_signer()
        return default_signer()

    return make


def worker_finalizer(target: Literal["github", "local"], signer: SignerKind, *,
                     local_root: Path | None = None, api_url: str | None = None) -> Any:
    options: dict[str, str] = {}
    if signer != "local" and os.environ.get("GITHUB_REPOSITORY"):
        # Inside an Actions job (the worker refuses an ambient signer anywhere else): the job's own
        # repository is the infra repository whose workflow identity signs, printed in the body.
        options["infra_repository"] = os.environ["GITHUB_REPOSITORY"]
    if target == "local" and local_root is not None:
        options["root"] = str(local_root.resolve())
    if target == "github" and api_url:
        options["api_url"] = api_url
    return evidence_finalizer(target=target, signer=signer_factory(signer), options=options)


def start_publisher(db: Path | None, stop: threading.Event, interval: float) -> threading.Thread:

    def publish_loop() -> None:
        with open_queue(db) as queue:
            outbox.run_forever(queue, interval=interval, stop=stop)

    publisher = threading.Thread(target=publish_loop, name="publisher")
    publisher.start()
    return publisher
