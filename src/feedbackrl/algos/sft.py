"""Supervised fine-tuning: negative log-likelihood of the demonstrated response tokens."""

from __future__ import annotations

from torch import Tensor


def sft_loss(logprobs: Tensor, mask: Tensor) -> Tensor:
    """logprobs (N, T) of the demonstrated tokens; mask (N, T) = 1 on tokens to learn.

    Mean negative log-likelihood over the masked tokens of the whole batch (every token weighs
    the same, so long demonstrations count in proportion to their length).
    """
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
