"""Advantages for critic-free policy gradients.

`group_advantages` is GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, eq. 3 in
the outcome-supervision form): each completion's reward minus the mean of its prompt's group,
divided by the group's standard deviation. `scale=False` drops the division, as Dr. GRPO
(Liu et al. 2025, "Understanding R1-Zero-Like Training") recommends, because dividing by the
std up-weights prompts that are nearly always solved or nearly always failed.

Departures: the std is the unbiased (n-1) sample std, as in TRL and the DeepSeekMath reference;
`eps` keeps all-equal groups (std 0) at advantage 0 instead of NaN.
"""

from __future__ import annotations

from torch import Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B*G,) with G={group_size} dividing its length; "
                         f"got shape {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (B, G)


def group_advantages(rewards: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> Tensor:
    """(N,) rewards, N = B*G grouped by prompt (consecutive) -> (N,) advantages, zero-mean per group."""
    r = _grouped(rewards.float(), group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:
        std = r.std(dim=1, keepdim=True) if group_size > 1 else r.new_zeros(r.shape[0], 1)
        adv = adv / (std + eps)
    return adv.reshape(-1)


def rows_with_signal(advantages: Tensor) -> Tensor:
    """(N,) or (N, T) advantages -> (N,) bool: the rows with a nonzero advantage (on some token).

    A row whose advantage is exactly 0 everywhere (its group all right or all wrong) adds nothing to a
    policy-gradient loss and has no gradient through it; with no other term in the loss (no KL penalty) its
    forward and backward can be skipped without changing the gradient.
    """
    if advantages.dim() not in (1, 2):
        raise ValueError(f"advantages must be (N,) or (N, T); got shape {tuple(advantages.shape)}")
    nonzero = advantages.ne(0)
    return nonzero if advantages.dim() == 1 else nonzero.any(dim=1)
