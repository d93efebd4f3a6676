"""Composition: weighted sums, gates and RLEV value weighting, checked against hand-computed values."""

from __future__ import annotations

import pytest

from feedbackrl.rewards.combine import Gate, ValueWeighted, WeightedSum
from feedbackrl.rewards.format import TagFormat
from feedbackrl.rewards.math import MathVerifier
from feedbackrl.rewards.verdict import Problem, Verdict


def fixed(score: float) -> object:
    """A reward source that always says `score` (passes when score == 1)."""

    def source(problem: Problem, completion: str) -> Verdict:
        return Verdict(score, score == 1.0, f"fixed {score}", {"seen": completion})

    return source


P = Problem("p", "4")


def test_weighted_sum_hand_computed() -> None:
    reward = WeightedSum({"a": fixed(1.0), "b": fixed(0.5), "c": fixed(0.0)}, {"a": 2.0, "b": 1.0, "c": 1.0})
    verdict = reward(P, "x")
    # weights normalise to 0.5, 0.25, 0.25: 0.5*1 + 0.25*0.5 + 0.25*0 = 0.625
    assert verdict.score == 0.625
    assert not verdict.passed
    assert verdict.details["weights"] == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert verdict.details["parts"]["b"] == {"score": 0.5, "passed": False, "reason": "fixed 0.5",
                                             "details": {"seen": "x"}}
    assert verdict.reason == "0.625 = 0.50*1.00 (a) + 0.25*0.50 (b) + 0.25*0.00 (c); failed: ['b', 'c']"


def test_weighted_sum_rounding_stays_in_unit_interval() -> None:
    # Normalised 0.7, 0.2, 0.1 sum to 1.0000000000000002 in floats; all-ones must not land above 1.
    reward = WeightedSum({"a": fixed(1.0), "b": fixed(1.0), "c": fixed(1.0)}, {"a": 0.7, "b": 0.2, "c": 0.1})
    verdict = reward(P, "x")
    assert 0.999999 < verdict.score <= 1.0
    assert verdict.passed


def test_zero_weight_part_still_reports_evidence() -> None:
    verdict = WeightedSum({"main": fixed(1.0), "watch": fixed(0.0)}, {"main": 1.0, "watch": 0.0})(P, "x")
    assert verdict.score == 1.0
    assert verdict.details["parts"]["watch"]["score"] == 0.0


