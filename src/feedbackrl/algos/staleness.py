"""Stale samples in asynchronous RL: how old a sample is, and the importance weights that correct for it.

In asynchronous RL the rollout workers keep sampling while the learner trains, so a batch may have
been sampled by an older policy (the *behaviour* policy, version v_b) than the one being updated
(version v). Its *staleness* is v - v_b policy versions; a bound `max_staleness` keeps it small.

Two corrections, both per token:

- Truncated importance sampling (TIS; Ionides 2008, as applied to RL post-training by Yao et al.
  2025, "Your efficient RL framework secretly brings you off-policy RL training"): weight the
  loss by w = min(pi_prox / pi_behav, cap), detached.
- The decoupled objective (Hilton et al. 2021, "Batch size-invariance for policy optimization",
  eq. 3; used by AReaL, Fu et al. 2025): PPO's clip is taken around the *proximal* policy pi_prox
  (the learner's policy when the batch arrives), not around the behaviour policy, and the
  off-policy gap pi_prox / pi_behav enters as a weight outside the clip:
      loss = -w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A),  r = pi / pi_prox.

Departures: the weight is truncated at `cap` (Hilton et al. use it untruncated; truncation bounds the
variance as in TIS and AReaL), and it is computed per token, not per sequence, like the ratio.
With staleness 0 pi_prox = pi_behav, w = 1 and the loss is exactly `clipped_pg_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from feedbackrl.algos.policy_gradient import clipped_pg_loss


def staleness(sample_versions: Tensor, learner_version: int) -> Tensor:
    """(N,) policy versions that sampled each row -> (N,) versions between sampling and learning (>= 0)."""
    age = learner_version - sample_versions
    if bool((age < 0).any()):
        raise ValueError(f"a sample's policy version {int(sample_versions.max())} is newer than the learner's "
                         f"{learner_version}")
    return age


def within_staleness(sample_versions: Tensor, learner_version: int, max_staleness: int) -> Tensor:
    """(N,) bool: the rows whose staleness is at most `max_staleness` (the others must be dropped)."""
    return staleness(sample_versions, learner_version) <= max_staleness


def truncated_importance_weights(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor,
                                 cap: float) -> Tensor:
    """proximal_logprobs, behaviour_logprobs, mask: (N, T) -> (N, T) min(exp(prox - behav), cap), 0 on padding.

    Detached: the weight corrects the sampling distribution, it is not optimised.
    """
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    ratio = torch.exp((proximal_logprobs - behaviour_logprobs).detach())
    return torch.clamp(ratio, max=cap) * mask


def decoupled_pg_loss(logprobs: Tensor, proximal_logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor,
                      mask: Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                      cap: float = 2.0) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs, proximal_logprobs, behaviour_logprobs, mask: (N, T); advantages: (N,) or (N, T).

    Returns (N, T) per-token losses -w * min(r*A, clip(r)*A) with r = exp(logprobs - proximal_logprobs)
    and w = `truncated_importance_weights(proximal, behaviour, mask, cap)`, and stats: clip_frac, the
    mean weight over real tokens and the fraction of real tokens whose weight was truncated.
    """
    per_token, stats = clipped_pg_loss(logprobs, proximal_logprobs, advantages, mask, clip_low, clip_high)
    weights = truncated_importance_weights(proximal_logprobs, behaviour_logprobs, mask, cap)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        raw = torch.exp(proximal_logprobs - behaviour_logprobs)
        stats["is_weight/mean"] = weights.sum() / n
        stats["is_weight/truncated_frac"] = ((raw > cap).float() * mask).sum() / n
    return per_token * weights, stats
