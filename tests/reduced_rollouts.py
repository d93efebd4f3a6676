"""Shared setup of the reduced-precision rollout tests (int8, bf16): sample, then rescore in float32."""

from __future__ import annotations

import torch

from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.rollout.generate import generate


def sample_and_rescore(model, tok, prompts: list[str], weights: str, temperature: float = 0.8, new_tokens: int = 12,
                       seed: int = 3):
    """A rollout sampled with `weights`, its completions' float32 log-probs, and the prompt+completion ids/mask."""
    ro = generate(model, tok, prompts, new_tokens, temperature=temperature,
                  generator=torch.Generator().manual_seed(seed), weights=weights)
    with torch.no_grad():
        fp32, _ = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                    temperature=temperature)
    ids, mask = torch.cat([ro.prompt_ids, ro.completion_ids], 1), torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    return ro, fp32, ids, mask
