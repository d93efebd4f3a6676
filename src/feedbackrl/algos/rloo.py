"""REINFORCE Leave-One-Out advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting
REINFORCE Style Optimization for Learning from Human Feedback in LLMs", eq. 4; the estimator is
Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!").

For G samples of one prompt, sample i's baseline is the mean reward of the *other* G - 1:
A_i = r_i - (sum_j r_j - r_i) / (G - 1), which equals G/(G-1) * (r_i - mean_j r_j). The baseline
does not depend on r_i, so the policy gradient stays unbiased, unlike subtracting the group mean.

Departures: none in the estimator. The rewards are whatever the caller passes: the paper uses the
sequence score minus the KL penalty, sum_t beta * log(pi/pi_ref), which the caller folds in first.
`scale=True` also divides by the group's (n-1) standard deviation, TRL's `normalize_advantages`
option (off in the paper); `eps` keeps all-equal groups at 0.
"""

from __future__ import annotations

from torch import Tensor


def rloo_advantages(rewards: Tensor, group_size: int, scale: bool = False, eps: float = 1e-4) -> Tensor:
    """(N,) rewards, N = B*G with each prompt's G samples consecutive -> (N,) leave-one-out advantages."""
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B*G,) with group_size G >= 2 dividing its length (the baseline "
                         f"needs another sample); got shape {tuple(rewards.shape)} and G={group_size}")
    r = rewards.float().view(-1, group_size)  # (B, G)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    adv = r - baseline
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)
