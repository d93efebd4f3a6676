"""Simulated teachers for segment preferences, with the irrationalities of B-Pref.

Lee, Smith, Dragan and Abbeel 2021, "B-Pref: Benchmarking Preference-Based Reinforcement Learning"
(section 3.2 and their `reward_model.py` `get_label`). With R the segment's return under the environment's
reward (the teacher's gold), a teacher, in this order:

1. skips the pair when both undiscounted returns are below `skip_below` ("skip" teacher);
2. marks it equal when the undiscounted returns differ by less than `equal_within` ("equal" teacher);
3. weighs step t of an L-step segment by gamma^(L-1-t) (myopic: recent steps count more);
4. prefers the first segment with probability sigmoid(beta * (R_1 - R_2)) ("stochastic"; beta = None is the
   perfectly rational teacher, who always picks the higher return; an exact tie then goes to the second);
5. flips the label with probability `mistake` ("mistake" teacher); an equal pair stays equal.

Departures: returns are summed over the segment's real steps only; after an episode ends inside a segment its
remaining steps are absorbing with reward 0 (`preferences.py`). The thresholds are in the reward's own units
(B-Pref scales them by the segment length times the mean reward of its task).

Labels: 1.0 = the first segment is preferred, 0.0 = the second, 0.5 = equal, NaN = skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Teacher:
    beta: float | None = None
    mistake: float = 0.0
    skip_below: float | None = None
    equal_within: float = 0.0
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"teacher beta must be > 0 (or None for a perfectly rational teacher); got {self.beta}")
        if not 0 <= self.mistake <= 1 or not 0 < self.gamma <= 1 or self.equal_within < 0:
            raise ValueError(f"need 0 <= mistake <= 1, 0 < gamma <= 1, equal_within >= 0; got mistake={self.mistake}, "
                             f"gamma={self.gamma}, equal_within={self.equal_within}")

    def label(self, rewards_1: Tensor, rewards_2: Tensor, generator: torch.Generator) -> Tensor:
        """rewards_1, rewards_2: (N, L) per-step gold rewards (0 on absorbing steps) -> (N,) labels."""
        if rewards_1.shape != rewards_2.shape or rewards_1.dim() != 2:
            raise ValueError(f"segments must be (N, L) alike; got {tuple(rewards_1.shape)}, {tuple(rewards_2.shape)}")
        r1, r2 = rewards_1.double().sum(1), rewards_2.double().sum(1)
        skip = (torch.maximum(r1, r2) < self.skip_below) if self.skip_below is not None else torch.zeros_like(r1).bool()
        equal = (r1 - r2).abs() < self.equal_within
        weights = self.gamma ** torch.arange(rewards_1.shape[1] - 1, -1, -1, dtype=torch.float64)  # (L,)
        d1, d2 = (rewards_1.double() * weights).sum(1), (rewards_2.double() * weights).sum(1)
        if self.beta is None:
            first = (d1 > d2).double()
        else:
            first = (torch.rand(r1.shape, generator=generator, dtype=torch.float64)
                     < torch.sigmoid(self.beta * (d1 - d2))).double()
        flip = torch.rand(r1.shape, generator=generator, dtype=torch.float64) < self.mistake
        labels = torch.where(flip, 1.0 - first, first)
        labels = torch.where(equal, torch.full_like(labels, 0.5), labels)
        return torch.where(skip, torch.full_like(labels, float("nan")), labels).float()
