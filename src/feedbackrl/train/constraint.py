"""The `[constraint]` section in the on-policy loop: the Lagrange multiplier, its state, the combined advantage.

Once per step the loop hands the batch's costs (`Batch.signals["cost"]`, from `[cost]`; with
`constraint.probe_prompts` the probe set's costs instead: `multiplier_costs`, `train/probe.py`) to
`Multiplier.update`, which takes one step of the recipe's multiplier aimed at threshold - margin
(`algos.constrained`: Safe RLHF's gradient ascent on log lambda, or the PID-Lagrangian) from the
windowed mean cost; then the step's advantages are `constrained_advantages`: the algorithm's own
advantage (GRPO's group-relative, RLOO's leave-one-out) of the rewards and of the costs, combined as
(A_r - lambda A_c) / (1 + lambda) with the lambda just updated (the order of Safe RLHF's reference
trainer: multiplier first, then the policy).

The multiplier's state is Python floats: `state_dict` goes into each checkpoint (`CONSTRAINT_FILE`) and
`load_state_dict` puts it back bit for bit on resume and on a monitor's rollback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from feedbackrl.algos.constrained import (
    LagrangeState,
    PIDLagrangeState,
    combined_advantages,
    lagrange_update,
    pid_lagrange_update,
)
from feedbackrl.config import ConstraintConfig
from feedbackrl.episodes.contracts import Batch

CONSTRAINT_FILE = "constraint.pt"  # in each checkpoint of a run with [constraint]


@dataclass
class Multiplier:
    """The recipe's multiplier and its current state."""

    cfg: ConstraintConfig
    state: LagrangeState | PIDLagrangeState
    bound_group: int = 1  # completions per prompt the bound groups by (constraint.bound_per_prompt), else 1

    @classmethod
    def from_config(cls, cfg: ConstraintConfig, group_size: int = 1) -> Multiplier:
        """`group_size`: the rollout's completions per prompt, which `bound_per_prompt` groups the window by."""
        state = LagrangeState.initial(cfg.init) if cfg.multiplier == "lagrangian" else PIDLagrangeState(lam=cfg.init)
        return cls(cfg, state, group_size if cfg.bound_per_prompt else 1)

    @property
    def lam(self) -> float:
        return self.state.lam

    def update(self, costs: Tensor) -> dict[str, float]:
        """One multiplier step from this step's (N,) costs -> its stats (`constraint/lambda`, ...)."""
        c = self.cfg
        target = c.threshold - c.margin
        if isinstance(self.state, LagrangeState):
            self.state, stats = lagrange_update(self.state, costs, target, c.lr, c.window, c.delay, c.cap,
                                                 c.bound_delta, self.bound_group)
        else:
            self.state, stats = pid_lagrange_update(self.state, costs, target, c.kp, c.ki, c.kd, c.window, c.delay,
                                                    c.cap, c.bound_delta, self.bound_group)
        return {**stats, "constraint/threshold": c.threshold}

    def state_dict(self) -> dict[str, Any]:
        return {"multiplier": self.cfg.multiplier, "state": self.state.to_dict()}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        if data.get("multiplier") != self.cfg.multiplier:
            raise ValueError(f"the checkpoint's multiplier is {data.get('multiplier')!r}, the recipe's "
                             f"constraint.multiplier is {self.cfg.multiplier!r}: resume with the recipe it was "
                             "trained with")
        kind = LagrangeState if self.cfg.multiplier == "lagrangian" else PIDLagrangeState
        self.state = kind.from_dict(data["state"])


def multiplier_costs(batch: Batch) -> Tensor:
    """What the multiplier steps on: the probe prompts' costs (`constraint.probe_prompts`, `train/probe.py`) when
    the loop sampled them, else the batch's own per-completion costs."""
    return batch.probe_costs if batch.probe_costs is not None else batch.signals["cost"]


def constrained_advantages(advantage: Callable[..., Tensor], rewards: Tensor, costs: Tensor, group_size: int,
                           lam: float, scale: bool) -> tuple[Tensor, dict[str, float]]:
    """`advantage` (the algorithm's: GRPO's or RLOO's) of the (N,) rewards and of the (N,) costs, each on its
    own, combined under the multiplier `lam`. For GRPO this is `algos.constrained.grpo_lagrangian_advantages`."""
    reward_adv = advantage(rewards, group_size, scale=scale)
    cost_adv = advantage(costs, group_size, scale=scale)
    stats = {"advantages/reward_abs_mean": reward_adv.abs().mean().item(),
             "advantages/cost_abs_mean": cost_adv.abs().mean().item()}
    return combined_advantages(reward_adv, cost_adv, lam), stats
