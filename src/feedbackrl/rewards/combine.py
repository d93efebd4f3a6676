"""Composing reward sources: weighted sums, gates and value weighting.

Each composite is itself a `RewardSource`, so they nest (a gate in front of a weighted sum, a
learned reward model as one part of a sum: any callable returning a `Verdict` plugs in). A
composite's verdict keeps every part's evidence under `details["parts"][name]`, and its score
stays in [0, 1]: weights are normalised and value scales divided by their maximum.

Parts that raise are not caught here: a source must already turn bad completions into a zero
verdict, so an exception is a bug or a bad task (an unknown constraint id) and should be loud.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feedbackrl.rewards.verdict import Problem, RewardSource, Verdict


def _judge(name: str, source: RewardSource, problem: Problem, completion: str) -> Verdict:
    verdict = source(problem, completion)
    if not isinstance(verdict, Verdict):
        raise TypeError(f"reward part {name!r} returned {type(verdict).__name__}, expected a Verdict")
    return verdict


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def _unit(score: float) -> float:
    # Sums of normalised weights can land a rounding error above 1 (0.7, 0.2, 0.1 sum to 1 + 2e-16).
    return min(max(score, 0.0), 1.0)


@dataclass(frozen=True)
class WeightedSum:
    """score = sum_i w_i * score_i / sum_i w_i; passes when every part passes.

    parts: name -> reward source (rule-based, a learned reward model, another composite).
    weights: name -> weight >= 0, same names as `parts`, not all zero.
    """

    parts: Mapping[str, RewardSource]
    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if set(self.parts) != set(self.weights) or not self.parts:
            raise ValueError(f"WeightedSum needs one weight per part: parts {sorted(self.parts)}, "
                             f"weights {sorted(self.weights)}")
        bad = {k: w for k, w in self.weights.items() if not (_is_number(w) and 0 <= w < math.inf)}
        if bad or sum(self.weights.values()) <= 0:
            raise ValueError(f"WeightedSum weights must be >= 0 and not all zero, got {dict(self.weights)}")

    def normalised_weights(self) -> dict[str, float]:
        total = sum(self.weights.values())
        return {name: w / total for name, w in self.weights.items()}

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        weights = self.normalised_weights()
        verdicts = {name: _judge(name, src, problem, completion) for name, src in self.parts.items()}
        score = _unit(sum(weights[name] * v.score for name, v in verdicts.items()))
        terms = " + ".join(f"{weights[n]:.2f}*{v.score:.2f} ({n})" for n, v in verdicts.items())
        failed = [name for name, v in verdicts.items() if not v.passed]
        reason = f"{score:.3f} = {terms}" + (f"; failed: {failed}" if failed else "")
        return Verdict(score, not failed, reason,
                       {"weights": weights, "parts": {n: v.to_dict() for n, v in verdicts.items()}})


@dataclass(frozen=True)
class Gate:
    """`reward` counts only if `gate` passes (e.g. format before correctness); else score 0.

    When the gate fails, `reward` is not run: no time is spent checking a malformed answer.
    """

    gate: RewardSource
    reward: RewardSource
    gate_name: str = "format"
    reward_name: str = "correctness"

    def __post_init__(self) -> None:
        if self.gate_name == self.reward_name:
            raise ValueError(f"Gate part names must differ, both are {self.gate_name!r}")

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        opened = _judge(self.gate_name, self.gate, problem, completion)
        parts: dict[str, Any] = {self.gate_name: opened.to_dict()}
        if not opened.passed:
            return Verdict(0.0, False, f"gate {self.gate_name!r} failed: {opened.reason}", {"parts": parts})
        verdict = _judge(self.reward_name, self.reward, problem, completion)
        parts[self.reward_name] = verdict.to_dict()
        return Verdict(verdict.score, verdict.passed, f"gate {self.gate_name!r} passed; {verdict.reason}",
                       {"parts": parts})


@dataclass(frozen=True)
class ValueWeighted:
    """RLEV (Yu et al. 2025, arXiv:2510.20187): scale correctness by the prompt's human value.

    The paper's reward is r = s(x) * correct, with s(x) = 1 + min(alpha * v(x), 1) and v(x) the
    question's points over its exam's total, so v is in [0, 1] and s in [1, 2]. We divide by the
    largest scale, 2, to keep scores in [0, 1]: score = reward_score * s(x) / 2, so the ratio of
    rewards across prompts (1 to 2) is the paper's. Note s(x) is constant within a prompt's group:
    advantages divided by the group's std cancel it entirely, so pair this with an estimator that
    does not (mean-only GRPO, RLOO, PPO with a value baseline).

    Departure: the inner score may be fractional (e.g. constraints satisfied), not only 0/1.
    value_key: meta key holding v(x) in [0, 1], or raw points when `total_key` is set.
    total_key: meta key holding the total the points are out of; v(x) = points / total.
    default_value: v(x) for problems without `value_key`; None makes that an error.
    """

    reward: RewardSource
    alpha: float = 1.0
    value_key: str = "value"
    total_key: str | None = None
    default_value: float | None = None
    reward_name: str = "correctness"

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"ValueWeighted.alpha must be >= 0, got {self.alpha}")
        if self.default_value is not None and not 0.0 <= self.default_value <= 1.0:
            raise ValueError(f"ValueWeighted.default_value must be in [0, 1], got {self.default_value}")

    def value(self, problem: Problem) -> float:
        """v(x) in [0, 1] from problem.meta. A missing or bad value is a task bug: ValueError."""
        meta = problem.meta
        if self.value_key not in meta:
            if self.default_value is None:
                raise ValueError(f"problem.meta has no {self.value_key!r} (keys: {sorted(meta)}); "
                                 "set ValueWeighted.default_value to allow that")
            return self.default_value
        value = meta[self.value_key]
        if not _is_number(value):
            raise ValueError(f"problem.meta[{self.value_key!r}] must be a number, got {value!r}")
        if self.total_key is not None:
            total = meta.get(self.total_key)
            if not _is_number(total) or total <= 0:
                raise ValueError(f"problem.meta[{self.total_key!r}] must be a number > 0, got {total!r}")
            value = value / total
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"prompt value must be in [0, 1], got {value} from meta[{self.value_key!r}]")
        return float(value)

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        value = self.value(problem)
        scale = 1.0 + min(self.alpha * value, 1.0)
        verdict = _judge(self.reward_name, self.reward, problem, completion)
        score = _unit(verdict.score * scale / 2.0)
        reason = f"{score:.3f} = {verdict.score:.2f} x {scale:.2f} / 2 (value {value:.3f}); {verdict.reason}"
        return Verdict(score, verdict.passed, reason,
                       {"value": value, "scale": scale, "parts": {self.reward_name: verdict.to_dict()}})
