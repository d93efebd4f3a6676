"""Math answers: pull the final answer out of a completion and check it against the gold answer.

Extraction is ours (a few ordered, named rules, so the verdict can say which one fired);
equivalence is `math-verify` (https://github.com/huggingface/Math-Verify), which parses LaTeX and
plain expressions to SymPy and compares numbers, fractions, percentages, intervals, sets and
expressions.

Where we depart from calling `math_verify.parse`/`verify` directly, and why:
- Time bound. math-verify's own timeouts use `signal.alarm`, which only works in the main thread
  and raises there otherwise. We switch them off and bound the whole check ourselves: on the main
  thread with an interval timer (restoring any timer the caller had set, e.g. pytest-timeout's);
  on any other thread by running the check in a child process that is killed when it overruns.
- Size guard. Answers like `9^9^9^9` or `(10^{100})!` are refused before SymPy tries to evaluate
  them, so a policy cannot spend the time budget on purpose (and C-level big-integer work, which
  no signal can interrupt, never starts).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from math_verify import parse, verify
from sympy import Basic, binomial, factorial, preorder_traversal

from feedbackrl.rewards.verdict import Problem, Verdict, fail

# --- extraction -----------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?", re.IGNORECASE)
_ANSWER_COLON = re.compile(r"answer\s*\**\s*:", re.IGNORECASE)
# Math delimiters; an escaped dollar (\$10) is matched first so that it is skipped.
_DELIMITER = re.compile(r"\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
# A signed number with optional thousands separators, decimals, a fraction bar or a percent sign.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*%)?")
# "1,000 dollars": keep the number, or math-verify reads "1, 000*d*o*l*l*a*r*s" as a set.
_NUMBER_THEN_WORDS = re.compile(rf"({_NUMBER.pattern})\s+[A-Za-z][A-Za-z\s]*")
# A bare answer is short and, outside LaTeX commands, has no word that reads like prose.
_MAX_BARE_CHARS = 100
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_PROSE = re.compile(r"[A-Za-z]{3,}|\b[A-Za-z]{2}\s")
# A period followed by whitespace ends a sentence; a decimal point never is.
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# a span that opens with a word of 3+ letters is prose ("calculated by ..."), not an answer; LaTeX commands
# (\frac) start with a backslash and units follow the number, so neither matches
_PROSE_START = re.compile(r"[A-Za-z]{3,}")


def _brace_pairs(text: str, begin: int) -> dict[int, int]:
    """Position of each `{` at or after `begin` -> position of its `}`, in one linear pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for match in re.finditer(r"[{}]", text[begin:]):
        if match.group() == "{":
            stack.append(begin + match.start())
        elif stack:
            pairs[stack.pop()] = begin + match.start()
    return pairs


def extract_boxed(text: str) -> str | None:
    """Content of the last closed `\\boxed{...}` (or `\\fbox{...}`), nested braces included."""
    opens = [match.end() - 1 for match in _BOXED.finditer(text)]
    pairs = _brace_pairs(text, opens[0]) if opens else {}
    for start in reversed(opens):
        inner = text[start + 1 : pairs[start]].strip() if start in pairs else ""
        if inner:
            return inner
    return None


def _clean_span(span: str) -> str | None:
    """First line and sentence of `span`, without math delimiters, bold marks or a final period."""
    span = span.strip().split("\n", 1)[0]
    boxed = extract_boxed(span)
    if boxed is not None:
        return boxed
    end = _SENTENCE_END.search(span)
    span = span[: end.start()] if end else span
    for wrapper in ("$$", "$", r"\(", r"\)", r"\[", r"\]", "**"):
        span = span.replace(wrapper, " ")
    span = span.strip().rstrip(".").strip()
    with_units = _NUMBER_THEN_WORDS.fullmatch(span)
    return (with_units.group(1).strip() if with_units else span) or None


def extract_answer_is(text: str) -> str | None:
    """What follows the last "answer is" (e.g. "the final answer is 42."), unless it opens with a word.

    "The answer is calculated by multiplying 3 by 4, which gives 12." states no answer after "is":
    the rule finds nothing and the next rule in the order (e.g. the last number) gets its turn.
    """
    matches = list(_ANSWER_IS.finditer(text))
    span = _clean_span(text[matches[-1].end() :]) if matches else None
    return None if span is None or _PROSE_START.match(span) else span


