"""Property: no reward source raises on arbitrary text, and every score lies in [0, 1]."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedbackrl.rewards.combine import Gate, ValueWeighted, WeightedSum
from feedbackrl.rewards.format import RegexFormat, TagFormat
from feedbackrl.rewards.instructions import ConstraintsVerifier
from feedbackrl.rewards.math import MathVerifier
from feedbackrl.rewards.verdict import Problem, RewardSource, Verdict

SPECS = [
    {"id": "length_words", "relation": "at least", "num": 5},
    {"id": "keyword_frequency", "keyword": "cat", "relation": "at most", "num": 2},
    {"id": "json_format"},
    {"id": "bullet_count", "num": 2},
    {"id": "postscript"},
    {"id": "two_responses"},
    {"id": "nth_paragraph_first_word", "num_paragraphs": 2, "nth": 2, "first_word": "then"},
    {"id": "highlighted_sections", "num": 1},
]

# Generous: on a loaded machine a 2 s alarm can land in a finalizer (an "unraisable" exception pytest flags).
MATH = MathVerifier(timeout_s=30.0)
SOURCES: dict[str, RewardSource] = {
    "math": MATH,
    "constraints": ConstraintsVerifier.from_specs(SPECS),
    "tags": TagFormat(),
    "regex": RegexFormat(r"Answer: .+", mode="search"),
    "gated-math": Gate(TagFormat(), MATH),
    "weighted": WeightedSum({"math": MATH, "tags": TagFormat()}, {"math": 3.0, "tags": 1.0}),
    "valued": ValueWeighted(MATH, alpha=2.0),
}
PROBLEM = Problem("What is 1/2 + 1/4?", r"\frac{3}{4}", {"value": 0.3})

# Pieces that reach the parsers' corners: LaTeX commands, braces, tags, separators, numbers.
PIECES = [r"\boxed{", "}", "{", "$", "$$", r"\frac{3}{4}", r"\sqrt", "^", "9^9^9", "0.75", "1,000", "-", "%",
          "The answer is ", "Answer: ", "<think>", "</think>", "<answer>", "</answer>", "******", "***",
          "P.S.", "* ", "\n", "\n\n", "cat ", "Then ", "[x]", '{"a": 1}', "(", "]", r"\{", r"\}", "x", "=",
          r"\infty", r"\text{", "\x00", "é", "，"]
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=5)), max_size=40).map("".join),
)


@pytest.mark.parametrize("name", list(SOURCES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=TEXT)
def test_never_raises_and_score_in_unit_interval(name: str, completion: str) -> None:
    verdict = SOURCES[name](PROBLEM, completion)
    assert isinstance(verdict, Verdict)
    assert 0.0 <= verdict.score <= 1.0
    assert isinstance(verdict.reason, str) and verdict.reason
    json.loads(verdict.to_json())
