"""How per-token losses become one scalar. The choice changes what GRPO optimises:

- `token_mean`: sum over every real token in the batch / number of real tokens (DAPO, Yu et
  al. 2025): each token weighs the same, so long answers are not diluted.
- `sequence_mean`: mean over each sequence's tokens, then mean over sequences (the original
  GRPO, Shao et al. 2024): each sequence weighs the same, which biases towards short correct and
  long wrong answers (Dr. GRPO's "length bias").
- `fixed_length_sum`: sum over all tokens / (N * max_len) with a constant max_len (Dr. GRPO,
  Liu et al. 2025): unbiased in length and independent of the batch's composition.

`num_tokens`/`num_sequences` let the loop pass global counts so that gradient accumulation over
micro-batches equals one big batch.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def token_mean(values: Tensor, mask: Tensor, num_tokens: float | None = None, max_len: int | None = None,
               num_sequences: float | None = None) -> Tensor:
    """(N, T) values and mask -> scalar sum(values*mask) / num_tokens (defaults to mask.sum())."""
    denom = mask.sum() if num_tokens is None else num_tokens
    return (values * mask).sum() / max(float(denom), 1.0)


def sequence_mean(values: Tensor, mask: Tensor, num_tokens: float | None = None, max_len: int | None = None,
                  num_sequences: float | None = None) -> Tensor:
    """(N, T) -> mean over sequences of each sequence's masked token mean."""
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    denom = mask.shape[0] if num_sequences is None else num_sequences
    return per_seq.sum() / denom


def fixed_length_sum(values: Tensor, mask: Tensor, num_tokens: float | None = None, max_len: int | None = None,
                     num_sequences: float | None = None) -> Tensor:
    """(N, T) -> sum(values*mask) / (N * max_len); max_len defaults to T."""
    n = mask.shape[0] if num_sequences is None else num_sequences
    return (values * mask).sum() / (n * (max_len if max_len is not None else mask.shape[1]))


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token_mean": token_mean,
    "sequence_mean": sequence_mean,
    "fixed_length_sum": fixed_length_sum,
}
