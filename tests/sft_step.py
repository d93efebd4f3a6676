"""One SFT warm-start step on a task, checked against the loss the untrained policy has on what it was fed."""

from __future__ import annotations

import copy

import torch


def first_sft_loss(task, tokenizer, monkeypatch) -> tuple[float, float, int]:
    """One SFT warm-start step on `task`: (the loss it reports, the SFT loss of the untrained policy on the
    demonstrations `task.demonstrate` wrote during it, how many it wrote)."""
    from feedbackrl.algos.sft import sft_loss
    from feedbackrl.config import SFTConfig
    from feedbackrl.log import MemorySink
    from feedbackrl.models.logprobs import encode_completions, encode_prompts, sequence_logprobs
    from feedbackrl.models.tiny import build_model
    from feedbackrl.train.sft import sft_warmstart

    written = []
    real = task.demonstrate
    monkeypatch.setattr(task, "demonstrate", lambda p, rng: written.append((p, real(p, rng))) or written[-1][1])
    model = build_model(tokenizer, "tiny", seed=0)
    before = copy.deepcopy(model).train()
    got = sft_warmstart(model, tokenizer, task, SFTConfig(steps=1, batch_size=4, warmup_steps=0), 0, MemorySink())
    p_ids, p_mask = encode_prompts(tokenizer, [p.prompt for p, _ in written])
    c_ids, c_mask = encode_completions(tokenizer, [d for _, d in written])
    with torch.no_grad():
        want = sft_loss(sequence_logprobs(before, p_ids, p_mask, c_ids, c_mask)[0], c_mask).item()
    return got["loss/sft_final"], want, len(written)
