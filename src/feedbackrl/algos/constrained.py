"""Constrained policy optimisation: a cost signal kept under a threshold by a Lagrange multiplier.

The problem is max_theta J_R(theta) subject to J_C(theta) = E[cost] <= d (the threshold). Safe RLHF
(Dai et al. 2023, "Safe RLHF: Safe Reinforcement Learning from Human Feedback", section 3.3)
solves its Lagrangian dual min_theta max_{lambda >= 0} -J_R + lambda (J_C - d) by
alternating a policy step on the combined advantage

    A = (A_r - lambda * A_c) / (1 + lambda)                                    `combined_advantages`

(the division keeps the advantage's scale as lambda grows, so PPO's clip range keeps its meaning)
with a multiplier step. lambda = exp(log lambda) stays positive, and log lambda takes a gradient
ascent step on lambda (J_C - d), with J_C the mean cost over a window of recent completions:

    log lambda <- min(log lambda + lr * lambda * (J_C - d), log lambda_max)     `lagrange_update`

GRPO-Lagrangian (`grpo_lagrangian_advantages`) applies the same combination to GRPO's
group-relative advantages of the rewards and of the costs (`algos.advantages.group_advantages`).

PPO-Lagrangian, Safe RLHF's own form, has a cost value head beside the reward value head: GAE
(`algos.ppo.gae`) runs on the reward and on the cost separately, each over its own values, and the
per-token advantages are combined (`ppo_lagrangian_advantages`). The per-token KL penalty goes into
both signals with opposite signs (`kl_shaped_costs`, beside `algos.ppo.kl_penalised_rewards`), so the
combined advantage carries the KL term at one weight whatever lambda: (kl + lambda kl) / (1 + lambda).

A multiplier learned by gradient ascent is an integral controller on the violation J_C - d: it
keeps growing while the cost is over the threshold and needs as long to come down, so with a
policy that lags behind lambda the cost overshoots and oscillates around d. Stooke et al. 2020
("Responsive Safety in Reinforcement Learning by PID Lagrangian Methods", algorithm 2) add a
proportional and a derivative term (`pid_lagrange_update`):

    Delta = J_C - d,   I <- max(0, I + Delta),   D = max(0, J_C - J_C_prev)
    lambda = min(max(0, K_P Delta + K_I I + K_D D), lambda_max)

Departures, shared by both updates:
- Window. J_C is the mean cost of the last `window` completions (all of them while fewer have been
  seen), as Safe RLHF's reference trainer does (`episode_cost_window_size`, default 128); the paper
  writes the expectation. Stooke et al. smooth J_C with an exponential moving average instead.
- Update delay. For the first `delay` calls the window fills but the multiplier stays at its initial
  value (Safe RLHF's `lambda_update_delay_steps`), so a cost model or a policy still warming up does
  not wind it up. PID: the integral and the previous cost are not updated either.
- Cap. lambda never exceeds `lambda_max`, the reference trainer's `lambda_max` (the paper has none):
  a large lambda drives the combined advantage towards -A_c and stops reward learning altogether.
  PID caps the integral term too (anti-windup): I stops at lambda_max / K_I.
- PPO-Lagrangian's KL. Safe RLHF's reference trainer puts half the penalty into each signal (0.5 kl
  into the reward, -0.5 kl into the cost), so its combined advantage carries kl_coef / 2; here each
  gets the whole penalty, so `algo.kl_coef` means what it means in PPO. It whitens neither
  advantage; here, with `algo.whiten_advantages`, each is whitened on its own before they are
  combined (as GRPO-Lagrangian scales each by its own group std), so lambda trades the two at
  one scale.
- Probe prompts (`probe_cycle`). Both papers step the multiplier on the training batch's costs. When a step holds
  few prompts and the cost is mostly decided by which prompts were drawn, that estimate moves with the draw, and
  lambda follows it. The loop can instead step it on a fixed probe set of prompts drawn once from the training
  distribution, sampled with the current policy a slice at a time (`probe_cycle` says which slice), so J_C is
  the mean cost over the same prompts at every step, one completion each: the release test's statistic over
  training prompts.
- The plain update is one step of SGD on log lambda with its own rate `lr`, the reference
  trainer's optimiser (the paper writes the same step); the state is plain Python floats so
  a checkpoint holds it bit-exactly (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor

from feedbackrl.algos.advantages import group_advantages
from feedbackrl.algos.confidence import mean_cost_upper_bound
from feedbackrl.algos.ppo import kl_penalised_rewards, whiten


def combined_advantages(reward_advantages: Tensor, cost_advantages: Tensor, lam: float | Tensor) -> Tensor:
    """Safe RLHF's advantage (A_r - lam * A_c) / (1 + lam); any shape, both alike; lam >= 0.

    A_c is the advantage of the *cost* (positive = costlier than expected), so it is subtracted.
    """
    if reward_advantages.shape != cost_advantages.shape:
        raise ValueError(f"reward and cost advantages must have one shape; got {tuple(reward_advantages.shape)} "
                         f"and {tuple(cost_advantages.shape)}")
    lam_value = float(lam)
    if not lam_value >= 0:  # also rejects NaN
        raise ValueError(f"the Lagrange multiplier must be >= 0, got {lam_value}")
    return (reward_advantages.float() - lam_value * cost_advantages.float()) / (1.0 + lam_value)


def grpo_lagrangian_advantages(rewards: Tensor, costs: Tensor, group_size: int, lam: float | Tensor,
                               scale: bool = True, eps: float = 1e-4) -> tuple[Tensor, dict[str, Tensor]]:
    """(N,) rewards and (N,) costs, N = B*G grouped by prompt -> (N,) combined advantages and stats.

    Each signal gets GRPO's group-relative advantage on its own (its own group std when `scale`),
    then `combined_advantages` with the multiplier `lam`. Stats: the two advantage vectors, detached.
    """
    if rewards.shape != costs.shape:
        raise ValueError(f"rewards and costs must have one shape (one cost per completion); got "
                         f"{tuple(rewards.shape)} and {tuple(costs.shape)}")
    reward_adv = group_advantages(rewards, group_size, scale=scale, eps=eps)
    cost_adv = group_advantages(costs, group_size, scale=scale, eps=eps)
    stats = {"advantages/reward": reward_adv.detach(), "advantages/cost": cost_adv.detach()}
    return combined_advantages(reward_adv, cost_adv, lam), stats


def kl_shaped_costs(costs: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
                    kl_coef: float) -> Tensor:
    """costs (N,); logprobs, ref_logprobs, mask (N, T) -> (N, T) per-token costs.

    costs_t = +kl_coef * (logprobs_t - ref_logprobs_t) on real tokens, plus the completion's cost at its
    last real token; 0 on padding: `kl_penalised_rewards` of the negated cost, negated. Drifting from the
    reference is a cost here, as it is a penalty on the reward.
    """
    return -kl_penalised_rewards(-costs, logprobs, ref_logprobs, mask, kl_coef)


def ppo_lagrangian_advantages(reward_advantages: Tensor, cost_advantages: Tensor, mask: Tensor, lam: float | Tensor,
                              whiten_each: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
    """(N, T) GAE advantages of the rewards and of the costs, (N, T) right-padded mask -> (N, T) combined
    advantages (0 on padding) and stats.

    With `whiten_each`, each advantage is whitened over the batch's real tokens on its own
    (`algos.ppo.whiten`) first; then `combined_advantages` with the multiplier `lam`. Stats: the mean
    absolute value of each (after whitening) over the real tokens.
    """
    if reward_advantages.shape != mask.shape or cost_advantages.shape != mask.shape:
        raise ValueError(f"reward and cost advantages must be (N, T) like the mask {tuple(mask.shape)}; got "
                         f"{tuple(reward_advantages.shape)} and {tuple(cost_advantages.shape)}")
    m = mask.float()
    if whiten_each:
        reward_advantages, cost_advantages = whiten(reward_advantages, mask), whiten(cost_advantages, mask)
    count = m.sum().clamp(min=1)
    stats = {"advantages/reward_abs_mean": (reward_advantages.abs() * m).sum() / count,
             "advantages/cost_abs_mean": (cost_advantages.abs() * m).sum() / count}
    return combined_advantages(reward_advantages, cost_advantages, lam) * m, stats


def _window_costs(window: tuple[float, ...], costs: Tensor | list[float], size: int) -> tuple[float, ...]:
    values = [float(c) for c in (costs.detach().reshape(-1).tolist() if isinstance(costs, Tensor) else costs)]
    if not values:
        raise ValueError("costs is empty: the multiplier update needs the costs of this step's completions")
    if not all(math.isfinite(c) for c in values):
        raise ValueError(f"costs must be finite; got {[c for c in values if not math.isfinite(c)][:5]}")
    return (window + tuple(values))[-size:]


def _cost_estimate(recent: tuple[float, ...], bound_delta: float, bound_group: int = 1) -> float:
    """J_C: the window's mean cost, or (bound_delta > 0) its one-sided Student-t upper bound at level bound_delta
    (HC-RLHF's pessimism in the multiplier's update; the mean while the window holds a single cost).

    bound_group > 1: the window's costs come in consecutive groups of that many completions of one prompt, which
    are not independent draws; the bound is then over the groups' mean costs (n = groups, the mean unchanged),
    so its width counts the spread between prompts instead of treating every completion as a sample."""
    if bound_group < 1:
        raise ValueError(f"bound_group must be >= 1, got {bound_group}")
    if bound_delta == 0 or len(recent) < 2:
        return sum(recent) / len(recent)
    if bound_group == 1:
        return mean_cost_upper_bound(list(recent), bound_delta).bound
    if len(recent) % bound_group:
        raise ValueError(f"the window holds {len(recent)} costs, not whole groups of {bound_group}: the window and "
                         "each step's costs must be multiples of the group size")
    units = [sum(recent[i : i + bound_group]) / bound_group for i in range(0, len(recent), bound_group)]
    if len(units) < 2:
        return sum(recent) / len(recent)
    return mean_cost_upper_bound(units, bound_delta).bound


def probe_cycle(position: int, count: int, size: int) -> tuple[list[int], int]:
    """The next `count` members of a fixed probe set of `size` prompts, in order from `position` and wrapping
    around -> (their indices, the position after them). A window of `size` costs filled this way holds one
    completion of every probe prompt (its latest), whatever the step."""
    if size < 1 or count < 1 or not 0 <= position < size:
        raise ValueError(f"need size >= 1, count >= 1 and 0 <= position < size; got position={position}, "
                         f"count={count}, size={size}")
    indices = [(position + i) % size for i in range(count)]
    return indices, (position + count) % size


def _check_settings(window: int, delay: int, lambda_max: float) -> None:
    if window < 1 or delay < 0 or not lambda_max > 0:
        raise ValueError(f"need window >= 1, delay >= 0 and lambda_max > 0; got window={window}, delay={delay}, "
                         f"lambda_max={lambda_max}")


@dataclass(frozen=True)
class LagrangeState:
    """The plain multiplier's state: log lambda, the recent costs, and how many updates were called."""

    log_lambda: float
    window: tuple[float, ...] = ()
    step: int = 0

    @classmethod
    def initial(cls, lambda_init: float = 1.0) -> LagrangeState:
        if not lambda_init > 0:
            raise ValueError(f"lambda_init must be > 0 (the multiplier is exp(log lambda)), got {lambda_init}")
        return cls(log_lambda=math.log(lambda_init))

    @property
    def lam(self) -> float:
        return math.exp(self.log_lambda)

    def to_dict(self) -> dict[str, Any]:
        return {"log_lambda": self.log_lambda, "window": list(self.window), "step": self.step}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LagrangeState:
        return cls(log_lambda=float(data["log_lambda"]), window=tuple(float(c) for c in data["window"]),
                   step=int(data["step"]))