def extract_answer_colon(text: str) -> str | None:
    """What follows the last "Answer:" (also "**Answer:**")."""
    matches = list(_ANSWER_COLON.finditer(text))
    return _clean_span(text[matches[-1].end() :]) if matches else None


def extract_last_latex(text: str) -> str | None:
    """The last non-empty `$...$`, `$$...$$`, `\\(...\\)` or `\\[...\\]` span."""
    last, closer, start = None, None, 0
    # One pass over the delimiters: a regex per span type is quadratic on many unclosed ones.
    for match in _DELIMITER.finditer(text):
        token = match.group()
        if closer is None and token in _CLOSER:
            closer, start = _CLOSER[token], match.end()
        elif token == closer:
            last = text[start : match.start()].strip() or last
            closer = None
    return last


def extract_bare(text: str) -> str | None:
    """The whole completion when it is one short line of math rather than prose (`\\frac{1}{2}`)."""
    text = text.strip()
    if "\n" in text or len(text) > _MAX_BARE_CHARS or _PROSE.search(_LATEX_COMMAND.sub("", text)):
        return None
    return _clean_span(text)


def extract_last_number(text: str) -> str | None:
    """The last number in the text (GSM8K-style fallback)."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "answer_is": extract_answer_is,
    "answer_colon": extract_answer_colon,
    "last_latex": extract_last_latex,
    "bare": extract_bare,
    "last_number": extract_last_number,
}
DEFAULT_ORDER: tuple[str, ...] = ("boxed", "answer_is", "answer_colon", "last_latex", "bare", "last_number")


def extract_answer(text: str, order: tuple[str, ...] = DEFAULT_ORDER) -> tuple[str, str] | None:
    """(rule name, answer text) from the first rule in `order` that finds something, else None."""
    for name in order:
        answer = EXTRACTORS[name](text)
        if answer:
            return name, answer
    return None


# --- comparison -----------------------------------------------------------------------------------

# Largest exponent or factorial argument, and most digits of a power, we let SymPy evaluate:
# 9^100000 (95k digits) takes milliseconds; 9^9^9^9 or ((9^9)^99)^99... never finish.
_MAX_LITERAL = 100_000
_MAX_DIGITS = 100_000
_MAX_SHOWN_CHARS = 200


class CheckTimeout(BaseException):
    """Raised by our timer. A BaseException so math-verify's broad `except Exception` can't swallow it."""


@dataclass(frozen=True)
class Comparison:
    """What parsing and comparing one answer with the gold gave."""

    equal: bool
    status: str  # "ok", "timeout", "too_big", "unparsed_gold" or "error"
    gold_parsed: str = ""
    answer_parsed: str = ""
    error: str = ""


def _as_latex(text: str) -> str:
    """`text` as one inline-math span for math-verify; a bare `%` would start a LaTeX comment."""
    text = text.replace("$", " ").strip()
    return "$" + re.sub(r"(?<!\\)%", r"\\%", text) + "$"


def _magnitude(expr: Basic) -> float:
    """An upper bound on |expr| for numbers made of literals, +, * and ^; 0 for anything else."""
    try:
        if expr.is_Number:
            return abs(float(expr))
        if expr.is_Pow:
            return _magnitude(expr.base) ** _magnitude(expr.exp)
        if expr.is_Add:
            return sum(_magnitude(arg) for arg in expr.args)
        if expr.is_Mul:
            return math.prod(_magnitude(arg) for arg in expr.args)
    except (OverflowError, TypeError, ValueError):
        return math.inf
    return 0.0


def _digits(expr: Basic) -> float:
    """An upper bound on log10|expr|, computed without building the number; 0 for non-numbers."""
    if expr.is_Number:
        return math.log10(max(_magnitude(expr), 1.0))
    if expr.is_Pow:
        base = _digits(expr.base)
        return base * _magnitude(expr.exp) if base > 0 else 0.0  # 0 * inf would be nan
    if expr.is_Add:
        return max((_digits(arg) for arg in expr.args), default=0.0) + math.log10(len(expr.args))
    if expr.is_Mul:
        return sum(_digits(arg) for arg in expr.args)
    return 0.0


def too_big(expr: object) -> bool:
    """True if evaluating `expr` could build an astronomically large number (9^9^9^9, (10^100)!)."""
    if not isinstance(expr, Basic):
        return False
    for node in preorder_traversal(expr):
        if node.is_Pow and (_magnitude(node.exp) > _MAX_LITERAL or _digits(node) > _MAX_DIGITS):
            return True
        if isinstance(node, factorial | binomial) and any(_magnitude(a) > _MAX_LITERAL for a in node.args):
            return True
    return False


def _shown(parsed: list[Any]) -> str:
    return str(parsed[0])[:_MAX_SHOWN_CHARS] if parsed else ""


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list[Any]:
    # Gold answers repeat across the G samples of a prompt: parse each once.
    return parse(_as_latex(extract_boxed(gold) or gold), parsing_timeout=None)


def compare(gold: str, answer: str) -> Comparison:
    """Parse both with math-verify and compare. Unbounded: call through `bounded_compare`."""
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return Comparison(False, "unparsed_gold")
    answer_parsed = parse(_as_latex(answer), parsing_timeout=None)
    shown = (_shown(gold_parsed), _shown(answer_parsed))
    if any(too_big(expr) for expr in answer_parsed):
        return Comparison(False, "too_big", *shown)
    equal = verify(gold_parsed, answer_parsed, timeout_seconds=None)
    return Comparison(bool(equal), "ok", *shown)


@contextmanager
def _timer(seconds: float) -> Iterator[None]:
    """Raise CheckTimeout in the main thread after `seconds`, then restore the caller's timer."""

    armed = True

    def on_alarm(signum: int, frame: object) -> None:
        if armed:  # a re-fire while the first CheckTimeout unwinds must not escape our caller
            raise CheckTimeout(f"check took longer than {seconds}s")

    def on_unraisable(unraisable: Any) -> None:
        # An alarm that lands in a finalizer (a __del__ run by the garbage collector mid-check) cannot unwind the
        # check: Python reports it as "unraisable" and goes on. Drop those reports quietly (the re-fire stops the
        # check a moment later) instead of printing them, or formatting one while the next alarm lands
        if not isinstance(unraisable.exc_value, CheckTimeout):
            old_unraisable(unraisable)

    start = time.monotonic()
    old_unraisable, sys.unraisablehook = sys.unraisablehook, on_unraisable
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})  # a blocked SIGALRM would never stop us
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    # Re-fire every 50 ms after the first alarm: SymPy has bare `except:` clauses that can swallow
    # one CheckTimeout, and a one-shot timer would then never stop the check (seen in the suite).
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    if old_delay and old_delay < seconds:  # the caller's deadline comes first: keep it
        signal.setitimer(signal.ITIMER_REAL, old_delay)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        sys.unraisablehook = old_unraisable
        if old_delay:
            left = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _compare_on_main_thread(gold: str, answer: str, timeout_s: float) -> Comparison:
    try:
        with _timer(timeout_s):
            return compare(gold, answer)
    except CheckTimeout:
        return Comparison(False, "timeout")
    except Exception as e:  # noqa: BLE001 - a verifier must never raise on model output
        return Comparison(False, "error", error=f"{type(e).__name__}: {e}"[:_MAX_SHOWN_CHARS])


