"""HelloAgent: a chat loop with one tool, ``run_shell_command``, over an OpenAI-compatible endpoint.

benchseal runs this class (its import path) in a container of its own, beside the task's. Each turn sends
the conversation to ``{api_base}/chat/completions``; each tool call runs in the task's container
(``environment.exec``) and its output goes back to the model, until the model answers with a
plain message or ``MAX_TURNS`` is reached. Only the standard library: the runner has no network
and installs nothing beside Harbor.

The agent holds no credential: it sends a placeholder key and the benchseal worker's relay puts
the real one on the way out. An error of the model endpoint raises, so Harbor records the trial as
an infrastructure error, not as the agent failing the task.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, override

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

DISTRIBUTION = "hello-agent"
PLACEHOLDER_KEY = "benchseal-placeholder-key"  # benchseal's pipeline.core.project.PLACEHOLDER_KEY
MAX_TURNS = 20
COMMAND_TIMEOUT_SEC = 120
MAX_OUTPUT_CHARS = 10_000
HTTP_TIMEOUT_SEC = 600

# api_base is the runner's own relay: never through an HTTP(S)_PROXY of the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

SYSTEM_PROMPT = (
    "You solve tasks in a Linux container. Use the run_shell_command tool to inspect files and run "
    "commands; each call is a fresh bash shell. When the task is done, answer with a short summary."
)

RUN_SHELL_COMMAND: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_shell_command",
        "description": "Run a bash command in the task's container; returns its output and exit code.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "description": {"type": "string", "description": "One line: what the command is for."},
                "is_background": {
                    "type": "boolean",
                    "description": "Start it in the background (a server, a watcher) and return at once.",
                },
            },
            "required": ["command"],
        },
    },
}


class HelloAgent(BaseAgent):  # type: ignore[misc]  # Harbor ships no type information (no py.typed)
    """Harbor constructs it with the AgentConfig's ``model_name`` and ``kwargs`` (``api_base``)."""

    def __init__(self, logs_dir: Path, model_name: str | None = None, api_base: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        if not api_base or not model_name:
            raise ValueError("hello-agent needs model_name and the AgentConfig kwarg api_base (the model endpoint)")
        self._url = api_base.rstrip("/") + "/chat/completions"
        # The runner names models the LiteLLM way (openai/<name> for an OpenAI-compatible endpoint);
        # the endpoint itself knows the model as <name>.
        self._model = model_name.removeprefix("openai/")

    @staticmethod
    @override
    def name() -> str:
        return DISTRIBUTION

    @override
    def version(self) -> str | None:
        # The installed distribution's version: the release's, as the wheel built from the tag carries it.
        # Run from a source checkout (not installed) it has none: Harbor then records "unknown".
        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:
            return None

    @override
    async def setup(self, environment: BaseEnvironment) -> None:
        pass  # nothing to install in the container: the loop runs here, commands run there

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": instruction},
        ]
        context.n_input_tokens = context.n_output_tokens = context.n_cache_tokens = 0
        for _ in range(MAX_TURNS):
            response = await asyncio.to_thread(self._complete, messages)
            _add_usage(context, response.get("usage") or {})
            message = response["choices"][0]["message"]
            messages.append(message)
            tool_calls = message.get("tool_calls") or []
            if not tool_calls:  # a plain answer (finish_reason "stop"): the agent is done
                return
            for call in tool_calls:
                output = await self._call_tool(call["function"], environment)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        self.logger.info("hello-agent: stopped after %d turns", MAX_TURNS)

    def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One chat completion (not streamed); an endpoint error raises."""
        body = {"model": self._model, "messages": messages, "tools": [RUN_SHELL_COMMAND], "stream": False}
        request = urllib.request.Request(  # noqa: S310 -- api_base is the runner's own relay
            self._url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {PLACEHOLDER_KEY}"},
        )
        try:
            with _NO_PROXY.open(request, timeout=HTTP_TIMEOUT_SEC) as answer:
                result: dict[str, Any] = json.load(answer)
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode("utf-8", "replace")
            raise RuntimeError(f"model endpoint answered HTTP {exc.code}: {detail}") from None
        return result

    async def _call_tool(self, function: dict[str, Any], environment: BaseEnvironment) -> str:
        """Run one ``run_shell_command`` call; what goes wrong in it is told to the model, not raised."""
        if function.get("name") != "run_shell_command":
            return f"error: unknown tool {function.get('name')!r}; the only tool is run_shell_command"
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            command = arguments["command"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return "error: the arguments must be JSON with a string 'command'"
        if not isinstance(command, str):
            return "error: 'command' must be a string"
        if arguments.get("is_background"):
            await environment.exec(f"nohup bash -c {shlex.quote(command)} >/dev/null 2>&1 &", timeout_sec=30)
            return "started in the background"
        # `timeout` in the container ends a command that runs too long (exit code 124, told to the model);
        # exec's own limit, a little later, is only a backstop.
        result = await environment.exec(f"timeout -k 5 {COMMAND_TIMEOUT_SEC} bash -c {shlex.quote(command)}",
                                        timeout_sec=COMMAND_TIMEOUT_SEC + 30)
        output = _truncate((result.stdout or "") + (result.stderr or ""))
        return f"{output}\n[exit code {result.return_code}]"


def _add_usage(context: AgentContext, usage: dict[str, Any]) -> None:
    """Add one response's token usage to Harbor's context (input tokens include cached ones)."""
    context.n_input_tokens += usage.get("prompt_tokens") or 0
    context.n_output_tokens += usage.get("completion_tokens") or 0
    context.n_cache_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _truncate(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    half = MAX_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - MAX_OUTPUT_CHARS} characters cut ...]\n{text[-half:]}"