def lagrange_update(state: LagrangeState, costs: Tensor | list[float], threshold: float, lr: float = 0.1,
                    window: int = 128, delay: int = 0, lambda_max: float = 5.0, bound_delta: float = 0.0,
                    bound_group: int = 1) -> tuple[LagrangeState, dict[str, float]]:
    """One Safe RLHF multiplier step from this step's per-completion costs (N,) -> new state, stats.

    log lambda <- min(log lambda + lr * lambda * (J_C - threshold), log lambda_max), J_C the mean of
    the last `window` costs (with `bound_delta` > 0 their Student-t upper bound at that level instead, over the
    means of consecutive groups of `bound_group` costs when it is > 1);
    no change while `state.step < delay` (the window still fills).
    Stats: `constraint/lambda` (after the step), `constraint/cost_window_mean` (J_C),
    `constraint/violation` (J_C - threshold) and `constraint/updated` (1.0 when lambda moved).
    """
    _check_settings(window, delay, lambda_max)
    recent = _window_costs(state.window, costs, window)
    j_c = _cost_estimate(recent, bound_delta, bound_group)
    violation = j_c - threshold
    log_lambda, updated = state.log_lambda, state.step >= delay
    if updated:
        # SGD on -lambda * (J_C - d) w.r.t. log lambda: its gradient is -lambda * (J_C - d).
        log_lambda = min(log_lambda + lr * math.exp(log_lambda) * violation, math.log(lambda_max))
    new = replace(state, log_lambda=log_lambda, window=recent, step=state.step + 1)
    return new, {"constraint/lambda": new.lam, "constraint/cost_window_mean": j_c,
                 "constraint/violation": violation, "constraint/updated": float(updated)}


