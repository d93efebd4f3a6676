"""Batched sampling with a KV cache, returning exactly what the losses need.

We run our own decode loop rather than `model.generate` because training needs the sampled
tokens' log-probs, masks and a seeded `torch.Generator` (so a resumed run samples the same
tokens), and because HF `generate` spends most of its time on per-step bookkeeping for small
models. The model is any HF causal LM; the cache is the model's own (`past_key_values`).

Log-probs are those of the *tempered* distribution (logits / temperature) that tokens were
sampled from, before top-p filtering, matching `sequence_logprobs` used in training.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Rollout:
    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded; includes the EOS token when one was sampled
    completion_mask: Tensor  # (N, T) 1 on generated tokens (EOS included)
    logprobs: Tensor  # (N, T) log-prob of each sampled token, 0 on padding
    texts: list[str]  # decoded completions without special tokens
    truncated: Tensor  # (N,) bool: hit max_new_tokens without EOS


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> tuple[Tensor, Tensor]:
    enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def positions(mask: Tensor) -> Tensor:
    """Position ids for left-padded rows: 0 at the first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns until 5.40).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix with mass >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@torch.no_grad()
def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
             max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None) -> Rollout:
    """Sample one completion per prompt (repeat prompts for groups). Stops at EOS per row."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    n, eos, pad = prompt_ids.shape[0], tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    cache = {_cache_kwarg(model): DynamicCache(config=model.config)}  # updated in place by each forward
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                   use_cache=True, **cache).logits[:, -1]
    attn, pos = prompt_mask, positions(prompt_mask)[:, -1:]
    tokens, logps = [], []
    done = torch.zeros(n, dtype=torch.bool)
    for _ in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)
        if greedy:
            tok = logp_all.argmax(-1)
        else:
            probs = _top_p_filter(logp_all, top_p).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        logp = logp_all.gather(-1, tok[:, None]).squeeze(1)
        tok = tok.masked_fill(done, pad)
        tokens.append(tok)
        logps.append(logp.masked_fill(done, 0.0))
        done = done | (tok == eos)
        if bool(done.all()):
            break
        attn = torch.cat([attn, torch.ones(n, 1, dtype=attn.dtype)], dim=1)
        pos = pos + 1
        logits = model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos, use_cache=True,
                       **cache).logits[:, -1]
    model.train(was_training)
    completion_ids = torch.stack(tokens, dim=1)
    # a token counts if it was generated before (or is) the first EOS
    finished_before = torch.cumsum((completion_ids == eos).long(), dim=1) - (completion_ids == eos).long()
    completion_mask = (finished_before == 0).long()
    texts = tokenizer.batch_decode(completion_ids * completion_mask + pad * (1 - completion_mask),
                                   skip_special_tokens=True)
    truncated = ~(completion_ids == eos).any(dim=1)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask,
                   torch.stack(logps, dim=1) * completion_mask, texts, truncated)


def sequence_logprobs(model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      completion_mask: Tensor, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (N, T) of the completion tokens under `model` (one forward pass).

    Also returns per-token entropy (N, T) of the tempered distribution when asked.
    """
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    p = prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    logits = logits[:, p - 1 : -1].float() / temperature  # predictions for each completion token
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1) * completion_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * completion_mask
    return logprobs, entropy
