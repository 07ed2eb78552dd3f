"""Issue 38, "Done when" 1: the newcomer. An empty git repository, an agent of the test's own, ``benchseal init``,
``benchseal release vX.Y.Z --local`` scored and verified with nothing copied (no policy to write: the local world
admits the repository and the agent, pipeline/local/admission.py), then a later tag of the agent that fails a
task, gated with the reason on the terminal; and each mistake a newcomer makes on the way refused in one line,
exit 2, before anything is built.

The Python agent is the test's own: a Harbor agent class whose shell tool is ``bash`` with a ``cmd`` property
(not hello-agent's ``run_shell_command``): the scripted model finds it by its schema (issue 38.5). Its 1.1.0
skips the task about ``/app/stats.py``; the gate names that task. The npm agent is a CLI of the test's own,
published to a real npm registry (verdaccio) the test starts; a version not yet published is refused before
the build (a rehearsal never waits for a publish).

State: a fresh BENCHSEAL_HOME sharing only the build caches and tools of the default one (warm images).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.contracts import DigestsFile
from pipeline.core.paths import REPO_ROOT
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack
from tests.fixtures.homes import fresh_home
from tests.fixtures.parallel import POLICY_MODEL_PORT

# Its releases serve the scripted model on the shipped policy's fixed port: one such module at a time.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group(POLICY_MODEL_PORT)]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
KEY_ENV = "BENCHSEAL_AGENT_API_KEY"
ERROR = "benchseal: error: "
_GIT_ID = ["-c", "user.name=newcomer", "-c", "user.email=newcomer@example.invalid", "-c", "commit.gpgsign=false"]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "widget-agent"
version = "{version}"
requires-python = ">=3.12"
dependencies = []

[tool.setuptools]
packages = ["widget_agent"]
"""

# The newcomer's agent: a chat loop over an OpenAI-compatible endpoint with ONE tool, `bash` {cmd}.
AGENT = '''\
"""The widget agent: asks the model, runs its `bash` calls in the task's container, until a plain answer."""

import asyncio
import json
import urllib.request

from harbor.agents.base import BaseAgent

TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash script in the task container.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}
SKIP = None  # a task whose instruction names this is not attempted


class WidgetAgent(BaseAgent):
    def __init__(self, logs_dir, model_name=None, api_base=None, **kwargs):
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self._url = api_base.rstrip("/") + "/chat/completions"
        self._model = model_name.removeprefix("openai/")

    @staticmethod
    def name():
        return "widget-agent"

    def version(self):
        return None

    async def setup(self, environment):
        pass

    def _ask(self, messages):
        body = json.dumps({"model": self._model, "messages": messages, "tools": [TOOL]}).encode()
        request = urllib.request.Request(self._url, data=body, headers={
            "Content-Type": "application/json", "Authorization": "Bearer benchseal-placeholder-key"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=300) as answer:
            return json.load(answer)

    async def run(self, instruction, environment, context):
        if SKIP is not None and SKIP in instruction:
            return
        messages = [{"role": "user", "content": instruction}]
        for _ in range(10):
            message = (await asyncio.to_thread(self._ask, messages))["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                cmd = json.loads(call["function"]["arguments"])["cmd"]
                done = await environment.exec(cmd, timeout_sec=120)
                output = (done.stdout or "") + (done.stderr or "") + f"\\n[exit {done.return_code}]"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
'''

# The newcomer's npm agent: a CLI that runs in the task's container (the runner's Node) and calls the model with
# ONE tool, `shell` {command}, through the endpoint and key the runner puts in its environment (benchseal init's env).
CLI = """\
const { execSync } = require('child_process');
if (process.argv[2] === '--version') { console.log(require('./package.json').version); process.exit(0); }
const shell = require('fs').existsSync('/bin/bash') ? '/bin/bash' : '/bin/sh';
const tools = [{type: 'function', function: {name: 'shell', description: 'Run a shell script.', parameters: {
  type: 'object', properties: {command: {type: 'string'}}, required: ['command']}}}];
(async () => {
  const messages = [{role: 'user', content: process.argv[3]}];
  for (let turn = 0; turn < 10; turn++) {
    const answer = await fetch(process.env.OPENAI_BASE_URL.replace(/\\/$/, '') + '/chat/completions', {
      method: 'POST', body: JSON.stringify({model: process.env.OPENAI_MODEL, messages, tools}),
      headers: {'Content-Type': 'application/json', Authorization: 'Bearer ' + process.env.OPENAI_API_KEY}});
    if (!answer.ok) { console.error('model: HTTP ' + answer.status); process.exit(1); }
    const message = (await answer.json()).choices[0].message;
    messages.push(message);
    if (!message.tool_calls || message.tool_calls.length === 0) return;
    for (const call of message.tool_calls) {
      let output;
      try {
        output = execSync(JSON.parse(call.function.arguments).command, {shell, encoding: 'utf8'});
      } catch (failed) { output = String(failed.stdout) + String(failed.stderr); }
      messages.push({role: 'tool', tool_call_id: call.id, content: output});
    }
  }
})();
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *_GIT_ID, *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (KEY_ENV, "GITHUB_REPOSITORY", "BENCHSEAL_PROJECT_DIR", "BENCHSEAL_NPM_REGISTRY",
                        "BENCHSEAL_INFRA_POLICY")}
    return {**env, "BENCHSEAL_HOME": str(home), "HARBOR_TELEMETRY": "0", **extra}


def _benchseal(repo: Path, home: Path, *args: str, timeout: float = 900,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command, run by the newcomer in the repository's top directory."""
    return subprocess.run([BENCHSEAL, *args], cwd=repo, capture_output=True, text=True, env=_env(home, **(env or {})),
                          check=False, timeout=timeout)