@dataclass(frozen=True)
class PIDLagrangeState:
    """The PID multiplier's state: lambda, the integral I, the previous J_C, the costs and the step."""

    lam: float
    integral: float = 0.0
    prev_cost: float | None = None
    window: tuple[float, ...] = field(default=())
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"lam": self.lam, "integral": self.integral, "prev_cost": self.prev_cost,
                "window": list(self.window), "step": self.step}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PIDLagrangeState:
        prev = data["prev_cost"]
        return cls(lam=float(data["lam"]), integral=float(data["integral"]),
                   prev_cost=None if prev is None else float(prev),
                   window=tuple(float(c) for c in data["window"]), step=int(data["step"]))


def pid_lagrange_update(state: PIDLagrangeState, costs: Tensor | list[float], threshold: float, kp: float,
                        ki: float, kd: float, window: int = 128, delay: int = 0, lambda_max: float = 5.0,
                        bound_delta: float = 0.0, bound_group: int = 1) -> tuple[PIDLagrangeState, dict[str, float]]:
    """One PID-Lagrangian step (Stooke et al. 2020, algorithm 2) from this step's costs -> new state, stats.

    Delta = J_C - threshold; I <- min(max(0, I + Delta), lambda_max / ki); D = max(0, J_C - J_C_prev)
    (0 on the first update); lambda = min(max(0, kp Delta + ki I + kd D), lambda_max). With kp = kd = 0
    it is plain gradient ascent on lambda itself (not on log lambda) with rate ki. `bound_delta` > 0: J_C is
    the window's Student-t upper bound at that level (over groups of `bound_group`), as in `lagrange_update`.
    """
    _check_settings(window, delay, lambda_max)
    if min(kp, ki, kd) < 0:
        raise ValueError(f"PID gains must be >= 0; got kp={kp}, ki={ki}, kd={kd}")
    recent = _window_costs(state.window, costs, window)
    j_c = _cost_estimate(recent, bound_delta, bound_group)
    violation = j_c - threshold
    new = replace(state, window=recent, step=state.step + 1)
    updated = state.step >= delay
    if updated:
        integral = max(0.0, state.integral + violation)
        if ki > 0:
            integral = min(integral, lambda_max / ki)
        derivative = 0.0 if state.prev_cost is None else max(0.0, j_c - state.prev_cost)
        lam = min(max(0.0, kp * violation + ki * integral + kd * derivative), lambda_max)
        new = replace(new, lam=lam, integral=integral, prev_cost=j_c)
    return new, {"constraint/lambda": new.lam, "constraint/cost_window_mean": j_c,
                 "constraint/violation": violation, "constraint/integral": new.integral,
                 "constraint/updated": float(updated)}
