"""Token rows of episodes: padding the rows of a batch, and an episode's transcript as the batch's text."""

from __future__ import annotations

import torch
from torch import Tensor

from feedbackrl.envs.multi_turn import EpisodeRecord


def left_pad(rows: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """(N, P) ids left-padded with `pad`, and their mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


def right_pad(rows: list[list[int]], pad: int) -> Tensor:
    """(N, T) ids right-padded with `pad` (T >= 1 even when every row is empty)."""
    out = torch.full((len(rows), max(1, max(len(r) for r in rows))), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def right_pad_float(rows: list[list[float]]) -> Tensor:
    """(N, K) float32 values right-padded with 0."""
    out = torch.zeros(len(rows), max(1, max(len(r) for r in rows)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def transcript_text(rec: EpisodeRecord) -> str:
    """The episode after its prompt as the batch's text: one "role: content" line per message."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in rec.messages[1:])