# Extra wall time a child gets beyond its own timer before we kill it: covers C code that a
# signal cannot interrupt. Starting a child (importing SymPy) has its own, longer allowance.
_CHILD_GRACE_S = 1.0
_CHILD_START_S = 60.0
_SRC_DIR = str(Path(__file__).resolve().parents[2])


class _ChildPool:
    """Child processes that run `compare` under their own main-thread timer.

    Used for checks started off the main thread, where no signal can reach us: the caller waits
    at most timeout + grace, then kills the child. Idle children are reused; one per concurrent
    caller is started on demand.
    """

    def __init__(self) -> None:
        self._idle: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC_DIR, os.environ.get("PYTHONPATH", "")])}
        code = "from feedbackrl.rewards.math import serve; serve()"
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env)
        if _read_line(child, _CHILD_START_S) != "ready":
            _kill(child)
            raise RuntimeError("math check child process did not start")
        return child

    def compare(self, gold: str, answer: str, timeout_s: float) -> Comparison:
        with self._lock:
            child = self._idle.pop() if self._idle else None
        try:
            child = child or self._start()
            assert child.stdin is not None
            child.stdin.write(json.dumps({"gold": gold, "answer": answer, "timeout_s": timeout_s}) + "\n")
            child.stdin.flush()
            line = _read_line(child, timeout_s + _CHILD_GRACE_S)
        except (OSError, RuntimeError, ValueError) as e:
            if child is not None:
                _kill(child)
            return Comparison(False, "error", error=f"{type(e).__name__}: {e}")
        if line is None:
            _kill(child)
            return Comparison(False, "timeout")
        try:
            result = Comparison(**json.loads(line))
        except (TypeError, ValueError):  # "" when the child died
            _kill(child)
            return Comparison(False, "error", error=f"math child exited or garbled its reply: {line!r:.80}")
        with self._lock:
            self._idle.append(child)
        return result

    def close(self) -> None:
        with self._lock:
            children, self._idle = self._idle, []
        for child in children:
            _kill(child)


