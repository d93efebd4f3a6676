"""Tool-call parsing and the toolbox: malformed calls, unknown tools, tools that raise or hang, and
calculator inputs a policy under RL pressure might try."""

from __future__ import annotations

import threading

import pytest

from feedbackrl.envs.tools import MAX_DIGITS, Toolbox, ToolCall, calculator, parse_tool_call


@pytest.mark.parametrize("turn, expected", [
    ("calc(12+30)", ToolCall("calc", "12+30")),
    ("  calc(1+2)\n", ToolCall("calc", "1+2")),
    ("calc()", ToolCall("calc", "")),
    ("calc((1+2)*3)", ToolCall("calc", "(1+2)*3")),
    ("py(print(1))", ToolCall("py", "print(1)")),
    ("42", None),
    ("", None),
    ("the answer is 42", None),
    ("Calc(1+2)", None),  # names are lower case: an upper-case word is prose, not a call
    ("(1+2)", None),
], ids=["plain", "whitespace", "empty-args", "nested-parens", "nested-call", "answer", "empty", "prose",
        "capitalised", "no-name"])
def test_parse_calls_and_answers(turn: str, expected: ToolCall | None) -> None:
    assert parse_tool_call(turn) == expected


@pytest.mark.parametrize("turn", ["calc(12+", "calc(1+2) 5", "calc(1+2)calc(3+4", "calc(\n"],
                         ids=["unclosed", "trailing-answer", "second-unclosed", "newline"])
def test_malformed_calls_are_errors_not_answers(turn: str) -> None:
    out = parse_tool_call(turn)
    assert isinstance(out, str) and out.startswith("malformed tool call"), out


@pytest.mark.parametrize("expr, value", [
    ("12+30", "42"), ("9999+9999", "19998"), ("7/2", "3"), ("7//2", "3"), ("-3*4", "-12"), ("2**10", "1024"),
    ("(1+2)*(3+4)", "21"), ("10%4", "2"), (" 1 + 1 ", "2"),
])
def test_calculator_values(expr: str, value: str) -> None:
    assert calculator(expr) == value


@pytest.mark.parametrize("expr", [
    "9**9**9", "10**100", "2**-1", "1/0", "5%0", "__import__('os')", "open('x')", "x", "(1).real", "1.5+1",
    "[1]*9", "lambda: 1", "'a'*9", "1+", "", "1" * 70, "9" * 40 + "*" + "9" * 40,
], ids=["power-tower", "huge-power", "negative-power", "div-zero", "mod-zero", "import", "call", "name",
        "attribute", "float", "list", "lambda", "string", "syntax", "empty", "long-literal", "long-product"])
def test_calculator_refuses(expr: str) -> None:
    with pytest.raises(ValueError):
        calculator(expr)


def test_calculator_digit_limit_is_exact() -> None:
    assert calculator("9" * MAX_DIGITS) == "9" * MAX_DIGITS
    with pytest.raises(ValueError, match="longer than"):
        calculator("9" * MAX_DIGITS + "+1")


def test_toolbox_turns_every_failure_into_an_observation() -> None:
    release = threading.Event()

    def hangs(_: str) -> str:
        release.wait(30)  # blocks until the test lets it go: the toolbox must not wait for it
        return "late"

    def raises(_: str) -> str:
        raise RuntimeError("boom")

    box = Toolbox({"calc": calculator, "hang": hangs, "bad": raises}, timeout_s=0.05)
    try:
        assert box.call(ToolCall("calc", "1+1")).content == "2"
        unknown = box.call(ToolCall("python", "1"))
        assert not unknown.ok and unknown.content == "error: unknown tool python; tools: bad, calc, hang"
        bad = box.call(ToolCall("bad", ""))
        assert not bad.ok and bad.content == "error: bad failed: RuntimeError: boom"
        hung = box.call(ToolCall("hang", ""))
        assert not hung.ok and hung.content == "error: hang timed out after 0.05s"
        refused = box.call(ToolCall("calc", "9**9**9"))
        assert not refused.ok and refused.content.startswith("error: calc failed: ValueError")
    finally:
        release.set()
    assert Toolbox({}).call(ToolCall("calc", "1")).content == "error: unknown tool calc; tools: none"
