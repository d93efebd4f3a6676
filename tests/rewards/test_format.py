"""Format rewards: think/answer tags and regex shapes, tricky accept and reject cases."""

from __future__ import annotations

import re
import time

import pytest

from feedbackrl.rewards.format import RegexFormat, TagFormat, extract_tagged
from feedbackrl.rewards.verdict import Problem

P = Problem("p", None)


def _params(rows: list[tuple]) -> list:
    """Table rows (id, *values) as pytest params with readable ids."""
    return [pytest.param(*row[1:], id=row[0]) for row in rows]

TAGS = [
    # id, completion, passes, first failing check (None when it passes)
    ("well-formed", "<think>add them</think><answer>4</answer>", True, None),
    ("whitespace-and-newlines", "\n<think>\nadd\n</think>\n\n<answer> 4 </answer>\n", True, None),
    ("multiline-answer", "<think>x</think><answer>line 1\nline 2</answer>", True, None),
    ("missing-think", "<answer>4</answer>", False, "one_of_each_tag"),
    ("text-before-think", "Sure! <think>x</think><answer>4</answer>", False, "starts_with_think"),
    ("answer-before-think", "<answer>4</answer><think>x</think>", False, "starts_with_think"),
    ("two-answers", "<think>x</think><answer>4</answer><answer>5</answer>", False, "one_of_each_tag"),
    ("nested-think", "<think>a<think>b</think></think><answer>4</answer>", False, "one_of_each_tag"),
    ("chatter-between", "<think>x</think> so: <answer>4</answer>", False, "nothing_between_blocks"),
    ("chatter-after", "<think>x</think><answer>4</answer> Hope this helps", False, "nothing_after_answer"),
    ("empty-reasoning", "<think> </think><answer>4</answer>", False, "reasoning_present"),
    ("empty-answer", "<think>x</think><answer>  </answer>", False, "answer_present"),
    ("unclosed-answer", "<think>x</think><answer>4", False, "one_of_each_tag"),
    ("empty", "", False, "one_of_each_tag"),
]


@pytest.mark.parametrize(("completion", "passes", "first_failure"), _params(TAGS))
def test_tag_format(completion: str, passes: bool, first_failure: str | None) -> None:
    verdict = TagFormat()(P, completion)
    assert (verdict.score, verdict.passed) == ((1.0, True) if passes else (0.0, False))
    if first_failure:
        assert verdict.reason == f"format check failed: {first_failure}"
    else:
        assert all(verdict.details["checks"].values())


def test_tag_format_answer_in_details() -> None:
    verdict = TagFormat()(P, "<think>2+2</think>\n<answer> 4 </answer>")
    assert verdict.details["answer"] == "4"


def test_prefilled_think_must_not_be_reopened() -> None:
    prefilled = TagFormat(think_prefilled=True)
    assert prefilled(P, "reasoning...</think><answer>4</answer>").passed
    assert not prefilled(P, "<think>reasoning</think><answer>4</answer>").passed
    assert TagFormat(require_reasoning=False)(P, "<think></think><answer>4</answer>").passed


def test_custom_tags() -> None:
    fmt = TagFormat(think_tag="reasoning", answer_tag="final")
    assert fmt(P, "<reasoning>r</reasoning><final>f</final>").passed
    assert not fmt(P, "<think>r</think><answer>f</answer>").passed


def test_tag_format_is_linear_on_many_tags() -> None:
    start = time.monotonic()
    assert not TagFormat()(P, "<think></think><answer>" * 50_000).passed
    assert time.monotonic() - start < 1.0


REGEX = [
    ("fullmatch-multiline", r"Step \d+:.*\nAnswer: \d+", "fullmatch", "Step 1: think\nmore\nAnswer: 7", True),
    ("fullmatch-rejects-suffix", r"Answer: \d+", "fullmatch", "Answer: 7 (sure)", False),
    ("search-finds-inside", r"Answer: \d+", "search", "blah\nAnswer: 7 (sure)", True),
    ("search-case-sensitive", r"Answer: \d+", "search", "answer: 7", False),
]


@pytest.mark.parametrize(("pattern", "mode", "completion", "passes"), _params(REGEX))
def test_regex_format(pattern: str, mode: str, completion: str, passes: bool) -> None:
    verdict = RegexFormat(pattern, mode=mode)(P, completion)  # type: ignore[arg-type]
    assert verdict.passed is passes
    assert verdict.details["pattern"] == pattern
    assert verdict.reason


def test_regex_match_is_evidence_and_flags_apply() -> None:
    verdict = RegexFormat(r"answer: (\d+)", mode="search", flags=re.IGNORECASE)(P, "so ANSWER: 12.")
    assert verdict.details["match"] == "ANSWER: 12"


def test_bad_regex_config_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"pattern '\(' does not compile"):
        RegexFormat("(")
    with pytest.raises(ValueError, match="mode must be"):
        RegexFormat("x", mode="match")  # type: ignore[arg-type]


def test_extract_tagged() -> None:
    assert extract_tagged("<answer>1</answer> <answer> 2 </answer>") == "2"
    assert extract_tagged("<answer>unclosed") is None
    assert extract_tagged("</answer><answer>") is None
    assert extract_tagged("<final>x</final>", tag="final") == "x"
