"""Adaptive difficulty: keep the policy's recent pass rate inside a target band.

Follows the idea of RLVE ("RLVE: Scaling Up Reinforcement Learning for Language Models with
Adaptive Verifiable Environments", Zeng et al., 2025): a verifiable environment that adjusts its
problem difficulty to the policy as training goes, so that problems are neither always solved
(zero group variance, no GRPO signal) nor never solved (no signal either).

Where we depart from RLVE, and why:
- One difficulty level at a time, not a sliding range [l, h] sampled uniformly: with a tiny
  model and a few hundred steps a single level is easier to read in the logs and to test.
- The level also moves *down* when the pass rate falls below the band (RLVE only raises the
  upper bound), so a bad step up is undone instead of starving the run of reward.
- Decisions use `window` verdicts at the current level, checked once per training batch;
  after a move the window restarts, since verdicts at the old level say nothing about the new one.

`DifficultyController` is the pure logic (no tasks, no I/O). `AdaptiveTask` wraps one task per
level, samples training problems at the controller's level and evaluates at a fixed `eval_level`.
Two ready-made generators are registered: `adaptive_addition` (level = number of digits) and
`adaptive_reasoning_gym` (level = index into a list of config overrides).
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.envs.base import Task
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.envs.reasoning_gym import ReasoningGymTask
from feedbackrl.rewards.verdict import Problem, Verdict


def next_level(level: int, pass_rate: float, low: float, high: float, min_level: int, max_level: int) -> int:
    """One step up when `pass_rate` > `high`, one down when < `low`, kept within [min_level, max_level]."""
    if pass_rate > high:
        return min(level + 1, max_level)
    if pass_rate < low:
        return max(level - 1, min_level)
    return level


@dataclass
class DifficultyController:
    """Tracks the last `window` pass/fail results at the current level and moves the level."""

    min_level: int
    max_level: int
    level: int
    low: float = 0.3
    high: float = 0.7
    window: int = 128
    _recent: deque[bool] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.min_level > self.max_level:
            raise ValueError(f"min_level={self.min_level} must be <= max_level={self.max_level}")
        if not self.min_level <= self.level <= self.max_level:
            raise ValueError(f"start level {self.level} must be in [{self.min_level}, {self.max_level}]")
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"pass-rate band must satisfy 0 <= low < high <= 1, got low={self.low} high={self.high}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        self._recent = deque(maxlen=self.window)

    @property
    def pass_rate(self) -> float | None:
        """Pass rate over the current window; None until it holds `window` results."""
        return sum(self._recent) / len(self._recent) if len(self._recent) == self.window else None

    def update(self, passed: Iterable[bool]) -> int:
        """Add one batch of results at the current level; returns the (possibly new) level."""
        self._recent.extend(bool(p) for p in passed)
        rate = self.pass_rate
        if rate is not None:
            new = next_level(self.level, rate, self.low, self.high, self.min_level, self.max_level)
            if new != self.level:
                self.level = new
                self._recent.clear()
        return self.level

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        level = int(state["level"])
        if not self.min_level <= level <= self.max_level:
            raise ValueError(f"saved level {level} is outside [{self.min_level}, {self.max_level}]")
        self.level = level
        self._recent = deque((bool(p) for p in state["recent"]), maxlen=self.window)


@dataclass
class AdaptiveTask(Task):
    """Training problems at the controller's level, held-out problems at `eval_level`.

    `levels` maps each difficulty level to the task that writes its problems; the levels must be
    consecutive integers. Problems carry their level in `meta["level"]` and are verified by the
    task of that level, so a verdict is right even if the level moved after the problem was drawn.
    """

    levels: dict[int, Task]
    controller: DifficultyController
    eval_level: int
    name: str = "adaptive"

    def __post_init__(self) -> None:
        keys = sorted(self.levels)
        if not keys or keys != list(range(keys[0], keys[-1] + 1)):
            raise ValueError(f"adaptive levels must be consecutive integers, got {keys}")
        if (self.controller.min_level, self.controller.max_level) != (keys[0], keys[-1]):
            raise ValueError(f"controller range [{self.controller.min_level}, {self.controller.max_level}] "
                             f"must match the levels [{keys[0]}, {keys[-1]}]")
        if self.eval_level not in self.levels:
            raise ValueError(f"eval_level={self.eval_level} must be one of the levels {keys}")

    @property
    def difficulty(self) -> int:
        """The level training problems are drawn at now."""
        return self.controller.level

    def _tag(self, problem: Problem, level: int) -> Problem:
        return dataclasses.replace(problem, meta={**problem.meta, "level": level})

    def sample(self, rng: random.Random) -> Problem:
        return self._tag(self.levels[self.difficulty].sample(rng), self.difficulty)

    def heldout(self, n: int) -> list[Problem]:
        return [self._tag(p, self.eval_level) for p in self.levels[self.eval_level].heldout(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        level = problem.meta.get("level", self.difficulty)
        verdict = self.levels[level].verify(problem, completion)
        return dataclasses.replace(verdict, details={**verdict.details, "level": level})

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        return self.levels[problem.meta.get("level", self.difficulty)].demonstrate(problem, rng)

    def observe(self, problems: list[Problem], verdicts: list[Verdict]) -> None:
        level = self.difficulty
        self.controller.update(v.passed for p, v in zip(problems, verdicts, strict=True)
                               if p.meta.get("level") == level)

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"])


def adaptive_addition(*, eval_level: int, min_level: int = 1, max_level: int = 6, start_level: int | None = None,
                      low: float = 0.3, high: float = 0.7, window: int = 128, demo_noise: float = 0.0,
                      reverse: bool = False, pad_operands: bool = False) -> AdaptiveTask:
    """Addition whose level is the number of digits per operand (1..9)."""
    levels: dict[int, Task] = {d: AdditionTask(digits=d, demo_noise=demo_noise, reverse=reverse,
                                               pad_operands=pad_operands) for d in range(min_level, max_level + 1)}
    start = min_level if start_level is None else start_level
    return AdaptiveTask(levels, DifficultyController(min_level, max_level, start, low, high, window),
                        eval_level, name="adaptive_addition")


def adaptive_reasoning_gym(*, dataset: str, levels: list[dict[str, Any]], eval_level: int,
                           config: dict[str, Any] | None = None, start_level: int = 0, low: float = 0.3,
                           high: float = 0.7, window: int = 128, prompt_template: str = "{question}",
                           extract: str = "bare", seed: int = 0, size: int = 100_000,
                           heldout_fraction: float = 0.1, partial_credit: bool = True) -> AdaptiveTask:
    """A reasoning-gym generator whose level i uses `config` updated with `levels[i]` (levels count from 0)."""
    if not levels or not all(isinstance(lv, dict) for lv in levels):
        raise ValueError(f"adaptive_reasoning_gym levels must be a non-empty list of config dicts, got {levels!r}")
    tasks: dict[int, Task] = {
        i: ReasoningGymTask(dataset, {**(config or {}), **overrides}, prompt_template, extract, seed, size,
                            heldout_fraction, partial_credit)
        for i, overrides in enumerate(levels)}
    controller = DifficultyController(0, len(levels) - 1, start_level, low, high, window)
    return AdaptiveTask(tasks, controller, eval_level, name="adaptive_reasoning_gym")


def adaptive_reverse(*, eval_level: int, min_level: int = 3, max_level: int = 10, start_level: int | None = None,
                     low: float = 0.3, high: float = 0.7, window: int = 128, shortest: int = 3,
                     alphabet_size: int = 10, demo_noise: float = 0.0, sloppy_from: int = 5) -> AdaptiveTask:
    """Word reversal whose level L draws words of `shortest`..L letters (so a level includes the easier ones)."""
    levels: dict[int, Task] = {
        n: ReverseTask(min_len=min(shortest, n), max_len=n, alphabet_size=alphabet_size, demo_noise=demo_noise,
                       sloppy_from=sloppy_from) for n in range(min_level, max_level + 1)}
    start = min_level if start_level is None else start_level
    return AdaptiveTask(levels, DifficultyController(min_level, max_level, start, low, high, window),
                        eval_level, name="adaptive_reverse")
