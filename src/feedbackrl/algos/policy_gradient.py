"""Clipped policy-gradient surrogates (PPO's objective, used by GRPO and its variants).

`clipped_pg_loss` is PPO-clip (Schulman et al. 2017, eq. 7) per token, with separate lower and
upper clip ranges: `clip_high > clip_low` is DAPO's "clip-higher" (Yu et al. 2025), which lets
low-probability tokens grow and keeps entropy from collapsing. With `clip_low == clip_high` it is
the symmetric PPO/GRPO clip. Sequence-level advantages (N,) are broadcast over tokens, as GRPO
does for outcome rewards; token-level advantages (N, T) are used as given (PPO with GAE).

Returns per-token losses; aggregation (token/sequence mean) is a separate choice, see
`aggregate.py`, and the KL penalty is added by the caller (`kl.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_pg_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    clip_low: float = 0.2, clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs, old_logprobs, mask: (N, T); advantages: (N,) or (N, T).

    Returns (N, T) per-token losses -min(r*A, clip(r, 1-clip_low, 1+clip_high)*A) (zero on
    padding) and stats: the fraction of real tokens where the clipped branch was active.
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped) * mask
    with torch.no_grad():
        active = (clipped < unclipped).float() * mask
        clip_frac = active.sum() / mask.sum().clamp(min=1.0)
    return loss, {"clip_frac": clip_frac}
