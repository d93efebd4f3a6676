"""Batched sampling with a KV cache, returning exactly what the losses need.

We run our own decode loop rather than `model.generate` because training needs the sampled
tokens' log-probs, masks and a seeded `torch.Generator` (so a resumed run samples the same
tokens), and because HF `generate` spends most of its time on per-step bookkeeping for small
models. The model is any HF causal LM.

Llama-family models (Llama, Qwen2 without sliding windows; float32) take a fast path,
`_LlamaDecoder`: the same maths as `LlamaDecoderLayer`, run straight from the model's weights with
a KV cache preallocated for the whole generation, q/k/v and gate/up fused into one matmul each,
RoPE tables and the attention mask built once. Per decode step the HF path grows its cache with
`torch.cat` (copying it all, O(T^2) memory traffic) and rebuilds masks and position embeddings
through several layers of wrappers; for small models that bookkeeping, not the maths, is the cost
(see docs/performance.md). Decode steps (one token per row) hand RoPE, the cache append and the
attention to a small C kernel (`native.py`, built on first use) where a C compiler exists; without
one, or with FEEDBACKRL_NATIVE=0, the same steps run as PyTorch ops. Any other model runs through
its own `forward` with a `DynamicCache`.

Log-probs are those of the *tempered* distribution (logits / temperature) that tokens were
sampled from, before top-p filtering and EOS suppression (`min_new_tokens`), matching
`sequence_logprobs` used in training.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.chat import end_token_ids
from feedbackrl.models.llama_forward import cat_or_none, rope_pair_rows, shared_prompts
from feedbackrl.models.logprobs import accepts, encode_prompts, fast_path_ok, positions
from feedbackrl.models.lora import decodable, effective_weight, is_lora_linear
from feedbackrl.rollout import bf16, int8, native

# (rows in the whole batch, the slice of them this call generates): see `generate(rows=...)`
Rows = tuple[int, slice]


@dataclass
class Rollout:
    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded; includes the EOS token when one was sampled
    completion_mask: Tensor  # (N, T) 1 on generated tokens (EOS included)
    logprobs: Tensor  # (N, T) log-prob of each sampled token, 0 on padding
    texts: list[str]  # decoded completions without special tokens
    truncated: Tensor  # (N,) bool: hit max_new_tokens without EOS


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns until 5.40).
    return "cache" if accepts(model, "cache") else "past_key_values"


def _top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix with mass >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class _HFDecoder:
    """Any causal LM through its own forward and a DynamicCache. Call with (N, S) tokens and positions."""

    def __init__(self, model: PreTrainedModel, prompt_mask: Tensor, max_new_tokens: int) -> None:
        self.model, self.cache = model, {_cache_kwarg(model): DynamicCache(config=model.config)}
        n, p = prompt_mask.shape
        self.mask = torch.cat([prompt_mask, prompt_mask.new_ones(n, max_new_tokens)], dim=1)  # built once
        self.seen = 0

    def prefill(self, tokens: Tensor, pos: Tensor) -> Tensor:
        return self(tokens, pos)

    def __call__(self, tokens: Tensor, pos: Tensor) -> Tensor:
        self.seen += tokens.shape[1]
        return self.model(input_ids=tokens, attention_mask=self.mask[:, : self.seen], position_ids=pos,
                          use_cache=True, **self.cache).logits[:, -1]


def _empty_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """An uninitialised CPU tensor in a fresh anonymous mapping that Linux may back with 2 MB pages.

    The KV cache is larger than the caches of this CPU and every decode step reads it all, a few KB
    per (row, head) at a time: with 4 KB pages most of those reads also miss the TLB. Transparent
    huge pages (granted on request where the system's setting is `madvise`, the common default)
    make the decode step ~1.1x faster on the tiny model. Elsewhere (and on a GPU) this is a plain `torch.empty`.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < 4 << 20 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype, device=device)
    # private (a shared anonymous mapping is shmem, which THP leaves alone) and untouched: pages come on first write
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # THP compiled out of this kernel: 4 KB pages
        buf.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor keeps the mapping alive


