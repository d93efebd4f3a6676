"""The training forward: per-token log-probs of completions under a causal LM, and the checks that
decide whether a model can take the fast paths (`llama_forward.completion_logits` here, the fast
decoder in `rollout.generate`).

Every algorithm that trains on sampled or given completions (GRPO, RLOO, PPO, DPO, SFT, the reward
model's encoder) gets its log-probs from `sequence_logprobs`; generation lives in `rollout/`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.llama_forward import completion_logits
from feedbackrl.models.lora import decodable, is_lora, is_lora_linear


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> tuple[Tensor, Tensor]:
    enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def encode_completions(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[Tensor, Tensor]:
    """Right-padded completion ids with EOS appended, and their mask."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(len(x) for x in ids)
    out = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        out[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return out, mask


def positions(mask: Tensor) -> Tensor:
    """Position ids for left-padded rows: 0 at the first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def accepts(model: PreTrainedModel, arg: str) -> bool:
    return arg in inspect.signature(model.forward).parameters



_FAST_MODEL_TYPES = ("llama", "qwen2")
_STATIC_ROPE = ("default", "linear", "llama3")  # RoPE tables that depend on the position only


def fast_path_ok(model: PreTrainedModel) -> bool:
    """True for Llama/Qwen2 models whose maths `_LlamaDecoder` reproduces exactly (LoRA layers included:
    the decoder merges them into its weight copy, `models.lora.effective_weight`)."""
    model = decodable(model)
    cfg = model.config
    inner = getattr(model, "model", None)
    # under autocast the matmuls would run in bf16/fp16 against our float32 buffers: the model's own forward handles it
    if torch.is_autocast_enabled(model.device.type):
        return False
    if cfg.model_type not in _FAST_MODEL_TYPES or inner is None or not hasattr(inner, "layers"):
        return False
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if rope not in _STATIC_ROPE or set(layer_types) != {"full_attention"} or cfg.hidden_act != "silu":
        return False
    # float32 only: transformers' RMSNorm computes in float32 whatever the dtype, F.rms_norm does not
    head = model.get_output_embeddings()
    if model.dtype != torch.float32 or type(head) is not nn.Linear or head.bias is not None:
        return False
    linears = [getattr(m, name) for layer in inner.layers
               for m, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                (layer.mlp, ("gate_proj", "up_proj", "down_proj"))) for name in names]
    # hooks, other adapters or custom norms change the maths: those models take the generic path
    no_hooks = all(_harmless_hooks(m) for m in model.modules())
    return no_hooks and all(type(m) is nn.Linear or is_lora_linear(m) for m in linears)


def _harmless_hooks(m: nn.Module) -> bool:
    """No hooks, or only the one gradient checkpointing puts on the input embedding (it marks the embedding's
    output as requiring grad, which changes no value: decoding runs without grad)."""
    hooks = [*m._forward_hooks.values(), *m._forward_pre_hooks.values()]
    return all(getattr(h, "__name__", "") == "make_inputs_require_grads" for h in hooks)


def train_fast_path_ok(model: PreTrainedModel) -> bool:
    """`llama_forward.completion_logits` reproduces the model's training forward: no dropout, no checkpointing."""
    # transformers 5.2x renamed is_gradient_checkpointing (now a deprecated alias) to is_activation_checkpointing
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    # LoRA trains through peft's forward: the fast forward reads the base weights only
    if is_lora(model) or getattr(model, name, False) or not fast_path_ok(model):
        return False
    return not (model.training and getattr(model.config, "attention_dropout", 0.0))


def sequence_logprobs(model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      completion_mask: Tensor, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (N, T) of the completion tokens under `model` (one forward pass).

    Also returns per-token entropy (N, T) of the tempered distribution when asked. Models that the
    fast decode path accepts train through `llama_forward.completion_logits` (same maths, fewer
    passes over memory), unless dropout or gradient checkpointing is on; others through their own forward.
    """
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    # Completion padding sits after the real tokens, so causal attention never lets a real token see
    # it: masking the prompt's left padding alone gives the same real-token logits, and an all-ones
    # mask (no prompt padding) lets the model skip building a 4-D mask and use causal attention.
    mask = torch.cat([prompt_mask, torch.ones_like(completion_mask)], dim=1)
    t = completion_ids.shape[1]
    if train_fast_path_ok(model) and bool(prompt_mask.any(1).all()):  # an empty prompt: HF's forward, as in generate
        logits = completion_logits(model, ids, mask, positions(mask), t)
    else:
        # only the last T + 1 positions predict completion tokens: skip the LM head on the rest of the prompt
        keep = {"logits_to_keep": t + 1} if accepts(model, "logits_to_keep") else {}
        # use_cache=False: HF models default to building a KV cache even in a training forward
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False, **keep)
        logits = out.logits[:, -t - 1 : -1]  # predictions for each completion token
    return token_logprobs(logits, completion_ids, completion_mask, temperature, with_entropy)


LOGPROB_BLOCK_ROWS = 8  # positions per block of the fused log-softmax: (8, V) floats, resident in cache


def _row_blocks(x: Tensor, block: int) -> list[tuple[int, Tensor]]:
    """(first flat row, a (r, V) view) covering every position of `x` (..., V) in order, `block` rows at most each:
    views into `x` itself, also when `x` is a slice along T of a larger tensor (HF's logits[:, -T-1:-1])."""
    v = x.shape[-1]
    if x.is_contiguous():
        flat = x.view(-1, v)
        return [(a, flat[a : a + block]) for a in range(0, flat.shape[0], block)]
    seqs = x.reshape(-1, *x.shape[-2:]) if x.dim() > 2 else x[None]
    t = seqs.shape[1]
    return [(n * t + a, seqs[n][a : a + block]) for n in range(seqs.shape[0]) for a in range(0, t, block)]


class _TokenLogprobs(torch.autograd.Function):
    """logits (..., V), ids (...) -> log softmax(logits / temperature)[id] (...) and the entropy of that
    distribution (...; not differentiable), in one pass over the logits per block of positions.

    Per block of `block` positions (resident in cache): z = logits / temperature, m = max z,
    s = exp(z - m), S = sum s, lse = m + log S; the log-prob is z[id] - lse and the entropy
    lse - sum(s z) / S. Only lse (one float per position) is saved; the backward rebuilds
    p = exp(z - lse) block by block into the gradient buffer, where d logp / d z = onehot(id) - p.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, ids: Tensor, temperature: float, with_entropy: bool,
                block: int) -> tuple[Tensor, Tensor]:
        flat_ids = ids.reshape(-1)
        n = flat_ids.shape[0]
        # float32 at least (bf16 logits are reduced in float32); float64 logits keep their precision
        cdt = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        lp = torch.empty(n, dtype=cdt, device=logits.device)
        ent = torch.empty(n if with_entropy else 0, dtype=cdt, device=logits.device)
        for a, blk in _row_blocks(logits, block):
            r = blk.shape[0]
            z = blk.to(cdt) if temperature == 1.0 else blk.to(cdt) / temperature
            m = z.amax(-1, keepdim=True)
            s = torch.sub(z, m).exp_()
            total = s.sum(-1)
            out = lse[a : a + r]
            torch.add(m.squeeze(-1), total.log(), out=out)
            torch.sub(z.gather(-1, flat_ids[a : a + r, None]).squeeze(-1), out, out=lp[a : a + r])
            if with_entropy:
                torch.sub(out, torch.linalg.vecdot(s, z).div_(total), out=ent[a : a + r])
        ctx.save_for_backward(logits, flat_ids, lse)
        ctx.temperature, ctx.block = temperature, block
        ent = ent.view(ids.shape) if with_entropy else ent
        ctx.mark_non_differentiable(ent)
        return lp.view(ids.shape), ent

    @staticmethod
    def backward(ctx: Any, grad_lp: Tensor, grad_ent: Tensor) -> tuple[Tensor | None, ...]:
        logits, flat_ids, lse = ctx.saved_tensors
        temperature, v = ctx.temperature, logits.shape[-1]
        cdt = lse.dtype
        g = grad_lp.reshape(-1).to(cdt)
        if temperature != 1.0:
            g = g / temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat = grad.view(-1, v)
        for a, blk in _row_blocks(logits, ctx.block):
            r = blk.shape[0]
            z = blk.to(cdt) if temperature == 1.0 else blk.to(cdt) / temperature
            gb = g[a : a + r, None]
            # float32 or float64 logits: p is built in the gradient buffer itself, no copy
            p = grad_flat[a : a + r] if grad.dtype == cdt else torch.empty_like(z)
            torch.sub(z, lse[a : a + r, None], out=p).exp_().mul_(gb.neg())  # -g p
            p.scatter_add_(-1, flat_ids[a : a + r, None], gb)  # + g onehot(id)
            if p.data_ptr() != grad_flat[a : a + r].data_ptr():
                grad_flat[a : a + r] = p
        return grad, None, None, None, None


def token_logprobs(logits: Tensor, ids: Tensor, mask: Tensor, temperature: float = 1.0,
                   with_entropy: bool = False, block_rows: int = LOGPROB_BLOCK_ROWS) -> tuple[Tensor, Tensor | None]:
    """(N, T, V) logits of the positions that predict `ids` (N, T) -> the log-prob of each token under the
    tempered distribution (N, T), 0 where `mask` is 0, and that distribution's entropy (N, T) when asked.

    The one place log-probs are taken from logits for training (`sequence_logprobs`, PPO's
    `logprobs_and_values`); sampling takes them in `rollout.generate`, from the same tempered logits.

    One fused pass (`_TokenLogprobs`) per block of `block_rows` positions gives the log-prob and the entropy
    together, and the backward writes the logits' gradient from the saved log-normaliser: neither pass holds a
    second (N, T, V) tensor beside the logits and their gradient (with a 49k vocabulary that tensor is most of
    a step's memory), and each block's passes over the vocabulary run in cache. The same values as
    `log_softmax(logits / temperature).gather(ids)` up to float32 rounding (tests/models/test_token_logprobs.py).
    """
    lp, ent = _TokenLogprobs.apply(logits, ids, float(temperature), with_entropy, block_rows)
    mask = mask.to(lp.dtype)
    return lp * mask, (ent * mask if with_entropy else None)
