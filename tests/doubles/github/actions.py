"""The small part of GitHub Actions the emulator simulates: ``on:`` triggers,
declared ``workflow_dispatch`` inputs, and the expression language (``run-name``
here; every ``${{ }}`` of a workflow in the tests' Actions harness,
tests/workflows/harness.py).

Only the expression forms the project's workflows use are understood: property
paths (``github.event.client_payload.a.b``, ``needs.job.outputs.x``), string,
number, boolean and null literals, ``( )``, ``!``, ``==``, ``!=``, ``<``,
``<=``, ``>``, ``>=``, ``&&``, ``||`` and the functions ``format``, ``toJSON``,
``fromJSON``, ``contains``, ``startsWith``, ``endsWith``, ``join`` (the status
functions ``success()``, ``failure()``, ``always()``, ``cancelled()`` come from
the caller, who knows the job's state). Anything else (index syntax ``a['b']``,
``.*`` filters, unknown functions) raises :class:`ExpressionError`, so a
workflow the tests cannot evaluate fails loudly, not silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

_EXPR_RE = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_TOKEN_RE = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>\|\||&&|==|!=|<=|>=|[(),!<>])"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z_][A-Za-z0-9_\-]*)*))")


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


Resolver = Callable[[str], object]
Functions = Mapping[str, Callable[..., object]]


def render_run_name(template: str, context: Mapping[str, Any]) -> str:
    """Render ``run-name`` like Actions does: every ``${{ }}`` replaced by its string value."""
    return interpolate(template, context)


def interpolate(template: str, context: Mapping[str, Any], *, functions: Functions | None = None,
                resolve: Resolver | None = None) -> str:
    """Every ``${{ expr }}`` of ``template`` replaced by the string form of its value."""
    return _EXPR_RE.sub(lambda m: to_str(evaluate(m.group(1), context, functions=functions, resolve=resolve)),
                        template)


def evaluate(expression: str, context: Mapping[str, Any], *, functions: Functions | None = None,
             resolve: Resolver | None = None) -> object:
    """The value of one expression (without ``${{ }}``). ``resolve`` replaces the plain
    context lookup of property paths (the harness uses it to check references);
    ``functions`` adds functions such as the status checks."""
    return _Parser(expression, context, functions or {}, resolve).parse()


def evaluate_condition(condition: object, context: Mapping[str, Any], *, functions: Functions | None = None,
                       resolve: Resolver | None = None) -> bool:
    """An ``if:`` value: with or without ``${{ }}``; truthiness as Actions defines it."""
    if isinstance(condition, bool):
        return condition
    text = str(condition).strip()
    whole = _EXPR_RE.fullmatch(text)
    if whole:
        text = whole.group(1)
    elif "${{" in text:
        raise ExpressionError(f"an if: condition mixes text and ${{{{ }}}}: {text!r}")
    return truthy(evaluate(text, context, functions=functions, resolve=resolve))


def truthy(value: object) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0 and value == value  # NaN is falsy
    if isinstance(value, str):
        return value != ""
    return True


def to_str(value: object) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2)
    return str(value)


_to_str = to_str  # the name the emulator used


def _to_number(value: object) -> float:
    if value is None or value is False:
        return 0.0
    if value is True:
        return 1.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return 0.0
        try:
            return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
        except ValueError:
            return float("nan")
    return float("nan")


def _equal(a: object, b: object) -> bool:
    # Actions: strings compare case-insensitively; other type pairs are compared as numbers;
    # objects and arrays are equal only when they are the same instance.
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return a is b
    if a is None and b is None:
        return True
    return _to_number(a) == _to_number(b)


def _compare(op: str, a: object, b: object) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        x: Any = a.casefold()
        y: Any = b.casefold()
    else:
        x, y = _to_number(a), _to_number(b)
    if op == "<":
        return bool(x < y)
    if op == "<=":
        return bool(x <= y)
    if op == ">":
        return bool(x > y)
    return bool(x >= y)


def _contains(search: object, item: object) -> bool:
    if isinstance(search, list):
        return any(_equal(element, item) for element in search)
    return to_str(item).casefold() in to_str(search).casefold()


_BUILTINS: dict[str, Callable[..., object]] = {
    "toJSON": lambda value: json.dumps(value, indent=2),
    "fromJSON": lambda text: json.loads(to_str(text)),
    "contains": _contains,
    "startsWith": lambda s, v: to_str(s).casefold().startswith(to_str(v).casefold()),
    "endsWith": lambda s, v: to_str(s).casefold().endswith(to_str(v).casefold()),
    "join": lambda values, sep=",": to_str(sep).join(to_str(v) for v in values)
    if isinstance(values, list) else to_str(values),
}


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any], functions: Functions | None = None,
                 resolve: Resolver | None = None) -> None:
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
        self.text = text
        self.context = context
        self.functions = functions or {}
        self.resolve = resolve

    def parse(self) -> object:
        if not self.tokens:
            raise ExpressionError("empty expression")
        value = self._or()
        if self.i != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.i][1]!r} in {self.text!r}")
        return value

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise ExpressionError(f"unexpected end of expression {self.text!r}")
        self.i += 1
        return token

    # Precedence, lowest first: ||, &&, == !=, < <= > >=, !. Both sides are always
    # evaluated (no side effects here), the result is an operand, as in Actions.
    def _or(self) -> object:
        value = self._and()
        while self._peek() == ("op", "||"):
            self._take()
            other = self._and()
            value = value if truthy(value) else other
        return value

    def _and(self) -> object:
        value = self._equality()
        while self._peek() == ("op", "&&"):
            self._take()
            other = self._equality()
            value = other if truthy(value) else value
        return value

    def _equality(self) -> object:
        value = self._comparison()
        while self._peek() in (("op", "=="), ("op", "!=")):
            _, op = self._take()
            other = self._comparison()
            value = _equal(value, other) if op == "==" else not _equal(value, other)
        return value

    def _comparison(self) -> object:
        value = self._unary()
        while self._peek() in (("op", "<"), ("op", "<="), ("op", ">"), ("op", ">=")):
            _, op = self._take()
            value = _compare(op, value, self._unary())
        return value

    def _unary(self) -> object:
        if self._peek() == ("op", "!"):
            self._take()
            return not truthy(self._unary())
        return self._primary()

    def _primary(self) -> object:
        kind, text = self._take()
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            number = float(text)
            return int(number) if number.is_integer() and "." not in text else number
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
                raise ExpressionError(f"expected ')' in {self.text!r}")
            return value
        raise ExpressionError(f"unexpected {text!r} in {self.text!r}")

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
            raise ExpressionError(f"expected ')' in {self.text!r}")
        if name == "format":
            if not args or not isinstance(args[0], str):
                raise ExpressionError("format() needs a format string first")
            fmt = args[0]

            def arg(m: re.Match[str]) -> str:
                index = int(m.group(1)) + 1
                if index >= len(args):
                    raise ExpressionError(f"format() has no argument {{{index - 1}}}: {fmt!r}")
                return to_str(args[index])

            return re.sub(r"\{(\d+)\}", arg, fmt).replace("{{", "{").replace("}}", "}")
        function = self.functions.get(name) or _BUILTINS.get(name)
        if function is None:
            raise ExpressionError(f"function {name}() is not supported")
        try:
            return function(*args)
        except TypeError as exc:
            raise ExpressionError(f"{name}(): {exc}") from exc

    def _lookup(self, path: str) -> object:
        if self.resolve is not None:
            return self.resolve(path)
        node: object = self.context
        for part in path.split("."):
            if isinstance(node, Mapping):
                node = node.get(part)
            else:
                return None
        return node