def _unaliased(w: Tensor) -> Tensor:
    """`w.t()` for a 2-D `w` (out, in), copied row-major (in, out) with a row stride that is not a multiple of 1 KB.

    MKL reads a weight (in, out) row by row at M = 64; when a row is a multiple of 1-4 KB long
    (out = 512, 1536, 3072 floats) those rows map to the same few L1/L2 cache sets and evict each
    other. A row padded by 64 bytes (the tensor is a view of a wider buffer) spreads them over
    all sets: the same values and the same products, only the memory layout differs. The transpose
    goes through `contiguous()` first, which copies 2-D transposes tile by tile (a strided copy
    straight into the padded buffer is ~2x slower: this runs for every weight on every call).
    """
    t = w.t().contiguous()
    rows, cols = t.shape
    if (cols * t.element_size()) % 1024 != 0:
        return t
    return torch.empty(rows, cols + 16, dtype=t.dtype, device=t.device)[:, :cols].copy_(t)


class _Fp32Matmuls:
    """The decoder's matmuls in float32 on weights stored (in, out) (`_unaliased`); biases added by addmm."""

    @staticmethod
    def prepare(weight: Tensor, bias: Tensor | None, in_scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """weight (out, in), bias (out,), in_scale (in,): the RMSNorm weight folded into the weight's columns."""
        return _unaliased(weight if in_scale is None else weight.mul_(in_scale)), bias

    @staticmethod
    def mm(y: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        return torch.mm(y, w) if b is None else torch.addmm(b, y, w)

    @staticmethod
    def mm_into(out: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> None:
        if b is None:
            torch.mm(y, w, out=out)
        else:
            torch.addmm(b, y, w, out=out)

    @staticmethod
    def mm_add(x: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> None:  # x += y @ w + b, in place
        x.addmm_(y, w)
        if b is not None:
            x += b


class _Int8Matmuls:
    """The decoder's matmuls on int8 weights and dynamically quantised int8 activations (`rollout/int8.py`)."""

    def __init__(self) -> None:
        self.reduce = int8.reduce_range()

    @staticmethod
    def prepare(weight: Tensor, bias: Tensor | None, in_scale: Tensor | None = None) -> tuple[int8.Linear, None]:
        return int8.Linear(weight, bias, in_scale), None  # the bias is packed with the weight

    def mm(self, y: Tensor, w: int8.Linear, b: None) -> Tensor:
        return w(y, self.reduce)

    def mm_into(self, out: Tensor, y: Tensor, w: int8.Linear, b: None) -> None:
        out.copy_(w(y, self.reduce))

    def mm_add(self, x: Tensor, y: Tensor, w: int8.Linear, b: None) -> None:
        x += w(y, self.reduce)


class _Bf16Matmuls:
    """The decoder's matmuls on bf16 weights (out, in) and bf16 activations, float32 accumulation (`rollout/bf16.py`).

    Outputs are rounded to bf16 by the kernel and join the float32 residual stream, biases added in float32."""

    @staticmethod
    def prepare(weight: Tensor, bias: Tensor | None, in_scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return bf16.prepare(weight, in_scale), None if bias is None else bias.detach().float()

    @staticmethod
    def mm(y: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        out = bf16.mm(y, w).float()
        return out if b is None else out.add_(b)

    @staticmethod
    def mm_into(out: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> None:
        out.copy_(bf16.mm(y, w))
        if b is not None:
            out += b

    @staticmethod
    def mm_add(x: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> None:  # x += y @ w.T + b, in place
        x += bf16.mm(y, w)
        if b is not None:
            x += b


_Matmuls = _Fp32Matmuls | _Int8Matmuls | _Bf16Matmuls
# rollout.weights: what the fast decoder's matmuls run on
ROLLOUT_WEIGHTS: dict[str, Callable[[], _Matmuls]] = {"fp32": _Fp32Matmuls, "int8": _Int8Matmuls,
                                                      "bf16": _Bf16Matmuls}


# rollout weights whose prepared copies (`_prepared`) outlive a call of `generate`: int8 only. Measured on
# SmolLM2-135M (docs/performance.md): preparing int8 weights takes ~3 s, the check that kept ones are current
# 0.2-0.3 s; a bf16 cast 0.1-0.4 s, about the check's cost, and keeping it would hold half the model in memory.
CACHED_WEIGHTS = ("int8",)
_optimizer_steps = 0  # optimizer steps taken in this process, by any optimizer


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_step)
# model -> {weights: (what the weights were, the prepared copies)}; an entry goes with its model
_PREPARED: weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[tuple, Tensor, tuple]]] = weakref.WeakKeyDictionary()


def _weights_key(model: nn.Module) -> tuple[tuple, Tensor]:
    """What the decoder's weights are now, to tell whether copies prepared from them are still theirs.

    Any difference rebuilds: the optimizer steps taken in this process (fused AdamW updates parameters in place
    without bumping their version counters); every parameter's storage, version counter, dtype and shape
    (in-place edits, `load_state_dict`, swapped storage); the LoRA layers' adapter state; and two checksums of
    every parameter's values, for writes no counter sees (through `.data`, or another view of the storage): the
    64-bit XOR of its bits (`torch.hash_tensor`: any single changed value changes it) and its float32 sum (which
    a uniform change, e.g. a scaled norm weight of equal values, moves where an XOR of equal values cancels).
    A write that no counter sees and that keeps both checksums (two values swapped through `.data`) is not
    caught. The checksums read every weight twice, far less than preparing them.
    """
    params = [p.detach() for p in model.parameters()]
    lora = tuple((m.disable_adapters, tuple(m.active_adapters), tuple(sorted(m.scaling.items())))
                 for m in model.modules() if is_lora_linear(m))
    meta = (_optimizer_steps, lora, tuple((p.data_ptr(), p._version, p.dtype, tuple(p.shape)) for p in params))
    hashes = torch.stack([torch.hash_tensor(p) for p in params]).view(torch.int64)
    sums = torch.stack([p.sum(dtype=torch.float32) for p in params]).view(torch.int32).long()  # bits: NaN == NaN
    return meta, torch.stack([hashes, sums])


def _prepared(model: nn.Module, weights: str, build: Callable[[], tuple]) -> tuple:
    """`build()`'s prepared weights for `model`, reused across calls while the weights stay the same.

    Rollouts follow training steps: after each optimizer step the first call rebuilds (once), and every
    further call until the next step (sampling in chunks, evaluation) reuses that build. Memory: the copies
    stay alive between calls (int8: its int8 weights plus the float32 weights the outlier channels read)."""
    meta, hashes = _weights_key(model)
    kept = _PREPARED.setdefault(model, {}).get(weights)
    if kept is not None and kept[0] == meta and torch.equal(kept[1], hashes):
        return kept[2]
    _PREPARED[model].pop(weights, None)  # the stale copies go before the new ones are built
    built = build()
    _PREPARED[model][weights] = (meta, hashes, built)
    return built


class _LlamaDecoder:
    """`LlamaForCausalLM.forward` with a preallocated KV cache (N, Hkv, P + T, D) per layer.

    The same maths as transformers' Llama/Qwen2 modelling code: RMSNorm, RoPE via rotate_half,
    softmax attention, SiLU-gated MLP, residuals. Differences are float rounding only (fused
    matmuls, norm weights folded into the next matmul); tests/rollout check greedy decoding
    against HF `generate`.

    A decode step for a small model is a few dozen small ops, so the cost is per op (dispatch,
    allocation, cache misses): activations are 2-D (N * S, C) and every matmul reads a weight stored
    transposed and contiguous, (in, out) (MKL is ~2x slower on the (out, in) layout for the
    down projection); each RMSNorm is one per-row scale r = rsqrt(sum(x^2) + C * eps) with
    sqrt(C) * w folded into the following matmul's weight; residuals are added by the matmul
    itself (`addmm_`); RoPE writes the rotated q and k back into the qkv output so one copy puts
    k and v into the cache. `weights` (`ROLLOUT_WEIGHTS`) picks what the matmuls run on: float32, int8
    weights and activations (`rollout/int8.py`) or bf16 ones (`rollout/bf16.py`), everything else unchanged.
    """

    def __init__(self, model: PreTrainedModel, prompt_mask: Tensor, max_new_tokens: int,
                 weights: str = "fp32") -> None:
        cfg, inner = model.config, model.model
        self.mats = mats = ROLLOUT_WEIGHTS[weights]()
        n, p = prompt_mask.shape
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim**-0.5  # as LlamaAttention.scaling
        self.gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        self.embed = inner.embed_tokens.weight
        c = self.embed.shape[1]
        # rms_norm(x) * w @ W.T == r * x @ (sqrt(C) * w[:, None] * W.T) with r = rsqrt(sum(x^2) + C * eps)
        dev = self.embed.device
        self.c_eps = torch.tensor(c * cfg.rms_norm_eps, dtype=self.embed.dtype, device=dev)

        def folded(norm: Tensor, *linears: nn.Linear, rows: Tensor | None = None) -> tuple:
            w = torch.cat([effective_weight(m) for m in linears])  # (out, in): reordering rows is a cheap gather
            bias = cat_or_none([m.bias for m in linears])
            if rows is not None:
                w, bias = w.index_select(0, rows), None if bias is None else bias[rows]
            return mats.prepare(w, bias, norm * c**0.5)

        def plain(m: nn.Linear) -> tuple:
            return mats.prepare(effective_weight(m), m.bias)

        # RoPE as one complex multiply: within each q/k head, output columns reordered so that the pair
        # rotate_half mixes, (i, i + D/2), is adjacent: (x_i + j x_{i+D/2}) * (cos_i + j sin_i) is
        # rotate_half's RoPE. q.k is a sum over the head dim, so the same reorder of q and k (the cache
        # holds reordered keys) leaves the scores unchanged; v is not reordered.
        d, half = self.head_dim, self.head_dim // 2

        def build() -> tuple[list[tuple], Any, Any]:
            rows = rope_pair_rows(self.heads, self.kv_heads, d, dev)
            layers = []
            for layer in inner.layers:  # copies of the weights in the matmuls' layout
                at, mlp = layer.self_attn, layer.mlp
                # (w_qkv, b_qkv, w_o, b_o, w_gu, b_gu, w_down, b_down)
                layers.append((*folded(layer.input_layernorm.weight, at.q_proj, at.k_proj, at.v_proj, rows=rows),
                               *plain(at.o_proj), *folded(layer.post_attention_layernorm.weight, mlp.gate_proj,
                                                          mlp.up_proj), *plain(mlp.down_proj)))
            return layers, *folded(inner.norm.weight, model.get_output_embeddings())

        # float32 and bf16 copies are rebuilt every call; int8 ones are kept until the weights change
        self.layers, self.lm_head, self.lm_bias = (_prepared(model, weights, build) if weights in CACHED_WEIGHTS
                                                   else build())
        total = p + max_new_tokens
        cache = _empty_huge_pages((len(self.layers), 2, n, self.kv_heads, total, d), self.embed.dtype, dev)
        self.cache = [(c, c[0], c[1]) for c in cache]  # per layer: (k and v, k, v), each (N, Hkv, P + T, D)
        # RoPE for every position this call can reach, from the model's own rotary module
        cos, sin = (t[0] for t in inner.rotary_emb(self.embed, torch.arange(total, device=dev)[None]))
        if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
            raise ValueError("RoPE tables are not cat(freqs, freqs): fast_path_ok should have refused this model")
        self.rot = torch.complex(cos[:, :half], sin[:, :half])  # (P + T, D/2)
        # Attention masks, built once. Without prompt padding every key is visible: no mask at all,
        # which is exact and lets SDPA skip reading one (about 2x faster attention for one query).
        self.prompt_mask = prompt_mask
        self.padded = not bool(prompt_mask.all())
        keep = torch.cat([prompt_mask.bool(), prompt_mask.new_ones(n, max_new_tokens, dtype=torch.bool)], dim=1)
        self.keep = keep[:, None, None, :]  # (N, 1, 1, P + T): key j visible to every query
        causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        # prefill: causal and real keys; a pad query sees itself so its row is never all -inf (no NaN)
        eye = torch.eye(p, dtype=torch.bool, device=dev)
        self.prefill_mask = (causal & (prompt_mask.bool()[:, None, :] | eye))[:, None]
        self.seen = 0
        # decode steps (one token per row) run RoPE, the cache append and attention in one C kernel where it
        # builds (native.py); it writes into fixed buffers, refilled every step: qkv, each row's RoPE, output
        self.native = None
        if (native.available() and dev.type == "cpu" and total <= native.MAX_CACHE and d <= native.MAX_HEAD_DIM
                and d % 2 == 0):
            h, hk = self.heads, self.kv_heads
            self.qkv_buf = torch.empty(n, (h + 2 * hk) * d, dtype=self.embed.dtype)
            self.rot_buf = torch.empty(n, half, dtype=self.rot.dtype)
            self.att_buf = torch.empty(n, h * d, dtype=self.embed.dtype)
            self.native = native.DecodeAttention(self.qkv_buf, self.rot_buf, [(k, v) for _, k, v in self.cache],
                                                 keep.contiguous() if self.padded else None, self.att_buf, h,
                                                 self.scale)

    def _mask(self, start: int, rows: Tensor | None) -> dict[str, Tensor | bool]:
        if start == 0:
            if not self.padded:
                return {"is_causal": True}
            return {"attn_mask": self.prefill_mask if rows is None else self.prefill_mask[rows]}
        return {"attn_mask": self.keep[..., : self.seen]} if self.padded else {}

    def prefill(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """The prompts (N, P) -> logits (N, V), each distinct prompt run once (GRPO repeats every prompt G times).

        A prompt's keys, values and last logits do not depend on the row it sits in: the distinct rows
        run through the layers and their keys and values are copied to every row of the cache.
        """
        shared = shared_prompts(tokens, self.prompt_mask, tokens.shape[1])
        if shared is None:
            return self(tokens, pos)
        first, inverse = shared
        return self(tokens[first], pos[first], (first, inverse))[inverse]

    def _normed(self, x: Tensor) -> Tensor:
        """x * rsqrt(sum(x^2) + C * eps) per row: RMSNorm up to the sqrt(C) * w folded into the next matmul."""
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return x * torch.addcmul(self.c_eps, r, r).rsqrt_()

    def __call__(self, tokens: Tensor, pos: Tensor, distinct: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Logits (n, V) at the last of s new positions for (n, s) tokens. `distinct` (prefill only): tokens are
        the distinct prompts, rows `first` of the batch, and `inverse` maps every batch row to its prompt."""
        n, s = tokens.shape
        if s == 1 and self.native is not None and self.seen > 0 and distinct is None:
            return self._native_step(tokens, pos)
        start, self.seen = self.seen, self.seen + s
        h, hk, d = self.heads, self.kv_heads, self.head_dim
        if distinct is not None and start != 0:
            raise ValueError("distinct prompts are for the prefill only")
        mask = self._mask(start, None if distinct is None else distinct[0])
        rot = self.rot[pos].view(n * s, 1, d // 2)
        x = F.embedding(tokens.reshape(n * s), self.embed)  # (N * S, C)
        for (w_qkv, b_qkv, w_o, b_o, w_gu, b_gu, w_down, b_down), (kv, k, v) in zip(self.layers, self.cache,
                                                                                   strict=True):
            qkv = self.mats.mm(self._normed(x), w_qkv, b_qkv)  # (N * S, (H + 2 Hkv) D)
            torch.view_as_complex(qkv[:, : (h + hk) * d].view(n * s, h + hk, d // 2, 2)).mul_(rot)  # RoPE, in place
            # k and v sit side by side in qkv: one copy into the cache (2, N, Hkv, S, D)
            new_kv = qkv[:, h * d :].view(n, s, 2, hk, d)
            if distinct is None:
                kv[:, :, :, start : self.seen] = new_kv.permute(2, 0, 3, 1, 4)
                keys, values = k[:, :, : self.seen], v[:, :, : self.seen]
            else:  # every row gets its prompt's keys and values; the distinct prompts attend to their own
                kv[:, :, :, : self.seen] = new_kv[distinct[1]].permute(2, 0, 3, 1, 4)
                keys, values = new_kv[:, :, 0].transpose(1, 2), new_kv[:, :, 1].transpose(1, 2)
            q = qkv[:, : h * d].view(n, s, h, d).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, keys, values, scale=self.scale, **mask, **self.gqa)
            self._after_attention(x, att.transpose(1, 2).reshape(n * s, h * d), w_o, b_o, w_gu, b_gu, w_down, b_down)
        return self.mats.mm(self._normed(x.view(n, s, -1)[:, -1]), self.lm_head, self.lm_bias)

    def _after_attention(self, x: Tensor, att: Tensor, w_o: Tensor, b_o: Tensor | None, w_gu: Tensor,
                         b_gu: Tensor | None, w_down: Tensor, b_down: Tensor | None) -> None:
        """The rest of a layer, into x in place: x += att @ w_o (+ b_o), then x += the SiLU-gated MLP of norm(x)."""
        self.mats.mm_add(x, att, w_o, b_o)
        gu = self.mats.mm(self._normed(x), w_gu, b_gu)
        inter = gu.shape[1] // 2
        self.mats.mm_add(x, F.silu(gu[:, :inter], inplace=True).mul_(gu[:, inter:]), w_down, b_down)

    def _native_step(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """`__call__` for one token per row, attention by the C kernel (same maths, float rounding only)."""
        if tokens.shape[0] != self.qkv_buf.shape[0]:
            raise ValueError(f"decoder built for {self.qkv_buf.shape[0]} rows, stepped with {tokens.shape[0]}")
        at, self.seen = self.seen, self.seen + 1
        torch.index_select(self.rot, 0, pos.view(-1), out=self.rot_buf)
        x = F.embedding(tokens.view(-1), self.embed)  # (N, C)
        for i, (w_qkv, b_qkv, w_o, b_o, w_gu, b_gu, w_down, b_down) in enumerate(self.layers):
            self.mats.mm_into(self.qkv_buf, self._normed(x), w_qkv, b_qkv)
            self.native(i, at)  # RoPE on q and k, k and v into the cache at `at`, attention into att_buf
            self._after_attention(x, self.att_buf, w_o, b_o, w_gu, b_gu, w_down, b_down)
        return self.mats.mm(self._normed(x), self.lm_head, self.lm_bias)


def _pick(logits: Tensor, temperature: float, top_p: float, greedy: bool, ban: Tensor | None,
          generator: torch.Generator | None, rows: Rows | None = None) -> tuple[Tensor, Tensor]:
    """(N, V) logits -> sampled tokens (N,) and their log-probs under logits / temperature (N,)."""
    # float32 at least (bf16 logits are reduced in float32), float64 kept: as the training forward's token_logprobs
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    scaled = z if greedy or temperature == 1.0 else z / temperature
    logp_all = torch.log_softmax(scaled, dim=-1)
    scores = logp_all
    if ban is not None:  # end tokens suppressed (min_new_tokens); the reported log-prob ignores the ban
        scores = logp_all.index_fill(-1, ban, float("-inf"))
    if greedy:
        tok = scores.argmax(-1)
    else:
        probs = logp_all.exp() if scores is logp_all and top_p >= 1.0 else _top_p_filter(scores, top_p).softmax(-1)
        tok = _sample(probs, generator, rows)
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(1)


def _sample(probs: Tensor, generator: torch.Generator | None, rows: Rows | None = None) -> Tensor:
    """One draw per row of (N, V) probabilities by inverting the CDF with one uniform per row.

    `torch.multinomial` draws N*V exponentials per call; this draws N uniforms (4x faster here).
    The draw u is in (0, total]; the first token whose CDF reaches it is picked, so zero-probability
    tokens (top-p, banned EOS) are never picked and u == total still lands on a real token.
    The uniforms come from `generator` on its own device (a CPU generator drives a GPU model: a seed
    draws the same uniforms wherever the model runs). With `rows` = (total, slice), this is a share of a
    batch of `total` rows: the whole batch's uniforms are drawn and the share's kept, so the share samples
    exactly what the whole batch would have for these rows.
    """
    cdf = probs.cumsum(-1)
    device = generator.device if generator is not None else cdf.device
    total, keep = rows if rows is not None else (probs.shape[0], slice(None))
    u = torch.rand(total, 1, generator=generator, dtype=cdf.dtype, device=device)[keep].to(cdf.device)
    u = (1.0 - u) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1)


@torch.no_grad()
def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
             max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, min_new_tokens: int = 0,
             rows: slice | None = None, all_done: Callable[[Tensor], bool] | None = None,
             weights: str = "fp32") -> Rollout:
    """Sample one completion per prompt (repeat prompts for groups). Stops per row at any of the model's
    end tokens (`models.chat.end_token_ids`: the generation config's EOS list and the tokenizer's EOS).

    `min_new_tokens` suppresses EOS for that many steps, as in HF `generate` (benchmarks use it to
    make every completion exactly `max_new_tokens` long). `rows` generates only that share of `prompts`
    (a rollout worker's), with the whole batch's padding and sampling stream: each row's completion is
    the one the whole batch would give it. Each decode step draws len(prompts) uniforms from `generator`.
    `all_done` decides from the rows' (n,) done flags whether decoding stops (default: when all are done);
    ranks that share a sharded model pass one that agrees across the ranks, so all make the same calls.
    `weights` (`ROLLOUT_WEIGHTS`): "int8" runs the fast decoder's matmuls on int8 weights and activations
    (`rollout/int8.py`), "bf16" on bf16 weights and activations where the CPU has bf16 instructions
    (`rollout/bf16.py`); CPU, fast-path models only; the log-probs are then that decoder's.
    """
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    return generate_ids(model, tokenizer, prompt_ids, prompt_mask, max_new_tokens, temperature, top_p, greedy,
                        generator, min_new_tokens, rows, all_done, weights)


@torch.no_grad()
def generate_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt_ids: Tensor, prompt_mask: Tensor,
                 max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                 generator: torch.Generator | None = None, min_new_tokens: int = 0,
                 rows: slice | None = None, all_done: Callable[[Tensor], bool] | None = None,
                 weights: str = "fp32") -> Rollout:
    """`generate` from token ids: prompt_ids, prompt_mask (N, P) left-padded (multi-turn episodes continue
    from the exact tokens sampled so far, special tokens included, which re-encoding text would not keep)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if weights not in ROLLOUT_WEIGHTS:
        raise ValueError(f"unknown rollout weights {weights!r}; choose one of {sorted(ROLLOUT_WEIGHTS)}")
    model = decodable(model)  # a LoRA model's transformers model, adapters in place (merged by the fast decoder)
    dev = model.device  # the rollout lives where the model does
    if weights == "bf16" and (why := bf16.missing(dev)) is not None:
        raise ValueError(why)
    prompt_ids, prompt_mask = prompt_ids.to(dev), prompt_mask.to(dev)
    share: Rows | None = None
    if rows is not None:
        share = (prompt_ids.shape[0], rows)
        prompt_ids, prompt_mask = prompt_ids[rows], prompt_mask[rows]
    n, pad = prompt_ids.shape[0], tokenizer.pad_token_id
    eos = end_token_ids(model, tokenizer).to(dev)  # (E,)
    was_training = model.training
    model.eval()
    try:
        # an empty prompt (all padding) takes HF's forward: HF attends uniformly over an all-masked row's keys
        # (the mask's large negative swamps the scores), which the fast path's boolean masks do not reproduce
        fast = fast_path_ok(model) and bool(prompt_mask.any(1).all())
        if weights != "fp32" and not fast:
            raise ValueError(f"rollout weights {weights!r} need the fast decoder (float32 Llama or Qwen2 without "
                             f"sliding windows, no hooks, no empty prompt); {type(model).__name__} does not take it: "
                             "use weights 'fp32'")
        if fast:
            decoder = _LlamaDecoder(model, prompt_mask, max_new_tokens, weights)
        else:
            decoder = _HFDecoder(model, prompt_mask, max_new_tokens)
        logits = decoder.prefill(prompt_ids, positions(prompt_mask))
        pos = positions(prompt_mask)[:, -1:]
        completion_ids = prompt_ids.new_full((n, max_new_tokens), pad)
        logps = torch.zeros(n, max_new_tokens, device=dev, dtype=torch.promote_types(logits.dtype, torch.float32))
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        for t in range(max_new_tokens):
            tok, logp = _pick(logits, temperature, top_p, greedy, eos if t < min_new_tokens else None, generator,
                              share)
            completion_ids[:, t] = tok.masked_fill_(done, pad)
            logps[:, t] = logp.masked_fill_(done, 0.0)
            done |= torch.isin(tok, eos)
            if t + 1 == max_new_tokens or (all_done(done) if all_done is not None else bool(done.all())):
                break
            pos = pos + 1
            logits = decoder(tok[:, None], pos)
    finally:
        model.train(was_training)
    return assemble_rollout(tokenizer, prompt_ids, prompt_mask, completion_ids[:, : t + 1], logps[:, : t + 1], eos)


def assemble_rollout(tokenizer: PreTrainedTokenizerBase, prompt_ids: Tensor, prompt_mask: Tensor,
                     completion_ids: Tensor, logprobs: Tensor, eos: Tensor) -> Rollout:
    """Sampled tokens (N, T), right-padded with the pad id, and their log-probs (N, T) -> the Rollout: the mask
    (every token up to and including the first end token), the texts, which rows were cut off. Any sampler's
    tokens (ours, vLLM's: `feedbackrl.scale.vllm_rollout`) become a Rollout here."""
    pad = tokenizer.pad_token_id
    is_eos = torch.isin(completion_ids, eos.to(completion_ids.device)).long()
    completion_mask = (torch.cumsum(is_eos, dim=1) - is_eos == 0).long()  # generated before (or is) the first EOS
    texts = tokenizer.batch_decode((completion_ids * completion_mask + pad * (1 - completion_mask)).tolist(),
                                   skip_special_tokens=True)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs * completion_mask, texts,
                   ~is_eos.bool().any(dim=1))
