"""Rewards as verdicts: every reward source returns a score *with evidence*.

A `Verdict` is what a reward source says about one completion: a score in [0, 1], whether it
passed, a one-line human-readable reason, and per-check details (which checks ran, what they
saw). Training uses `score`; people and monitors read the rest.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Problem:
    """One task instance: the prompt the policy sees and the gold reference a verifier checks.

    `answer` is whatever the task's verifier needs (a gold string for math, a dict of tests for
    code). `meta` carries task-specific extras (difficulty, source row, importance weight).
    """

    prompt: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """A score in [0, 1] with the evidence behind it."""

    score: float
    passed: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.score, int | float) and math.isfinite(self.score)):
            raise ValueError(f"Verdict.score must be a finite number, got {self.score!r}")
        if not 0.0 <= float(self.score) <= 1.0:
            raise ValueError(f"Verdict.score must be in [0, 1], got {self.score}")

    def to_dict(self) -> dict[str, Any]:
        return {"score": float(self.score), "passed": bool(self.passed), "reason": self.reason,
                "details": self.details}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)


def fail(reason: str, **details: Any) -> Verdict:
    """A zero-score verdict: the usual answer to malformed or wrong output."""
    return Verdict(score=0.0, passed=False, reason=reason, details=details)


class RewardSource(Protocol):
    """Anything that judges a completion for a problem. Must never raise on bad completions."""

    def __call__(self, problem: Problem, completion: str) -> Verdict: ...
