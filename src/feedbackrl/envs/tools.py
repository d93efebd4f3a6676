"""Tools an episode can call, the minimal tool-call format, and a toolbox that never crashes an episode.

A tool takes one string argument. Its `ToolSpec` is what a chat template shows the model (an OpenAI
function schema with that one string parameter); calls parsed from a chat-template turn carry their
arguments as a JSON object, which `Toolbox.call` checks against the spec (the parameter present, a
string, nothing else) before the tool runs.

Minimal tool-call format (the tiny model's 82 symbols have no braces or quotes): an assistant turn
that is exactly ``name(arguments)`` — a lower-case name, the argument text, a closing parenthesis
and nothing after it — calls tool `name` with the argument string. A turn that starts like a call
(``name(``) but does not close is a malformed call; any other turn is a final answer (or a move).

Every failure becomes an observation, never an exception: a malformed call, an unknown tool, a
tool that raises, a tool that runs past its time limit. The policy reads ``error: ...`` and the
episode goes on. Tools run in a shared thread pool; a call past its timeout is abandoned (its thread
finishes in the background), so a tool that can loop forever must bound itself (the calculator
refuses huge powers; a sandboxed tool kills its process).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

Tool = Callable[[str], str]  # argument text -> result text; raises on bad input

_CALL = re.compile(r"\s*([a-z_][a-z0-9_]*)\((.*)\)\s*", re.DOTALL)
_OPENS_CALL = re.compile(r"\s*[a-z_][a-z0-9_]*\(")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str | dict[str, Any]  # the argument text (minimal format) or a JSON object (chat templates)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a chat template describes it to the model: a name, what it does, its one string parameter."""

    name: str
    description: str
    parameter: str = "input"
    parameter_description: str = ""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema `apply_chat_template(..., tools=[...])` renders."""
        param = {"type": "string", **({"description": self.parameter_description} if self.parameter_description
                                      else {})}
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {self.parameter: param}, "required": [self.parameter]}}}


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the policy reads: the result, or "error: ..."
    ok: bool


def parse_tool_call(turn: str) -> ToolCall | str | None:
    """A `ToolCall`, an error message for a malformed call, or None for a turn that is not a call."""
    m = _CALL.fullmatch(turn)
    if m:
        return ToolCall(m.group(1), m.group(2))
    if _OPENS_CALL.match(turn):
        return "malformed tool call: write name(arguments) with a closing parenthesis and nothing after it"
    return None


class Toolbox:
    """Named tools behind one `call` that turns every failure into an error result."""

    def __init__(self, tools: Mapping[str, Tool], timeout_s: float = 5.0, pool: ThreadPoolExecutor | None = None,
                 specs: Sequence[ToolSpec] = ()):
        self.tools, self.timeout_s = dict(tools), timeout_s
        self.pool = pool or _shared_pool()
        self.specs = {s.name: s for s in specs}  # tools without a spec take one string parameter named "input"

    def call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"error: unknown tool {call.name}; tools: {', '.join(sorted(self.tools)) or 'none'}",
                              False)
        argument = call.arguments if isinstance(call.arguments, str) else self._argument(call.name, call.arguments)
        if isinstance(argument, ToolResult):
            return argument
        future = self.pool.submit(tool, argument)
        if not wait([future], timeout=self.timeout_s).done:
            future.cancel()
            return ToolResult(f"error: {call.name} timed out after {self.timeout_s:g}s", False)
        try:
            return ToolResult(str(future.result()), True)
        except Exception as e:  # noqa: BLE001 - any tool failure is an observation, not a crash
            return ToolResult(f"error: {call.name} failed: {type(e).__name__}: {str(e)[:80]}", False)

    def _argument(self, name: str, arguments: dict[str, Any]) -> str | ToolResult:
        """The one string argument of a JSON-object call, or an error result naming what is wrong."""
        spec = self.specs.get(name)
        param = spec.parameter if spec else "input"
        if not isinstance(arguments, dict):
            return ToolResult(f"error: {name} takes a JSON object of arguments, got {type(arguments).__name__}", False)
        extra = sorted(set(arguments) - {param})
        if extra:
            return ToolResult(f"error: {name} got unexpected argument(s) {extra}; it takes {param!r} only", False)
        if param not in arguments:
            return ToolResult(f"error: {name} needs the argument {param!r}", False)
        value = arguments[param]
        if not isinstance(value, str):
            return ToolResult(f"error: {name} argument {param!r} must be a string, got {type(value).__name__}", False)
        return value


_POOL: ThreadPoolExecutor | None = None


def _shared_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="feedbackrl-tool")
    return _POOL


# --- calculator --------------------------------------------------------------------------------

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow,
}
MAX_DIGITS = 64  # operands and results longer than this are refused (no 9**9**9 denial of service)


def calculator(expression: str) -> str:
    """Integer arithmetic: + - * // % ** and parentheses (``/`` means integer division). Raises ValueError
    on anything else (names, calls, attributes, floats, results over `MAX_DIGITS` digits)."""
    expr = expression.strip().replace("/", "//").replace("////", "//")
    if len(expr) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression[:40]}") from None
    return str(_eval(tree.body))


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (right < 0 or right * max(len(str(abs(left))), 1) > MAX_DIGITS + 1):
            raise ValueError("power too large")
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        return _bounded(_BINOPS[type(node.op)](left, right))
    raise ValueError(f"only integer arithmetic is allowed, not {type(node).__name__}")


def _bounded(v: int) -> int:
    if len(str(abs(v))) > MAX_DIGITS:
        raise ValueError(f"number longer than {MAX_DIGITS} digits")
    return v
