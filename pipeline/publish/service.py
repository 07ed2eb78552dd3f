"""The infra host's long-running service: the worker loop with the evidence finalizer,
and (optionally) the publisher loop beside it.

    python -m pipeline.publish.service [--target github|local] [--concurrency N] [--no-publisher]

This is what deploy/benchseal-worker.service runs. ``benchseal worker`` (the infra
stage's CLI) runs the same loop without a finalizer, i.e. without evidence and
without publication; this entry point wires the publish stage's finalizer in. The
publisher may also run as its own unit (``benchseal publish --pending --loop``):
delivery is idempotent and leased, so both at once are safe.

SIGTERM/SIGINT: the worker finishes or releases its run (infra's term grace), the
publisher stops between deliveries; then the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("benchseal.service")


def _signer_factory(kind: str) -> Any:
    def make() -> Any:
        from pipeline.evidence.signing import ambient_signer, default_signer, local_signer

        if kind == "ambient":
            return ambient_signer()
        if kind == "local":
            return local_signer()
        return default_signer()

    return make


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.publish.service", description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("github", "local"), default="github")
    parser.add_argument("--local-root", type=Path, help="Root of the local target (default dist/releases).")
    parser.add_argument("--api-url", help="GitHub API URL stored in the publication rows (default $GITHUB_API_URL).")
    parser.add_argument("--signer", choices=("auto", "ambient", "local"), default="auto",
                        help="ambient: the OIDC token of the environment; local: the private instance.")
    parser.add_argument("--db", type=Path, help="Queue database (default: state dir infra/queue.sqlite3).")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--term-grace", type=float, default=30.0)
    parser.add_argument("--no-publisher", action="store_true", help="Only the worker (publisher runs elsewhere).")
    parser.add_argument("--publish-interval", type=float, default=10.0)
    args = parser.parse_args(argv)

    from pipeline.infra.policy import load_policy
    from pipeline.infra.queue import SqliteQueue
    from pipeline.infra.worker import WorkerConfig, run_forever
    from pipeline.publish import outbox
    from pipeline.publish.finalize import evidence_finalizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = WorkerConfig(db=args.db, policy=load_policy(), term_grace_seconds=args.term_grace)
    signal.signal(signal.SIGTERM, lambda *_: config.stop.set())
    signal.signal(signal.SIGINT, lambda *_: config.stop.set())
    options: dict[str, str] = {}
    if args.target == "local" and args.local_root:
        options["root"] = str(args.local_root.resolve())
    if args.target == "github" and args.api_url:
        options["api_url"] = args.api_url
    finalize = evidence_finalizer(target=args.target, signer=_signer_factory(args.signer), options=options)

    publisher: threading.Thread | None = None
    if not args.no_publisher:
        def publish_loop() -> None:
            with SqliteQueue(args.db) as queue:
                outbox.run_forever(queue, interval=args.publish_interval, stop=config.stop)

        publisher = threading.Thread(target=publish_loop, name="publisher")
        publisher.start()
    log.info("worker started (target %s, concurrency %d, publisher %s)", args.target, args.concurrency,
             "off" if publisher is None else "on")
    run_forever(config, concurrency=args.concurrency, finalize=finalize)
    if publisher is not None:
        publisher.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
