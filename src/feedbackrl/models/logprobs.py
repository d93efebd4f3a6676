"""The training forward: per-token log-probs of completions under a causal LM, and the checks that
decide whether a model can take the fast paths (`llama_forward.completion_logits` here, the fast
decoder in `rollout.generate`).

Every algorithm that trains on sampled or given completions (GRPO, RLOO, PPO, DPO, SFT, the reward
model's encoder) gets its log-probs from `sequence_logprobs`; generation lives in `rollout/`.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.llama_forward import completion_logits


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> tuple[Tensor, Tensor]:
    enc = tokenizer(prompts, padding=True, add_special_tokens=False, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def positions(mask: Tensor) -> Tensor:
    """Position ids for left-padded rows: 0 at the first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def accepts(model: PreTrainedModel, arg: str) -> bool:
    return arg in inspect.signature(model.forward).parameters



_FAST_MODEL_TYPES = ("llama", "qwen2")
_STATIC_ROPE = ("default", "linear", "llama3")  # RoPE tables that depend on the position only


def fast_path_ok(model: PreTrainedModel) -> bool:
    """True for unmodified Llama/Qwen2 models whose maths `_LlamaDecoder` reproduces exactly."""
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
    # adapters (LoRA), hooks or custom norms change the maths: those models take the generic path
    no_hooks = all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    return no_hooks and all(type(m) is nn.Linear for m in linears)


def train_fast_path_ok(model: PreTrainedModel) -> bool:
    """`llama_forward.completion_logits` reproduces the model's training forward: no dropout, no checkpointing."""
    # transformers 5.2x renamed is_gradient_checkpointing (now a deprecated alias) to is_activation_checkpointing
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    if getattr(model, name, False) or not fast_path_ok(model):
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


def token_logprobs(logits: Tensor, ids: Tensor, mask: Tensor, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """(N, T, V) logits of the positions that predict `ids` (N, T) -> the log-prob of each token under the
    tempered distribution (N, T), 0 where `mask` is 0, and that distribution's entropy (N, T) when asked.

    The one place log-probs are taken from logits for training (`sequence_logprobs`, PPO's
    `logprobs_and_values`); sampling takes them in `rollout.generate`, from the same tempered logits.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logprobs = logp_all.gather(-1, ids[..., None]).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logprobs, entropy
