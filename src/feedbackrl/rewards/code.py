"""Code execution reward: run the completion's Python program against the problem's tests.

`problem.answer` holds the tests, as a dict or its JSON text, in one or both styles:

    {"io": [{"input": "1 2\\n", "output": "3\\n"}, ...],       # stdin -> expected stdout
     "asserts": ["assert add(1, 2) == 3", ...]}                 # appended to the program

Score = fraction of tests passed. An io test passes when the program exits 0 and its stdout
equals the expected output, comparing line by line with trailing whitespace (and trailing blank
lines) ignored. An assert test passes when every check in it holds: `assert a == b` (and each
`==` conjunct of an `and`) is checked on the host, from the values the program computed, so the
expected side never reaches the program; other asserts are judged in the sandbox. Each test's
entry in `Verdict.details["tests"]` says whether it passed and why not: "ok", "wrong_output",
"runtime_error", "timeout", "memory", "crash", "early_exit" or "output_limit".

Programs run in the sandbox of `sandbox.py` (its docstring has the threat model); it refuses to
start, with `SandboxUnavailable`, where the isolation is missing, unless `allow_unsafe=True`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.rewards.sandbox import Limits, probe, require_isolation, run_program
from feedbackrl.rewards.verdict import Problem, Verdict, fail

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)\b[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_STDERR_CHARS = 500  # per test in the details; the sandbox keeps 2000 bytes per attempt
_NOT_LITERAL = object()
_EXC_REASONS = {"MemoryError": "memory", "SystemExit": "early_exit", "Unencodable": "wrong_output"}


class BadTests(ValueError):
    """`problem.answer` is not a valid test spec (the problem's fault, not the completion's)."""


@dataclass
class TestPlan:
    """Parsed tests: what the sandbox runs and, kept on the host, what it is compared with."""

    io: list[tuple[str, str]] = field(default_factory=list)  # (stdin, expected stdout)
    asserts: list[str] = field(default_factory=list)  # source, for the details
    checks: list[list[dict]] = field(default_factory=list)  # per assert, sent to the sandbox
    expected: list[list[tuple[str, list[Any]]]] = field(default_factory=list)  # per check: (op, literals)


def extract_program(completion: str) -> str:
    """The last ```python fenced block (an unclosed one runs to the end), else the whole text."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def normalize_output(text: str) -> str:
    """Trailing whitespace stripped from every line, trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


def parse_tests(answer: Any) -> TestPlan:
    """Validate `problem.answer` and plan the checks; raises BadTests naming what is wrong."""
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError as exc:
            raise BadTests(f"tests are a string but not JSON: {exc}") from exc
    if not isinstance(answer, dict) or not answer or set(answer) - {"io", "asserts"}:
        keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        raise BadTests(f"tests must be a dict with keys 'io' and/or 'asserts', got {keys}")
    plan = TestPlan()
    for i, case in enumerate(_as_list(answer.get("io", []), "io")):
        if not (isinstance(case, dict) and isinstance(case.get("input", ""), str)
                and isinstance(case.get("output"), str)):
            raise BadTests(f"io[{i}] must be {{'input': str, 'output': str}}, got {case!r:.100}")
        plan.io.append((case.get("input", ""), case["output"]))
    for i, src in enumerate(_as_list(answer.get("asserts", []), "asserts")):
        if not isinstance(src, str):
            raise BadTests(f"asserts[{i}] must be a string, got {type(src).__name__}")
        checks, expected = _plan_assert(src, i)
        plan.asserts.append(src)
        plan.checks.append(checks)
        plan.expected.append(expected)
    if not plan.io and not plan.asserts:
        raise BadTests("tests are empty: give at least one 'io' case or 'asserts' entry")
    return plan


def _as_list(value: Any, key: str) -> list:
    if not isinstance(value, list):
        raise BadTests(f"tests[{key!r}] must be a list, got {type(value).__name__}")
    return value


def _plan_assert(src: str, index: int) -> tuple[list[dict], list[tuple[str, list[Any]]]]:
    """Split one assert into checks: `a == b` conjuncts compared on the host, the rest in the sandbox."""
    try:
        body = ast.parse(src).body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL byte
        raise BadTests(f"asserts[{index}] is not valid Python: {exc} ({src!r:.100})") from exc
    if not (len(body) == 1 and isinstance(body[0], ast.Assert)):
        return [{"stmt": src}], [("stmt", [])]  # setup code or a helper call: must not raise
    checks, expected = [], []
    for node in _conjuncts(body[0].test):
        op = _comparison(node)
        if op is None:
            checks.append({"truth": ast.unparse(node)})
            expected.append(("truth", []))
            continue
        sides = [node.left, node.comparators[0]]
        literals = [_literal(side) for side in sides]
        checks.append({"eq": [None if lit is not _NOT_LITERAL else ast.unparse(side)
                              for side, lit in zip(sides, literals, strict=True)]})
        expected.append((op, literals))
    return checks, expected


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [part for value in node.values for part in _conjuncts(value)]
    return [node]


def _comparison(node: ast.expr) -> str | None:
    """'==' or 'is' when the host can check `node` from values alone, else None."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    if isinstance(node.ops[0], ast.Eq):
        return "=="
    singletons = [_literal(side) for side in (node.left, node.comparators[0])]
    if isinstance(node.ops[0], ast.Is) and any(v is None or isinstance(v, bool) for v in singletons):
        return "is"
    return None


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def decode_value(text: str) -> Any:
    """Rebuild a value from `sandbox_harness.encode`'s tagged JSON (untrusted input, never executed)."""
    return _untag(json.loads(text))


def _untag(x: Any) -> Any:
    if not isinstance(x, list):
        return x
    tag, items = x[0], x[1:]
    scalars = {"s": lambda h: bytes.fromhex(h).decode("utf-8", "surrogatepass"), "b": bytes.fromhex,
               "x": lambda h: int(h, 16), "c": lambda re_, im: complex(re_, im)}
    if tag in scalars:
        return scalars[tag](*items)
    values = [_untag(item) for item in items]
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset,
                  "d": lambda v: dict(zip(v[::2], v[1::2], strict=True))}
    return containers[tag](values)


class CodeVerifier:
    """Reward source: run the completion's program against `problem.answer`'s tests, sandboxed.

    `timeout_s` is wall-clock time per test, `memory_mb` the address-space limit, and
    `max_output_bytes` caps stdout + stderr per test. Raises SandboxUnavailable at construction
    if this machine cannot isolate programs, unless `allow_unsafe=True`; calls never raise.
    """

    def __init__(self, timeout_s: float = 2.0, memory_mb: int = 512, max_output_bytes: int = 1_000_000,
                 allow_unsafe: bool = False) -> None:
        for name, value, low in (("timeout_s", timeout_s, 0.05), ("memory_mb", memory_mb, 64),
                                 ("max_output_bytes", max_output_bytes, 1)):
            if not (isinstance(value, int | float) and value >= low):
                raise ValueError(f"CodeVerifier {name} must be a number >= {low}, got {value!r}")
        if not allow_unsafe:
            require_isolation()
        self.limits = Limits(float(timeout_s), int(memory_mb), int(max_output_bytes))
        self.isolate = all(probe().values())  # with allow_unsafe, still isolate when we can

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        try:
            return self._verify(problem, completion)
        except Exception as exc:  # a reward source never raises: one bad sample must not stop training
            return fail(f"verifier error: {type(exc).__name__}: {exc}")

    def batch(self, problems: Sequence[Problem], completions: Sequence[str],
              workers: int = 4) -> list[Verdict]:
        """Verdicts for pairs (problems[n], completions[n]), `workers` sandboxes at a time."""
        if len(problems) != len(completions):
            raise ValueError(f"batch needs one completion per problem, got {len(problems)} problems "
                             f"and {len(completions)} completions")
        if workers < 1:
            raise ValueError(f"batch workers must be >= 1, got {workers}")
        with ThreadPoolExecutor(max_workers=workers) as pool:  # threads only wait on subprocesses
            return list(pool.map(self, problems, completions))

    def _verify(self, problem: Problem, completion: str) -> Verdict:
        if not isinstance(completion, str):
            return fail(f"completion must be a string, got {type(completion).__name__}")
        try:
            plan = parse_tests(problem.answer)
        except BadTests as exc:
            return fail(f"bad tests: {exc}")
        program = extract_program(completion)
        if not program.strip():
            return fail("no program in the completion", total=len(plan.io) + len(plan.asserts))
        entries, leaked = [], 0
        if plan.io:
            raw = run_program(program, inputs=[stdin for stdin, _ in plan.io], limits=self.limits,
                              isolate=self.isolate)
            entries += _io_entries(raw, plan)
            leaked += raw["leaked"]
        if plan.asserts:
            raw = run_program(program, checks=plan.checks, limits=self.limits, isolate=self.isolate)
            entries += _assert_entries(raw, plan)
            leaked += raw["leaked"]
        return _summarize(entries, leaked)


def _io_entries(raw: dict, plan: TestPlan) -> list[dict]:
    results = raw.get("tests") or [{"outcome": "crash", "stderr": raw.get("error", "")}] * len(plan.io)
    entries = []
    for i, ((_, expected), res) in enumerate(zip(plan.io, results, strict=True)):
        reason = res["outcome"]
        if reason == "done":
            reason = "ok" if normalize_output(res["stdout"]) == normalize_output(expected) else "wrong_output"
        entry = _entry(f"io[{i}]", reason, res.get("stderr", ""))
        if reason == "wrong_output":
            entry["stdout"] = res["stdout"][:200]
        entries.append(entry)
    return entries


def _assert_entries(raw: dict, plan: TestPlan) -> list[dict]:
    results = raw.get("tests") or [{"outcome": "crash", "stderr": raw.get("error", ""), "msgs": []}] * len(
        plan.asserts)
    entries = []
    for i, res in enumerate(results):
        reason, detail = res["outcome"], ""
        if reason == "done":
            try:
                reason, detail = _judge_checks(res["msgs"], plan.expected[i])
            except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
                reason, detail = "crash", f"malformed report from the sandbox: {type(exc).__name__}"
        entry = _entry(f"asserts[{i}]", reason, res.get("stderr", ""))
        if detail:
            entry["detail"] = detail
        entries.append(entry)
    return entries


def _judge_checks(msgs: list[str], expected: list[tuple[str, list[Any]]]) -> tuple[str, str]:
    """Decide one finished assert test from the runner's reports (the first report of each kind wins)."""
    values: dict[tuple[int, int], str] = {}
    truths: dict[int, bool] = {}
    errors: dict[int, str] = {}
    for msg in msgs:
        kind, _, rest = msg.partition(" ")
        parts = rest.split(" ", 3)  # i j [k value] | i j 0/1 | i j ExcName
        if kind == "V":
            values.setdefault((int(parts[1]), int(parts[2])), parts[3])
        elif kind == "T":
            truths.setdefault(int(parts[1]), parts[2] == "1")
        elif kind == "F":
            errors.setdefault(int(parts[1]), parts[2])
    for j, (op, literals) in enumerate(expected):
        if j in errors:
            return _EXC_REASONS.get(errors[j], "runtime_error"), f"check {j} raised {errors[j]}"
        if op in ("truth", "stmt"):
            if j not in truths:
                return "crash", f"check {j} was never reported"
            if not truths[j]:
                return "wrong_output", f"check {j} is false"
            continue
        if any(lit is _NOT_LITERAL and (j, k) not in values for k, lit in enumerate(literals)):
            return "crash", f"check {j} was never reported"
        a, b = (decode_value(values[j, k]) if lit is _NOT_LITERAL else lit for k, lit in enumerate(literals))
        if not _holds(op, a, b):
            return "wrong_output", f"check {j}: {a!r:.80} {op} {b!r:.80} is false"
    return "ok", ""


def _holds(op: str, a: Any, b: Any) -> bool:
    try:  # both sides are plain builtin values here: no program code runs on the host
        return bool(a == b) if op == "==" else a is b
    except RecursionError:
        return False


def _entry(name: str, reason: str, stderr: str) -> dict:
    entry: dict[str, Any] = {"test": name, "passed": reason == "ok", "reason": reason}
    if stderr and reason != "ok":
        entry["stderr"] = stderr[-_STDERR_CHARS:]
    return entry


def _summarize(entries: list[dict], leaked: int) -> Verdict:
    passed = sum(e["passed"] for e in entries)
    first = next((e for e in entries if not e["passed"]), None)
    reason = f"passed {passed}/{len(entries)} tests"
    if first is not None:
        reason += f"; first failure {first['test']}: {first['reason']}"
    details: dict[str, Any] = {"tests": entries, "passed": passed, "total": len(entries),
                               "stderr_tail": first.get("stderr", "") if first else ""}
    if leaked:
        details["leaked_processes"] = leaked  # the sandbox should never leave any; killed on sight
    return Verdict(score=passed / len(entries), passed=first is None, reason=reason, details=details)
