"""Each image names the CLI entry point its ``benchseal`` launcher runs; a bad or missing one fails closed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import ValidationError
from pipeline.imaging.images import app_entry, load_image_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("role", "entry"), [("runner", "pipeline.cli.runner_main"), ("api", "pipeline.cli.api_main")])
def test_each_image_names_its_entry(role: str, entry: str) -> None:
    spec = load_image_spec(role)
    app = next(layer for layer in spec.layers if layer["kind"] == "app")
    assert app_entry(spec, app, ROOT) == entry


@pytest.mark.parametrize("entry", [None, "", "pipeline.cli.main; import os", "os.path", "pipeline.cli.Main", 3,
                                   "pipeline.cli.no_such_module"])
def test_a_missing_or_bad_entry_is_refused(entry: object) -> None:
    spec = load_image_spec("runner")
    layer = {"kind": "app"} if entry is None else {"kind": "app", "entry": entry}
    with pytest.raises(ValidationError, match=r"layers\.entry"):
        app_entry(dataclasses.replace(spec, layers=(layer,)), layer, ROOT)


@pytest.mark.parametrize(("module", "verbs", "absent"), [
    ("pipeline.cli.runner_main", {"trial"}, {"worker", "api", "release"}),
    ("pipeline.cli.api_main", {"api"}, {"worker", "trial", "release"}),
    ("pipeline.cli.main", {"trial", "api", "worker", "release", "build", "publish", "verify"}, set()),
])
def test_entry_points_register_their_verbs(module: str, verbs: set[str], absent: set[str]) -> None:
    code = f"from {module} import app\nimport typer.main\nprint(*sorted(typer.main.get_command(app).commands))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    registered = set(out.stdout.split())
    assert verbs <= registered
    assert not absent & registered


# pipeline.cli.main too: the worker starts the runner container as `python3 -m pipeline`.
@pytest.mark.parametrize("module", ["pipeline.cli.runner_main", "pipeline.cli.main"])
def test_the_runner_cli_loads_no_signing_registry_or_docker_library(module: str) -> None:
    """What the runner image lacks (sigstore, PyGithub, the Docker SDK, fastapi) never loads at CLI start."""
    code = (f"import sys\nimport {module}\n"
            "print(*sorted({m.split('.')[0] for m in sys.modules} & {'sigstore', 'github', 'docker', 'fastapi'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == []
