"""The emulator's Actions expression evaluator (tests/doubles/github/actions.py): the forms
the workflows use, evaluated as Actions does, and everything else refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.doubles.github.actions import ExpressionError, evaluate, evaluate_condition, interpolate

CTX: dict[str, Any] = {
    "github": {"event_name": "repository_dispatch", "ref_name": "v1.2.3",
               "event": {"client_payload": {"correlation_id": "c-1", "n": 3, "list": ["a", "B"]}}},
    "inputs": {"payload": "", "tag": "v9"},
    "needs": {"dispatch_infra": {"result": "failure", "outputs": {"run_url": ""}}},
}


@pytest.mark.parametrize(("expression", "expected"), [
    ("github.ref_name", "v1.2.3"),
    ("github.event.client_payload.missing.deeper", None),
    ("needs.dispatch_infra.result == 'success'", False),
    ("needs.dispatch_infra.result != 'success'", True),
    ("github.event_name == 'REPOSITORY_DISPATCH'", True),          # strings compare case-insensitively
    ("inputs.payload || 'fallback'", "fallback"),                   # || gives an operand, not a bool
    ("inputs.tag && 'yes'", "yes"),
    ("inputs.payload && 'yes'", ""),
    ("github.event_name == 'repository_dispatch' && toJSON(github.event.client_payload.n) || inputs.payload", "3"),
    ("!inputs.payload", True),
    ("!(1 == 1) || 2 > 1 && 'x'", "x"),                              # && binds tighter than ||
    ("3 == '3'", True),                                             # numbers and strings compare as numbers
    ("null == false", True),                                       # both coerce to 0
    ("'' == 0", True),
    ("github.event.client_payload.n >= 3", True),
    ("contains(github.event.client_payload.list, 'b')", True),
    ("contains('Hello', 'ell')", True),
    ("startsWith(github.ref_name, 'V1')", True),
    ("endsWith(github.ref_name, '.4')", False),
    ("join(github.event.client_payload.list, '+')", "a+B"),
    ("fromJSON('{\"a\": [1, 2]}')", {"a": [1, 2]}),
    ("format('{0}-{1} {{literal}}', 'a', 2)", "a-2 {literal}"),
    ("'it''s'", "it's"),
])
def test_expressions_evaluate_as_in_actions(expression: str, expected: object) -> None:
    assert evaluate(expression, CTX) == expected


def test_interpolation_and_conditions() -> None:
    assert interpolate("Benchmark ${{ inputs.tag }} ${{ github.event.client_payload.correlation_id }}", CTX) == \
        "Benchmark v9 c-1"
    assert interpolate("${{ github.event.client_payload.n }}", CTX) == "3"
    assert evaluate_condition("${{ needs.dispatch_infra.result == 'failure' }}", CTX) is True
    assert evaluate_condition("needs.dispatch_infra.result == 'success'", CTX) is False
    assert evaluate_condition(True, CTX) is True
    assert evaluate_condition("always()", CTX, functions={"always": lambda: True}) is True


@pytest.mark.parametrize(("expression", "message"), [
    ("hashFiles('x')", "not supported"),
    ("always()", "not supported"),                  # status functions only when the caller gives them
    ("github.event['x']", "cannot parse"),
    ("github.*.name", "cannot parse"),
    ("'unterminated", "cannot parse"),
    ("", "empty expression"),
    ("format('{0} {1}', 'a')", "no argument"),
    ("format(1)", "format string"),
    ("inputs.tag ==", "unexpected end"),
    ("(inputs.tag", "expected"),
    ("inputs.tag inputs.payload", "unexpected"),
    ("contains()", "contains"),
])
def test_what_it_cannot_evaluate_raises(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        evaluate(expression, CTX)


def test_a_condition_mixing_text_and_an_expression_is_refused() -> None:
    with pytest.raises(ExpressionError, match="mixes text"):
        evaluate_condition("x ${{ true }}", CTX)


def test_resolve_sees_every_property_path() -> None:
    seen: list[str] = []

    def resolve(path: str) -> object:
        seen.append(path)
        return "v"

    assert interpolate("${{ format('{0}/{1}', steps.a.outputs.b, needs.x.outputs.y) }}", {}, resolve=resolve) == "v/v"
    assert seen == ["steps.a.outputs.b", "needs.x.outputs.y"]