@pytest.mark.parametrize(("parts", "weights", "message"), [
    pytest.param({"a": fixed(1)}, {"b": 1.0}, "one weight per part", id="names-differ"),
    pytest.param({}, {}, "one weight per part", id="empty"),
    pytest.param({"a": fixed(1)}, {"a": -1.0}, "must be >= 0", id="negative"),
    pytest.param({"a": fixed(1)}, {"a": 0.0}, "not all zero", id="all-zero"),
    pytest.param({"a": fixed(1)}, {"a": float("inf")}, "must be >= 0", id="infinite"),
])
def test_weighted_sum_bad_weights(parts: dict, weights: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightedSum(parts, weights)


def test_gate_closed_scores_zero_and_skips_the_reward() -> None:
    calls: list[str] = []

    def correctness(problem: Problem, completion: str) -> Verdict:
        calls.append(completion)
        return Verdict(1.0, True, "right")

    verdict = Gate(fixed(0.0), correctness)(P, "x")
    assert (verdict.score, verdict.passed, calls) == (0.0, False, [])
    assert verdict.reason == "gate 'format' failed: fixed 0.0"
    assert list(verdict.details["parts"]) == ["format"]


def test_gate_open_passes_the_reward_through() -> None:
    verdict = Gate(fixed(1.0), fixed(0.5), reward_name="constraints")(P, "x")
    assert (verdict.score, verdict.passed) == (0.5, False)
    assert set(verdict.details["parts"]) == {"format", "constraints"}


def test_format_gate_before_math_end_to_end() -> None:
    reward = Gate(TagFormat(), MathVerifier())
    good = reward(P, r"<think>2+2</think><answer>\boxed{4}</answer>")
    assert (good.score, good.details["parts"]["correctness"]["details"]["rule"]) == (1.0, "boxed")
    right_but_unformatted = reward(P, r"\boxed{4}")
    assert right_but_unformatted.score == 0.0
    format_reason = right_but_unformatted.details["parts"]["format"]["reason"]
    assert format_reason == "format check failed: one_of_each_tag"


def test_gate_names_must_differ() -> None:
    with pytest.raises(ValueError, match="must differ"):
        Gate(fixed(1.0), fixed(1.0), gate_name="x", reward_name="x")


@pytest.mark.parametrize(("inner", "meta", "alpha", "expected"), [
    # s = 1 + min(alpha * v, 1); score = inner * s / 2
    pytest.param(1.0, {"value": 0.0}, 1.0, 0.5, id="zero-value-correct"),
    pytest.param(1.0, {"value": 0.4}, 1.0, 0.7, id="value-0.4"),
    pytest.param(1.0, {"value": 0.4}, 10.0, 1.0, id="alpha-saturates-at-2x"),
    pytest.param(0.0, {"value": 1.0}, 1.0, 0.0, id="wrong-is-zero"),
    pytest.param(0.5, {"value": 0.5}, 1.0, 0.375, id="partial-credit"),
])
def test_value_weighted_hand_computed(inner: float, meta: dict, alpha: float, expected: float) -> None:
    verdict = ValueWeighted(fixed(inner), alpha=alpha)(Problem("p", None, meta), "x")
    assert verdict.score == pytest.approx(expected, abs=1e-12)
    assert verdict.details["value"] == meta["value"]
    assert verdict.details["parts"]["correctness"]["score"] == inner


def test_value_from_points_over_total() -> None:
    # a 6-point question on a 150-point exam: v = 0.04, alpha 5 -> s = 1.2 -> 1 * 1.2 / 2 = 0.6
    reward = ValueWeighted(fixed(1.0), alpha=5.0, value_key="points", total_key="exam_total")
    verdict = reward(Problem("p", None, {"points": 6, "exam_total": 150}), "x")
    assert verdict.score == pytest.approx(0.6)
    assert verdict.details["scale"] == pytest.approx(1.2)


@pytest.mark.parametrize(("meta", "message"), [
    pytest.param({}, r"no 'value' \(keys: \[\]\)", id="missing"),
    pytest.param({"value": 1.5}, r"must be in \[0, 1\], got 1.5", id="above-one"),
    pytest.param({"value": "high"}, "must be a number", id="not-a-number"),
    pytest.param({"value": True}, "must be a number", id="bool"),
])
def test_value_weighted_bad_meta_is_an_error(meta: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ValueWeighted(fixed(1.0))(Problem("p", None, meta), "x")


def test_value_weighted_default_value() -> None:
    verdict = ValueWeighted(fixed(1.0), default_value=0.0)(Problem("p", None), "x")
    assert verdict.score == 0.5


def test_learned_reward_model_plugs_in_and_nests() -> None:
    def reward_model(problem: Problem, completion: str) -> Verdict:
        return Verdict(0.8, True, "rm says 0.8", {"logit": 1.386})

    reward = Gate(fixed(1.0), WeightedSum({"rule": fixed(0.5), "rm": reward_model}, {"rule": 1, "rm": 3}))
    verdict = reward(P, "x")
    # 0.25*0.5 + 0.75*0.8 = 0.725
    assert verdict.score == pytest.approx(0.725)
    inner = verdict.details["parts"]["correctness"]["details"]["parts"]
    assert inner["rm"]["details"] == {"logit": 1.386}


def test_part_returning_a_number_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="reward part 'rm' returned float, expected a Verdict"):
        WeightedSum({"rm": lambda p, c: 0.5}, {"rm": 1.0})(P, "x")
