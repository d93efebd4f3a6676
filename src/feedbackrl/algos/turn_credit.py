"""Turn-level credit from per-turn rewards (process rewards) in multi-turn episodes.

Outcome-only GRPO gives every token of a trajectory the same advantage. With per-turn rewards
r_k (e.g. a game's feedback after each move, a tool call that errored), turn k's tokens can also
get credit for what happens from turn k on: the reward-to-go R_k = sum_{j>=k} gamma^(j-k) r_j,
baselined by the group: A_k = R_k - mean of R_k over the group's episodes that reached turn k.
This follows the turn-level advantage of MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn
Reasoning in LLM Agents via Turn-Level Credit Assignment"), which adds a turn-level term to the
outcome advantage; the loop adds `turn_credit * A_k` to the trajectory advantage of each token.

Departures: the baseline is the group mean at the same turn index, not a learned critic, and it is
not divided by a standard deviation (per-turn rewards are often sparse: a std would blow up the
rare nonzero ones). A turn reached by one episode only of its group gets A_k = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def turn_returns(turn_rewards: Tensor, turn_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """(N, K) per-turn rewards and mask (1 = the turn happened) -> (N, K) discounted reward-to-go (0 where masked)."""
    r = turn_rewards.float() * turn_mask
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for k in range(r.shape[1] - 1, -1, -1):
        running = r[:, k] + gamma * running
        out[:, k] = running
    return out * turn_mask


def turn_credit(turn_rewards: Tensor, turn_mask: Tensor, token_turn: Tensor, group_size: int,
                gamma: float = 1.0) -> Tensor:
    """Per-token turn advantages.

    turn_rewards, turn_mask: (N, K), N = B*G with each group's G episodes consecutive;
    token_turn: (N, T) the turn index of each policy token, -1 on tokens that are not the policy's.
    Returns (N, T): A_k of the token's turn, 0 on other tokens.
    """
    n, k = turn_rewards.shape
    if n % group_size:
        raise ValueError(f"{n} episodes do not split into groups of {group_size}")
    ret = turn_returns(turn_rewards, turn_mask, gamma).view(-1, group_size, k)  # (B, G, K)
    m = turn_mask.float().view(-1, group_size, k)
    count = m.sum(dim=1, keepdim=True)  # (B, 1, K) episodes of the group that reached turn k
    baseline = ret.sum(dim=1, keepdim=True) / count.clamp(min=1)
    adv = ((ret - baseline) * m * (count > 1)).view(n, k)  # (N, K)
    idx = token_turn.clamp(min=0, max=k - 1)
    return adv.gather(1, idx) * (token_turn >= 0)