def _refused_before_the_build(repo: Path, home: Path, tag: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``release TAG --local``: one error line, exit 2, within seconds, and no stage started."""
    started = time.monotonic()
    done = _benchseal(repo, home, "release", tag, "--local", "--dist", str(home / "dist"), *args, timeout=120, env=env)
    elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == "", done.stderr[-2000:]
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith(ERROR)]
    assert len(errors) == 1 and lines[-1] == errors[0], done.stderr
    assert all(line.startswith(("Releasing ", "Local infra policy (")) for line in lines[:-1]), done.stderr
    assert elapsed < 30, f"refused after {elapsed:.1f} s"
    return errors[0]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[Path]:
    with fresh_home(tmp_path_factory, "newcomer-home") as made:
        yield made


def test_a_newcomer_releases_a_python_agent_and_a_regression_is_gated(home: Path, tmp_path: Path) -> None:
    repo = tmp_path / "widget"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "remote", "add", "origin", "git@github.com:newcomer/widget.git")
    (repo / "widget_agent").mkdir()
    (repo / "widget_agent" / "__init__.py").write_text("")
    (repo / "widget_agent" / "agent.py").write_text(AGENT)
    (repo / "pyproject.toml").write_text(PYPROJECT.format(version="1.0.0"))

    init = _benchseal(repo, home, "init", timeout=120)
    assert init.returncode == 0, init.stderr
    assert "wrote benchseal.toml (python agent widget-agent: widget-agent 1.0.0)" in init.stdout
    project = (repo / "benchseal.toml").read_text()
    assert 'import_path = "widget_agent.agent:WidgetAgent"' in project
    assert (repo / ".github" / "workflows" / "benchseal.yml").is_file()

    # Mistakes first, each refused in one line before anything is built.
    line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right")
    assert "has no commit: commit the agent, tag that commit v1.0.0" in line, line
    _commit(repo, "the widget agent")
    line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right")
    assert "tag v1.0.0 does not exist in" in line and "git tag v1.0.0" in line, line
    (repo / "benchseal.toml").write_text(project.replace("widget_agent.agent:WidgetAgent", "widget_agent.agents:WidgetAgent"))
    _commit(repo, "a typo")
    _git(repo, "tag", "v1.0.0")
    line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right")
    assert "benchseal.toml: agent.import_path: module widget_agent.agents is not in the release's tree" in line, line
    (repo / "benchseal.toml").write_text(project)
    _commit(repo, "the typo fixed")
    line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right")
    assert "tag v1.0.0 names commit" in line and "git checkout v1.0.0" in line, line
    _git(repo, "tag", "-f", "v1.0.0")
    line = _refused_before_the_build(repo, home, "v1.0.0")  # no model key, no --scripted-model
    assert f"set {KEY_ENV}, or pass --scripted-model" in line, line
    shipped = REPO_ROOT / "policies" / "infra.yaml"  # an infra's own policy, taken as it is: it lists no widget
    line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right", "--policy", str(shipped))
    assert f"repository newcomer/widget (from git remote origin) is not a source of {shipped}" in line, line

    # The release: scored, published and verified, with nothing copied.
    dist = home / "dist"
    good = _benchseal(repo, home, "release", "v1.0.0", "--local", "--scripted-model", "right", "--dist", str(dist))
    assert good.returncode == 0, good.stderr[-3000:] + good.stdout[-3000:]
    assert "Releasing newcomer/widget v1.0.0 (repository name from git remote origin)" in good.stderr
    assert "added sources: newcomer/widget (from git remote origin)" in good.stderr
    assert ("added agents: widget-agent (python package widget-agent, from benchseal.toml's agent) for "
            "newcomer/widget, model-backed") in good.stderr
    assert "benchseal v1.0.0: SUCCEEDED" in good.stdout and "verified: benchseal verify ok" in good.stdout
    summary = json.loads((dist / "v1.0.0" / "summary.json").read_text())
    assert summary["score"] == 1.0 and summary["source"]["repository"] == "newcomer/widget", summary
    assert summary["agent"]["release"]["package"] == "widget-agent"
    # The policy the run was accepted, graded and sealed under is where the report says, as stated.
    written = home / "release" / "v1.0.0" / "infra-policy.yaml"
    assert f"policy  {written} (the local infra policy: " in good.stdout
    assert "newcomer/widget" in written.read_text()

    # A later tag that fails a task the previous one resolved: published, verified, gated, the reason on the terminal.
    (repo / "widget_agent" / "agent.py").write_text(AGENT.replace("SKIP = None", 'SKIP = "/app/stats.py"'))
    (repo / "pyproject.toml").write_text(PYPROJECT.format(version="1.1.0"))
    _commit(repo, "1.1.0: faster")
    _git(repo, "tag", "v1.1.0")
    worse = _benchseal(repo, home, "release", "v1.1.0", "--local", "--scripted-model", "right", "--dist", str(dist))
    assert worse.returncode == 1, worse.stderr[-3000:] + worse.stdout[-3000:]
    error = [line for line in worse.stderr.splitlines() if line.startswith(ERROR)]
    assert len(error) == 1 and error[0].startswith(f"{ERROR}release v1.1.0 is gated (published, not promoted): "), \
        worse.stderr[-2000:]
    assert "fix-mean" in error[0], error
    assert "GATED   " in worse.stdout and "trial   fix-mean unresolved" in worse.stdout, worse.stdout
    assert "verified: benchseal verify ok" in worse.stdout
    comparison = json.loads((dist / "v1.1.0" / "summary.json").read_text())["comparison"]
    assert comparison["gated"] is True and comparison["previous"]["tag"] == "v1.0.0"


def test_a_newcomer_releases_an_npm_agent_and_a_forgotten_publish_is_refused(home: Path, tmp_path: Path) -> None:
    """The npm path: ``init`` detects the package, a release before ``npm publish`` is refused in one line (never a
    wait), and once published the release is scored and verified; the repository is named from its directory."""
    repo = tmp_path / "widget-cli"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "package.json").write_text(json.dumps({"name": "@newcomer/widget-cli", "version": "1.0.0",
                                                   "bin": {"widget-cli": "cli.js"}, "license": "MIT"}))
    (repo / "cli.js").write_text(CLI)
    init = _benchseal(repo, home, "init", timeout=120)
    assert init.returncode == 0, init.stderr
    assert "wrote benchseal.toml (npm agent widget-cli: @newcomer/widget-cli 1.0.0)" in init.stdout
    assert "check [agent].args" in init.stdout  # what it could not know is listed, not guessed silently
    _commit(repo, "the widget CLI")
    _git(repo, "tag", "v1.0.0")

    with LocalNpmRegistry(tmp_path / "npm") as registry:
        registry_env = {"BENCHSEAL_NPM_REGISTRY": registry.url}
        line = _refused_before_the_build(repo, home, "v1.0.0", "--scripted-model", "right", env=registry_env)
        assert f"npm: @newcomer/widget-cli@1.0.0 is not published on {registry.url}" in line, line
        tarball, _ = npm_pack(repo, tmp_path / "packed")
        registry.publish(tarball)
        dist = home / "dist-npm"
        done = _benchseal(repo, home, "release", "v1.0.0", "--local", "--scripted-model", "right", "--dist", str(dist),
                          env=registry_env)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "Releasing local/widget-cli v1.0.0 (repository name from the directory's name)" in done.stderr
    assert ("added agents: widget-cli (npm package @newcomer/widget-cli, from benchseal.toml's agent) for "
            "local/widget-cli, model-backed") in done.stderr
    assert "benchseal v1.0.0: SUCCEEDED" in done.stdout and "verified: benchseal verify ok" in done.stdout
    summary = json.loads((dist / "v1.0.0" / "summary.json").read_text())
    assert summary["score"] == 1.0 and summary["source"]["repository"] == "local/widget-cli", summary
    assert summary["agent"]["release"]["kind"] == "npm"
