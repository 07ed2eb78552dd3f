"""``benchseal`` inside the runner image: ``benchseal trial run`` (images/runner/image.toml).

The runner image ships Harbor and its dependencies, not sigstore, PyGithub or the Docker SDK,
so it registers only the verb the worker runs there.
"""

from __future__ import annotations

from pipeline.cli import trial
from pipeline.cli.app import new_app, run

app = new_app(trial.register)


def main() -> None:
    run(app)