def _read_line(child: subprocess.Popen[str], timeout_s: float) -> str | None:
    """One line from the child's stdout; None if none comes within `timeout_s`, "" if it exited."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout_s)
    return child.stdout.readline().strip() if ready else None


def _kill(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()


def serve() -> None:
    """Child side of `_ChildPool`: one JSON request per stdin line, one Comparison per stdout line."""
    replies, sys.stdout = sys.stdout, sys.stderr  # a stray print in SymPy must not garble a reply
    print("ready", file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        result = _compare_on_main_thread(request["gold"], request["answer"], request["timeout_s"])
        print(json.dumps(asdict(result)), file=replies, flush=True)


_CHILDREN = _ChildPool()


def bounded_compare(gold: str, answer: str, timeout_s: float) -> Comparison:
    """`compare` cut off after about `timeout_s` seconds, from any thread."""
    if threading.current_thread() is threading.main_thread():
        return _compare_on_main_thread(gold, answer, timeout_s)
    return _CHILDREN.compare(gold, answer, timeout_s)


# --- the reward source ----------------------------------------------------------------------------


class _DropDisabledTimeoutWarning(logging.Filter):
    # math-verify warns once that its timeouts are off; ours are on, so the warning misleads.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


_REASONS = {
    "timeout": "check timed out",
    "too_big": "answer is too large to evaluate",
    "unparsed_gold": "gold answer could not be parsed (task bug, not the completion's fault)",
    "error": "checker error",
}


@dataclass(frozen=True)
class MathVerifier:
    """Scores 1.0 when the extracted final answer is equivalent to `problem.answer`, else 0.

    order: extraction rules to try, first hit wins (names from `EXTRACTORS`).
    timeout_s: wall-clock bound on parsing and comparing one answer.
    max_answer_chars: longer extracted answers are refused unparsed.
    """

    order: tuple[str, ...] = DEFAULT_ORDER
    timeout_s: float = 3.0
    max_answer_chars: int = 500

    def __post_init__(self) -> None:
        unknown = [name for name in self.order if name not in EXTRACTORS]
        if unknown or not self.order:
            raise ValueError(f"MathVerifier.order has unknown rules {unknown}; allowed: {sorted(EXTRACTORS)}")
        if not self.timeout_s > 0:
            raise ValueError(f"MathVerifier.timeout_s must be > 0, got {self.timeout_s}")

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        if not isinstance(completion, str):
            return fail(f"completion is {type(completion).__name__}, not str")
        found = extract_answer(completion, self.order)
        if found is None:
            return fail(f"no final answer found (tried {', '.join(self.order)})", rule=None)
        rule, answer = found
        evidence: dict[str, Any] = {"rule": rule, "extracted": answer[: self.max_answer_chars],
                                    "gold": str(problem.answer)}
        if len(answer) > self.max_answer_chars:
            return fail(f"extracted answer has {len(answer)} chars (> {self.max_answer_chars})", **evidence)
        result = bounded_compare(str(problem.answer), answer, self.timeout_s)
        evidence.update(gold_parsed=result.gold_parsed, answer_parsed=result.answer_parsed)
        if result.status != "ok":
            reason = _REASONS.get(result.status, result.status)
            if result.status == "timeout":
                reason = f"{reason} after {self.timeout_s}s"
            reason = f"{reason}: {result.error}" if result.error else reason
            return fail(reason, status=result.status, **evidence)
        verb = "matches" if result.equal else "does not match"
        reason = f'answer "{answer}" ({rule}) {verb} gold "{problem.answer}"'
        return Verdict(float(result.equal), result.equal, reason, {"status": "ok", **evidence})
