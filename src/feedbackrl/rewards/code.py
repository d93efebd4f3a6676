"""Code execution reward: run the completion's Python program against the problem's tests.

`problem.answer` holds the tests, as a dict or its JSON text, in one or both styles:

    {"io": [{"input": "1 2\\n", "output": "3\\n"}, ...],       # stdin -> expected stdout
     "asserts": ["assert add(1, 2) == 3", ...]}                 # appended to the program

Score = fraction of tests passed. An io test passes when the program exits 0 and its stdout
equals the expected output, comparing line by line with trailing whitespace (and trailing blank
lines) ignored. An assert test is any block of Python: one `assert`, setup lines and asserts, a
loop over cases, or HumanEval's `def check(candidate): ...` with a call `check(entry_point)`. It
passes when it runs to the end. The judge runs it outside the program's process, with clean
builtins and modules, calling into the program for values (see `sandbox_checks`), so every
comparison is made on plain data and the test's literals never reach the program. A test the
judge cannot decide (it passes the program something that is not plain data, a function say)
fails as "undecidable"; `sandbox_checks=True` runs such tests inside the sandbox instead, where
the program's patched modules are the test's too (weaker), and their entry says
`"decided": "sandbox"`. Each test's entry in `Verdict.details["tests"]` says whether
it passed and why not: "ok", "wrong_output", "runtime_error", "timeout", "memory", "crash",
"early_exit", "output_limit" or "undecidable".

Programs run in the sandbox of `sandbox.py` (its docstring has the threat model); it refuses to
start, with `SandboxUnavailable`, where the isolation is missing, unless `allow_unsafe=True`.
"""

from __future__ import annotations

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
_REASONS = {"ok", "wrong_output", "runtime_error", "timeout", "memory", "crash", "early_exit", "output_limit",
            "undecidable"}


class BadTests(ValueError):
    """`problem.answer` is not a valid test spec (the problem's fault, not the completion's)."""


@dataclass
class TestPlan:
    """Parsed tests: stdin and expected stdout stay on the host; test sources go to the judge."""

    io: list[tuple[str, str]] = field(default_factory=list)  # (stdin, expected stdout)
    asserts: list[str] = field(default_factory=list)  # test sources, run by the judge


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
        try:
            compile(src, f"asserts[{i}]", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL byte
            raise BadTests(f"asserts[{i}] is not valid Python: {exc} ({src!r:.100})") from exc
        plan.asserts.append(src)
    if not plan.io and not plan.asserts:
        raise BadTests("tests are empty: give at least one 'io' case or 'asserts' entry")
    return plan


def _as_list(value: Any, key: str) -> list:
    if not isinstance(value, list):
        raise BadTests(f"tests[{key!r}] must be a list, got {type(value).__name__}")
    return value


class CodeVerifier:
    """Reward source: run the completion's program against `problem.answer`'s tests, sandboxed.

    `timeout_s` is wall-clock time per test, `memory_mb` the address-space limit, and
    `max_output_bytes` caps stdout + stderr per test. Tests the judge cannot decide outside the
    program's process fail as "undecidable"; `sandbox_checks=True` runs them inside it instead.
    Raises SandboxUnavailable at construction if this machine cannot isolate programs, unless
    `allow_unsafe=True`; calls never raise.
    """

    def __init__(self, timeout_s: float = 2.0, memory_mb: int = 512, max_output_bytes: int = 1_000_000,
                 allow_unsafe: bool = False, sandbox_checks: bool = False) -> None:
        for name, value, low in (("timeout_s", timeout_s, 0.05), ("memory_mb", memory_mb, 64),
                                 ("max_output_bytes", max_output_bytes, 1)):
            if not (isinstance(value, int | float) and value >= low):
                raise ValueError(f"CodeVerifier {name} must be a number >= {low}, got {value!r}")
        if not allow_unsafe:
            require_isolation()
        self.limits = Limits(float(timeout_s), int(memory_mb), int(max_output_bytes))
        self.isolate = all(probe().values())  # with allow_unsafe, still isolate when we can
        self.sandbox_checks = bool(sandbox_checks)

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
            raw = run_program(program, tests=plan.asserts, limits=self.limits, isolate=self.isolate,
                              sandbox_checks=self.sandbox_checks)
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
    results = raw.get("tests") or [{"outcome": "crash", "stderr": raw.get("error", "")}] * len(plan.asserts)
    entries = []
    for i, res in enumerate(results):
        reason = res["outcome"] if res["outcome"] in _REASONS else "crash"
        entry = _entry(f"asserts[{i}]", reason, res.get("stderr", ""))
        if res.get("detail") and reason != "ok":
            entry["detail"] = str(res["detail"])[:300]
        if "decided" in res:
            entry["decided"] = res["decided"]
        entries.append(entry)
    return entries


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
