"""The small part of GitHub Actions the emulator simulates: ``on:`` triggers,
declared ``workflow_dispatch`` inputs and the ``run-name`` expression.

Only the expression forms workflows here use are understood: property paths
(``github.event.client_payload.a.b``, ``inputs.x``, ``github.event.inputs.x``),
string literals, ``format('...{0}...', args)`` and ``a || b``. Anything else
raises, so a workflow the emulator cannot render fails loudly, not silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

_EXPR_RE = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_TOKEN_RE = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>\|\||&&|[(),])|(?P<ident>[A-Za-z_][A-Za-z0-9_.\-]*))")


class ExpressionError(ValueError):
    pass


@dataclass(frozen=True)
class WorkflowSpec:
    """What the emulator reads from a workflow file."""

    path: str
    name: str
    run_name: str | None
    repository_dispatch_types: tuple[str, ...] | None  # None: not triggered; () : any type
    workflow_dispatch_inputs: Mapping[str, Mapping[str, Any]] | None  # None: not dispatchable
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: str, text: str) -> WorkflowSpec:
        doc = yaml.safe_load(text)
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: not a workflow mapping")
        # YAML 1.1 reads the key `on` as True.
        triggers = doc.get("on", doc.get(True))
        if isinstance(triggers, str):
            triggers = {triggers: None}
        elif isinstance(triggers, list):
            triggers = dict.fromkeys(triggers)
        elif not isinstance(triggers, dict):
            triggers = {}
        rd_types: tuple[str, ...] | None = None
        if "repository_dispatch" in triggers:
            cfg = triggers["repository_dispatch"] or {}
            rd_types = tuple(cfg.get("types") or ())
        wd_inputs: dict[str, Mapping[str, Any]] | None = None
        if "workflow_dispatch" in triggers:
            cfg = triggers["workflow_dispatch"] or {}
            wd_inputs = dict(cfg.get("inputs") or {})
        run_name = doc.get("run-name")
        return cls(
            path=path,
            name=str(doc.get("name") or path.rsplit("/", 1)[-1]),
            run_name=None if run_name is None else str(run_name),
            repository_dispatch_types=rd_types,
            workflow_dispatch_inputs=wd_inputs,
            raw=doc,
        )

    def accepts_repository_dispatch(self, event_type: str) -> bool:
        types = self.repository_dispatch_types
        return types is not None and (not types or event_type in types)


def render_run_name(template: str, context: Mapping[str, Any]) -> str:
    """Render ``run-name`` like Actions does: every ``${{ }}`` replaced by its string value."""
    return _EXPR_RE.sub(lambda m: _to_str(_Parser(m.group(1), context).parse()), template)


def _to_str(value: object) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict | list):
        import json

        return json.dumps(value)
    return str(value)


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any]) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            if not m or m.end() == pos:
                raise ExpressionError(f"cannot parse expression at {text[pos:]!r}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0
        self.context = context

    def parse(self) -> object:
        value = self._or()
        if self.i != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.i][1]!r}")
        return value

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.i += 1
        return token

    def _or(self) -> object:
        value = self._primary()
        while self._peek() == ("op", "||"):
            self._take()
            other = self._primary()
            value = value or other
        return value

    def _primary(self) -> object:
        kind, text = self._take()
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "ident":
            if self._peek() == ("op", "("):
                return self._call(text)
            if text in ("true", "false"):
                return text == "true"
            if text == "null":
                return None
            return self._lookup(text)
        if (kind, text) == ("op", "("):
            value = self._or()
            if self._take() != ("op", ")"):
                raise ExpressionError("expected ')'")
            return value
        raise ExpressionError(f"unexpected {text!r}")

    def _call(self, name: str) -> object:
        self._take()  # (
        args: list[object] = []
        if self._peek() != ("op", ")"):
            while True:
                args.append(self._or())
                if self._peek() == ("op", ","):
                    self._take()
                    continue
                break
        if self._take() != ("op", ")"):
            raise ExpressionError("expected ')'")
        if name == "format" and args and isinstance(args[0], str):
            fmt = args[0]
            return re.sub(r"\{(\d+)\}", lambda m: _to_str(args[int(m.group(1)) + 1]), fmt)
        raise ExpressionError(f"function {name}() is not supported by the emulator")

    def _lookup(self, path: str) -> object:
        node: object = self.context
        for part in path.split("."):
            if isinstance(node, Mapping):
                node = node.get(part)
            else:
                return None
        return node
