"""Which pair of candidate responses to send to a labeller: active (uncertainty) or random selection.

Each prompt has up to K candidate responses with reward-model scores. Under the Bradley-Terry model
the reward model predicts P(i > j) = sigmoid(r_i - r_j), so the pair it is least sure about is the
one with the smallest |r_i - r_j|, where |P(i > j) - 0.5| is smallest: uncertainty sampling
(Lewis and Gale 1994), the rule the active-preference literature starts from (e.g. Sadigh et al.
2017, Biyik and Sadigh 2018, who choose the query that most splits the model's belief).

- `uncertain_pairs`: per prompt, the least certain pair and its certainty |P - 0.5| (in [0, 0.5)).
- `random_pairs`: per prompt, a uniformly random pair of distinct valid candidates.
- `least_certain`: the `n` prompts whose chosen pair is least certain.

Departure: we pick at most one pair per prompt, so one prompt's many near-identical candidates
cannot take the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _pair_index(k: int) -> tuple[Tensor, Tensor]:
    """All i < j among k candidates: two (k(k-1)/2,) index tensors."""
    i, j = torch.triu_indices(k, k, offset=1)
    return i, j


def uncertain_pairs(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """scores, mask: (B, K) raw reward-model scores, 1 = a real candidate.

    -> pairs (B, 2) candidate indices (i < j) of the least certain pair per prompt, and certainty
    (B,) = |sigmoid(r_i - r_j) - 0.5| of that pair; +inf for a prompt with fewer than 2 candidates.
    Ties in certainty go to the first pair in (i, j) order.
    """
    i, j = _pair_index(scores.shape[1])
    certainty = (torch.sigmoid(scores[:, i] - scores[:, j]) - 0.5).abs()  # (B, P)
    valid = mask[:, i].bool() & mask[:, j].bool()
    certainty = certainty.masked_fill(~valid, float("inf"))
    best = certainty.argmin(dim=1)  # (B,)
    pairs = torch.stack([i[best], j[best]], dim=1)
    return pairs, certainty.gather(1, best[:, None]).squeeze(1)


def random_pairs(mask: Tensor, generator: torch.Generator) -> Tensor:
    """mask: (B, K) -> (B, 2) a uniformly random pair (i < j) of valid candidates per prompt.

    A prompt with fewer than 2 valid candidates gets (0, 1); callers drop such prompts."""
    i, j = _pair_index(mask.shape[1])
    valid = (mask[:, i].bool() & mask[:, j].bool()).float()  # (B, P)
    weights = valid + (valid.sum(1, keepdim=True) == 0).float()  # all-invalid rows: any pair
    choice = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    return torch.stack([i[choice], j[choice]], dim=1)


def least_certain(certainty: Tensor, n: int) -> Tensor:
    """certainty: (B,) -> indices of the n smallest finite values, least certain first (stable)."""
    order = torch.sort(certainty, stable=True).indices
    return order[torch.isfinite(certainty[order])][:n]
