"""A Harbor agent that runs a release's npm CLI (e.g. Qwen Code) in the task container, installing nothing.

The runner image carries Node and the checked package under ``AGENT_ROOT``; the runner hands that
directory to every task container read-only at the same path (``envshared.set_agent_mount``), so a task whose
own image has no Node runs the release's exact bytes. The command line and environment come
from the project file's ``args`` and ``env`` templates (``pipeline.core.project``):

* ``{instruction}``: the task's instruction (one argv element, shell-quoted);
* ``{model_base_url}``: the trial's model gateway, ``http://127.0.0.1:GATEWAY_PORT<path>``, the
  container's only way out;
* ``{model_name}``: the suite's model name (its provider prefix dropped);
* ``{model_key}``: a placeholder: the worker's relay replaces it with the real key upstream.

Environment values reach the container through Harbor's exec env, which ``engine_env`` passes in
the exec's request body (never in an argv); none of them is a secret anyway. The CLI's output is kept in the
trial's agent log dir. Token usage is taken from a JSON result line if the CLI prints one
(``usage``/``stats`` with input/output tokens), else left unknown.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from pipeline.core.contracts import MODEL_CALLS_KEY
from pipeline.core.project import AGENT_MANIFEST_PATH, PLACEHOLDER_KEY, AgentManifest, NpmAgent, read_manifest_file
from pipeline.infra.sandbox.relay import GATEWAY_PORT

IMPORT_PATH = "pipeline.runner.cli_agent:ReleasedCliAgent"
AGENT_TIMEOUT_SECONDS = 900
OUTPUT_FILE = "cli-output.txt"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` placeholders in one pass (a value's own braces, e.g. in an instruction, stay as they are)."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def command_line(manifest: AgentManifest, args: tuple[str, ...]) -> list[str]:
    """``node <package>/<bin> <args>`` with the baked Node."""
    spec = manifest.spec
    if not isinstance(spec, NpmAgent) or manifest.node is None or manifest.package_dir is None:
        raise ValueError("not an npm agent's manifest")
    return [manifest.node.path, f"{manifest.package_dir}/{spec.bin}", *args]


def _usage_of(item: object) -> tuple[int, int] | None:
    usage = item.get("usage") if isinstance(item, dict) else None
    if not isinstance(usage, dict):
        return None
    inp = usage.get("input_tokens", usage.get("prompt_tokens"))
    out = usage.get("output_tokens", usage.get("completion_tokens"))
    return (inp, out) if isinstance(inp, int) and isinstance(out, int) else None


def _calls_of(item: object) -> int | None:
    """Model requests in a result's ``stats.models.*.api.totalRequests`` (Qwen Code, Gemini CLI)."""
    stats = item.get("stats") if isinstance(item, dict) else None
    models = stats.get("models") if isinstance(stats, dict) else None
    if not isinstance(models, dict):
        return None
    counts = [m.get("api", {}).get("totalRequests") for m in models.values() if isinstance(m, dict)]
    return sum(c for c in counts if isinstance(c, int)) if counts else None


def usage_of_output(output: str) -> tuple[int | None, int | None, int | None]:
    """(input tokens, output tokens, model calls) of the run from the CLI's JSON result, if it printed one.

    Read from the last ``usage`` of a JSON document (an object, or an array of events ending
    with the result, as ``--output-format json`` prints them) on the last line that parses.
    """
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not line.startswith(("{", "[")):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        for item in reversed(data if isinstance(data, list) else [data]):
            found = _usage_of(item)
            if found is not None:
                return found[0], found[1], _calls_of(item)
    return None, None, None


class ReleasedCliAgent(BaseAgent):  # type: ignore[misc]
    """Runs the release's npm CLI with the baked Node; see the module docstring."""

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, model_path: str = "/v1",
                 manifest_path: str = AGENT_MANIFEST_PATH, **kwargs: Any) -> None:
        super().__init__(logs_dir, model_name, **kwargs)
        manifest = read_manifest_file(Path(manifest_path))
        if manifest is None:  # the runner checked it before any trial: an image without one runs no release agent
            raise ValueError(f"no agent manifest at {manifest_path}")
        self._manifest = manifest
        self._model_path = model_path.rstrip("/")

    @staticmethod
    def name() -> str:
        return "released-cli"

    def version(self) -> str:
        return self._manifest.artifact.version

    async def setup(self, environment: BaseEnvironment) -> None:
        return None  # nothing is installed at trial time: the files are already mounted

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        spec = self._manifest.spec
        assert isinstance(spec, NpmAgent)
        model = (self.model_name or "").split("/", 1)[-1]
        values = {"instruction": instruction, "model_base_url": f"http://127.0.0.1:{GATEWAY_PORT}{self._model_path}",
                  "model_name": model, "model_key": PLACEHOLDER_KEY}
        argv = command_line(self._manifest, tuple(fill(a, values) for a in spec.args))
        env = {name: fill(value, values) for name, value in spec.env.items()}
        result = await environment.exec(shlex.join(argv), env=env, timeout_sec=AGENT_TIMEOUT_SECONDS)
        output = (result.stdout or "") + (result.stderr or "")
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / OUTPUT_FILE).write_text(f"exit {result.return_code}\n{output}", encoding="utf-8")
        context.n_input_tokens, context.n_output_tokens, calls = usage_of_output(result.stdout or "")
        if calls is not None:
            context.metadata = {**(context.metadata or {}), MODEL_CALLS_KEY: calls}
        # A CLI that exits non-zero has not solved the task; the verifier grades what it left (no infra error).
