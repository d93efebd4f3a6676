"""REINFORCE Leave-One-Out advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting
REINFORCE Style Optimization for Learning from Human Feedback in LLMs", eq. 4; the estimator is
Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!").

For G samples of one prompt, sample i's baseline is the mean reward of the *other* G - 1:
A_i = r_i - (sum_j r_j - r_i) / (G - 1), which equals G/(G-1) * (r_i - mean_j r_j). The baseline
does not depend on r_i, so the policy gradient stays unbiased, unlike subtracting the group mean.

Departures: none in the estimator; two around it, both in how `train/grpo.py` uses it.
- Normalisation. `scale=True` divides each group's advantages by the standard deviation of that
  group's *rewards* (unbiased, n - 1) plus `eps`, as GRPO does; `eps` keeps all-equal groups at 0.
  This is not TRL's `normalize_advantages`, which whitens the *advantages* over the whole batch
  (subtract their batch mean, divide by their batch std + 1e-4). Neither is in the paper; the
  default (`algo.scale_advantages = false` for rloo) uses the raw leave-one-out advantages.
- KL. The rewards are used as the caller passes them. The paper (and TRL's RLOO) subtract the
  sequence-level KL penalty beta * sum_t log(pi_old/pi_ref) from each reward *before* the
  baseline; our loop does not fold it in: with `algo.kl_coef > 0` it adds the k3 estimate of the
  per-token KL to the loss (`algos.kl.kl_k3`), exactly as for GRPO, after these advantages.
The loop's loss is the clipped surrogate of `algos.policy_gradient`; with one epoch and one
minibatch the ratio is exactly 1 and the gradient is REINFORCE's with this baseline, as in the
paper, up to how per-token terms are summed into a scalar (`algo.aggregation`).
"""

from __future__ import annotations

from torch import Tensor


def rloo_advantages(rewards: Tensor, group_size: int, scale: bool = False, eps: float = 1e-4) -> Tensor:
    """(N,) rewards, N = B*G with each prompt's G samples consecutive -> (N,) leave-one-out advantages.

    scale: divide each group's advantages by the std of its rewards + eps (see "Normalisation").
    """
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B*G,) with group_size G >= 2 dividing its length (the baseline "
                         f"needs another sample); got shape {tuple(rewards.shape)} and G={group_size}")
    r = rewards.float().view(-1, group_size)  # (B, G)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    adv = r - baseline
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)
