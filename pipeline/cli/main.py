"""The installed ``benchseal`` command: every verb, registered explicitly.

Verb modules import their stage at module level unless a ``# lazy:`` comment gives the measured
start-up cost that keeps it inside the command (bench/cli.py measures them).
"""

from __future__ import annotations

from pipeline.cli import (
    api,
    attest,
    base,
    build,
    dataset,
    dispatch,
    doctor,
    evidence,
    host,
    infra,
    init,
    local,
    publish,
    release,
    resolve_ref,
    sandbox,
    trial,
    verify,
    worker,
)
from pipeline.cli.app import new_app, run

app = new_app(
    base.register,
    build.register,
    attest.register,
    resolve_ref.register,
    dispatch.register,
    infra.register,
    worker.register,
    trial.register,
    api.register,
    evidence.register,
    verify.register,
    publish.register,
    release.register,
    init.register,
    host.register,
    sandbox.register,
    local.register,
    dataset.register,
    doctor.register,
)


def main() -> None:
    run(app)
