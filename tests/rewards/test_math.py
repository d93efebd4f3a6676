"""Math verifier: extraction rules, tricky accept/reject tables, malformed output, time bounds."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from feedbackrl.cli_verify import verify_app
from feedbackrl.rewards.math import (
    DEFAULT_ORDER,
    EXTRACTORS,
    CheckTimeout,
    MathVerifier,
    _ChildPool,
    _timer,
    bounded_compare,
    extract_answer,
)
from feedbackrl.rewards.verdict import Problem

VERIFY = MathVerifier(timeout_s=30.0)  # generous: a loaded CI machine must not turn "ok" into "timeout"


def _params(rows: list[tuple]) -> list:
    """Table rows (id, *values) as pytest params with readable ids."""
    return [pytest.param(*row[1:], id=row[0]) for row in rows]

EXTRACTION = [
    # id, completion, rule that fires, extracted text
    ("boxed-nested-braces", r"so \boxed{\frac{1}{\sqrt{2}}} done", "boxed", r"\frac{1}{\sqrt{2}}"),
    ("boxed-last-wins", r"\boxed{1} no wait \boxed{2}", "boxed", "2"),
    ("boxed-unclosed-falls-back", r"\boxed{3} then \boxed{4", "boxed", "3"),
    ("boxed-set-braces", r"\boxed{\{1, 2\}}", "boxed", r"\{1, 2\}"),
    ("fbox", r"\fbox{7}", "boxed", "7"),
    ("answer-is-sentence", "So the final answer is 3.5. Let me double check 99.", "answer_is", "3.5"),
    ("answer-is-latex", r"The answer is $\frac{2}{3}$.", "answer_is", r"\frac{2}{3}"),
    ("answer-is-boxed-inside", r"The answer is \boxed{12}.", "boxed", "12"),
    # prose after "answer is" states no answer: the next rule gets its turn
    ("answer-is-prose-falls-through", "The answer is calculated by multiplying 3 by 4, which gives 12.", "last_number",
     "12"),
    ("answer-is-prose-then-colon", "The answer is found below.\nAnswer: 7", "answer_colon", "7"),
    ("answer-is-after-prose-one", "The answer is easy to get. So the answer is 19.", "answer_is", "19"),
    ("answer-colon-bold", "Work...\n**Answer:** 42\n", "answer_colon", "42"),
    ("answer-colon-units", "Answer: 1,000 dollars", "answer_colon", "1,000"),
    ("last-latex", r"we get $x=1$ and finally \(x = 2\) ok", "last_latex", "x = 2"),
    ("escaped-dollar-skipped", r"it costs \$5 and $7$", "last_latex", "7"),
    ("bare-latex", r"\dfrac{3}{4}", "bare", r"\dfrac{3}{4}"),
    ("last-number-thousands", "She has 3 bags, so 1,234,567 beans", "last_number", "1,234,567"),
    ("last-number-negative-decimal", "temperature drops to -12.5 today", "last_number", "-12.5"),
    ("last-number-percent", "the rate is 40 % now", "last_number", "40 %"),
]


@pytest.mark.parametrize(("text", "rule", "answer"), _params(EXTRACTION))
def test_extraction(text: str, rule: str, answer: str) -> None:
    assert extract_answer(text) == (rule, answer)


def test_extraction_order_is_configurable() -> None:
    text = r"I think 5, so \boxed{6}"
    assert extract_answer(text, ("last_number", "boxed")) == ("last_number", "6")
    assert extract_answer("I think 5", ("boxed",)) is None
    assert MathVerifier(order=("last_number",))(Problem("p", "5"), r"\boxed{6} or 5").score == 1.0


ACCEPT = [
    # id, gold, completion
    ("fraction-vs-decimal", r"\frac{1}{2}", r"\boxed{0.5}"),
    ("dfrac-vs-decimal", r"\dfrac{3}{4}", "The answer is 0.75."),
    ("slash-fraction-vs-frac", "1/2", r"\boxed{\frac12}"),
    ("percent-vs-fraction", "50%", r"\boxed{\frac{1}{2}}"),
    ("thousands-separators", "1234567", "Answer: 1,234,567"),
    ("latex-thousands", "1000000", r"\boxed{1{,}000{,}000}"),
    ("negative", "-3", r"\boxed{-3.0}"),
    ("sqrt-rationalised", r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}}"),
    ("interval", "(1, 2]", r"\boxed{(1,2]}"),
    ("set-order-free", r"\{1, 2\}", r"\boxed{\{2, 1\}}"),
    ("expanded-polynomial", "x^2+2x+1", r"\boxed{(x+1)^2}"),
    ("assignment-rhs", "3", r"\boxed{x = 3}"),
    ("text-units", "5", r"\boxed{5\text{ cm}}"),
    ("dollar-sign", "10", r"The answer is \$10."),
    ("gold-in-boxed", r"\boxed{7}", "so 7"),
    ("pi-symbolic", r"\frac{\pi}{2}", r"\boxed{\pi/2}"),
    ("integer-gold-object", 12, r"\boxed{12}"),
]


@pytest.mark.parametrize(("gold", "completion"), _params(ACCEPT))
def test_accepts_equivalent_answers(gold: str, completion: str) -> None:
    verdict = VERIFY(Problem("p", gold), completion)
    assert (verdict.score, verdict.passed) == (1.0, True), verdict.to_json()


REJECT = [
    ("sign-flip", "-3", r"\boxed{3}"),
    ("close-decimal", "2", r"\boxed{2.001}"),
    ("rounded-third", r"\frac{1}{3}", r"\boxed{0.33}"),
    ("interval-endpoint-closed", "(1, 2]", r"\boxed{[1, 2]}"),
    ("set-extra-element", r"\{1, 2\}", r"\boxed{\{1, 2, 3\}}"),
    ("wrong-factorisation", "x^2+2x+1", r"\boxed{(x-1)^2}"),
    ("earlier-right-later-wrong", "5", r"maybe \boxed{5}? no: \boxed{6}"),
    ("answer-is-wins-over-last-number", "4", "The answer is 7. (4 was a typo)"),
    ("tuple-vs-interval", "(1, 2)", r"\boxed{(2, 1)}"),
]


@pytest.mark.parametrize(("gold", "completion"), _params(REJECT))
def test_rejects_wrong_answers(gold: str, completion: str) -> None:
    verdict = VERIFY(Problem("p", gold), completion)
    assert (verdict.score, verdict.passed) == (0.0, False), verdict.to_json()
    assert verdict.details["status"] == "ok"


GOLDS = ["42", "-7", "0.125", r"\frac{5}{8}", r"2\sqrt{3}", "(0, 1]", r"\{1, 3\}", "x^2 - 1", "1,000", "25%"]


@pytest.mark.parametrize("gold", GOLDS)
def test_gold_scores_one(gold: str) -> None:
    assert VERIFY(Problem("p", gold), gold).score == 1.0
    assert VERIFY(Problem("p", gold), rf"Reasoning... \boxed{{{gold}}}").score == 1.0


MALFORMED = [
    ("empty", ""),
    ("whitespace", "  \n\t "),
    ("prose-no-answer", "I am not sure how to solve this."),
    ("unclosed-boxed", r"\boxed{"),
    ("empty-boxed", r"\boxed{}"),
    ("stray-braces", "}}}{{{"),
    ("nul-bytes", "\x00\x00"),
    ("unbalanced-latex", r"\boxed{\frac{1}{}"),
    ("very-long-answer", "Answer: " + "1+" * 5000 + "1"),
]


@pytest.mark.parametrize("completion", _params(MALFORMED))
def test_malformed_scores_zero_with_reason(completion: str) -> None:
    verdict = VERIFY(Problem("p", "1"), completion)
    assert (verdict.score, verdict.passed) == (0.0, False)
    assert verdict.reason


def test_details_carry_the_evidence() -> None:
    verdict = VERIFY(Problem("p", "1/2"), r"Thus \boxed{\frac{2}{4}}.")
    assert verdict.details == {"status": "ok", "rule": "boxed", "extracted": r"\frac{2}{4}", "gold": "1/2",
                               "gold_parsed": "1/2", "answer_parsed": "1/2"}
    missing = VERIFY(Problem("p", "1/2"), "no idea")
    assert missing.reason.startswith("no final answer found")


def test_bad_config_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown rules \\['boxd'\\].*allowed"):
        MathVerifier(order=("boxd",))
    with pytest.raises(ValueError, match="timeout_s"):
        MathVerifier(timeout_s=0)
    assert set(DEFAULT_ORDER) == set(EXTRACTORS)


HUGE = [
    ("right-assoc-tower", r"\boxed{9^{9^{9^{9}}}}"),
    ("plain-tower", "Answer: 9^9^9^9"),
    ("left-assoc-tower", "Answer: 9^9^99^9^99^9^9"),
    ("huge-exponent", r"\boxed{9^{387420489}}"),
    ("huge-factorial", r"\boxed{(10^{100})!}"),
]


def _in_worker_thread(verifier: MathVerifier, problem: Problem, completion: str):  # noqa: ANN202
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(verifier, problem, completion).result()


@pytest.mark.parametrize("completion", _params(HUGE))
@pytest.mark.parametrize("where", ["main-thread", "worker-thread"])
def test_huge_numbers_cannot_hang(completion: str, where: str) -> None:
    verifier = MathVerifier(timeout_s=1.0)
    start = time.monotonic()
    if where == "main-thread":
        verdict = verifier(Problem("p", "1"), completion)
    else:
        verdict = _in_worker_thread(verifier, Problem("p", "1"), completion)
    # 1 s timer + 1 s grace + a cold child process start (imports SymPy) on the worker path
    assert time.monotonic() - start < 20.0  # bounded, not hung; generous for a loaded machine
    assert verdict.score == 0.0


@pytest.mark.parametrize("where", ["main-thread", "worker-thread"])
def test_slow_check_times_out_with_reason(where: str) -> None:
    # Small enough to pass the size guard, far too slow to evaluate: sum of k^k up to 99999.
    slow = r"\boxed{\sum_{k=1}^{99999} k^{k}}"
    verifier = MathVerifier(timeout_s=0.3)
    if where == "main-thread":
        verdict = verifier(Problem("p", "1"), slow)
    else:
        _in_worker_thread(verifier, Problem("p", "1"), "warm up the child: 1")
        verdict = _in_worker_thread(verifier, Problem("p", "1"), slow)
    assert verdict.details["status"] == "timeout"
    assert verdict.reason == "check timed out after 0.3s"


def test_worker_thread_agrees_with_main_thread() -> None:
    cases = [(c[1], c[2]) for c in ACCEPT[:5] + REJECT[:5]]
    main = [VERIFY(Problem("p", g), c).to_dict() for g, c in cases]
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda gc: VERIFY(Problem("p", gc[0]), gc[1]).to_dict(), cases))
    assert threaded == main


def test_timer_restores_the_callers_timer() -> None:
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert bounded_compare("1", "1", timeout_s=2.0).equal
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
        assert signal.getsignal(signal.SIGALRM) is handler
        # A caller deadline shorter than ours wins: the check stops then, the caller's alarm still fires.
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert bounded_compare("1", r"\sum_{k=1}^{99999} k^{k}", timeout_s=5.0).status == "timeout"
        time.sleep(0.05)
        assert seen == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_timer_raises_only_inside_its_block() -> None:
    with pytest.raises(CheckTimeout), _timer(0.05):
        time.sleep(1.0)
    time.sleep(0.1)  # nothing left armed


def test_an_alarm_in_a_finalizer_is_not_reported(monkeypatch) -> None:
    # an alarm that lands in a __del__ (a check's garbage being collected) cannot unwind the check: Python hands
    # it to sys.unraisablehook and goes on. During a check those reports must not reach the process's hook
    # (pytest turns them into failures, and formatting one while the re-fire lands raised again); any other
    # unraisable error still does, and the caller's hook is back after the check
    import sys
    from types import SimpleNamespace

    reported: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    other = SimpleNamespace(exc_value=ValueError("a finalizer's own bug"))
    with _timer(5.0):
        sys.unraisablehook(SimpleNamespace(exc_value=CheckTimeout("check took longer than 5.0s")))
        sys.unraisablehook(other)
    assert reported == [other]
    assert sys.unraisablehook == reported.append
    with pytest.raises(CheckTimeout), _timer(0.05):
        time.sleep(1.0)
    assert sys.unraisablehook == reported.append  # restored after a timeout too


def test_dead_child_gives_an_error_verdict_then_is_replaced() -> None:
    pool = _ChildPool()
    try:
        assert pool.compare("1", "1", timeout_s=2.0).equal
        dead = pool._idle[0]
        dead.kill()
        dead.wait()
        assert pool.compare("1", "1", timeout_s=2.0).status == "error"
        assert pool.compare("1", "1", timeout_s=2.0).equal
    finally:
        pool.close()


def test_cli_prints_one_json_verdict() -> None:
    result = CliRunner().invoke(verify_app, ["math", "--response", r"so \boxed{0.5}", "--answer", r"\frac12"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert (verdict["score"], verdict["details"]["rule"]) == (1.0, "boxed")
    assert result.stdout.count("\n") == 1


def test_answer_is_prose_without_a_number_fails_with_a_reason() -> None:
    v = MathVerifier()(Problem("p", "12"), "The answer is not given.")
    assert (v.score, v.passed) == (0.0, False)
    assert v.reason.startswith("no final answer found")
