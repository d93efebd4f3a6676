"""Splitting one step's rollout between workers so that the result is the single process's, row for row.

The single process samples N = B*G completions in one batch from one generator: every decode step
draws N uniforms, one per row. A worker given rows [a, b) runs `generate(..., rows=slice(a, b))` from
the same generator state: it pads the prompts as the whole batch does and draws the whole batch's
uniforms, keeping its own. `join_rollouts` puts the shares back together in row order (right-padding
the shorter completions), and `advance` moves the learner's generator past the draws the whole batch
would have made, so the next step starts where the single process's would.

Equality with one process then rests on each row's numbers not depending on which other rows share
its batch; `tests/scale/test_shards.py` checks that for our decoder on this machine.
"""

from __future__ import annotations

import torch
from torch import Tensor

from feedbackrl.rollout.generate import Rollout


def shard_rows(n: int, workers: int) -> list[slice]:
    """Rows 0..n-1 split into `workers` contiguous slices, the first ones one row longer when n % workers."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    base, extra = divmod(n, workers)
    out, start = [], 0
    for k in range(workers):
        stop = start + base + (1 if k < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out


def _right_pad(t: Tensor, width: int, value: int | float) -> Tensor:
    """(n, T) -> (n, width), `value` in the new columns."""
    if t.shape[1] == width:
        return t
    return torch.cat([t, t.new_full((t.shape[0], width - t.shape[1]), value)], dim=1)


def join_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Shares in row order -> the whole batch's Rollout (completions right-padded to the longest share)."""
    width = max(p.completion_ids.shape[1] for p in parts)
    return Rollout(
        prompt_ids=torch.cat([p.prompt_ids for p in parts]),
        prompt_mask=torch.cat([p.prompt_mask for p in parts]),
        completion_ids=torch.cat([_right_pad(p.completion_ids, width, pad_id) for p in parts]),
        completion_mask=torch.cat([_right_pad(p.completion_mask, width, 0) for p in parts]),
        logprobs=torch.cat([_right_pad(p.logprobs, width, 0.0) for p in parts]),
        texts=[t for p in parts for t in p.texts],
        truncated=torch.cat([p.truncated for p in parts]),
    )


def advance(generator: torch.Generator, decode_steps: int, rows: int) -> None:
    """Draw what `generate` draws for `rows` rows over `decode_steps` sampled tokens (one uniform each)."""
    for _ in range(decode_steps):
        torch.rand(rows, 1, generator=generator)
