"""A differentiable Llama/Qwen2 forward for training, run straight from the module weights.

`sequence_logprobs` (the training forward of GRPO, PPO, DPO and SFT) uses it for the models that
`rollout.generate`'s fast decode path accepts (`logprobs.fast_path_ok`: Llama or Qwen2 without sliding windows,
float32, plain `nn.Linear`s, no hooks) when no dropout is active and gradient checkpointing is
off; every other model runs its own `forward`. The maths is transformers' `LlamaDecoderLayer`:
RMSNorm, RoPE via rotate_half, causal softmax attention, SiLU-gated MLP, residuals. Gradients flow
into the model's own `nn.Parameter`s, so optimizers and checkpoints see nothing different;
tests/models/test_llama_forward.py checks log-probs and every parameter's gradient against the
HF forward.

What differs is the bookkeeping. On a CPU the training forward/backward of these small models is
matmuls plus many elementwise passes over activations that do not fit in cache, and each pass
costs a trip to memory (docs/performance.md, "Training forward"). Autograd over the HF module
code adds passes of its own: each RMSNorm is six ops forward and more backward, RoPE ten (two
muls, a neg, a cat and an add for each of q and k), and the q/k/v and gate/up projections each
send a gradient back to their common input, summed one add at a time. (Fusing those matmuls
under plain autograd does not help: the gradient of each slice of the fused output is assembled
in its own zero-filled full-size buffer.) Here:

- each RMSNorm is one per-row scale with a hand-written backward; its weight is folded into the
  next matmul's weight (`(w * y) @ W.T == y @ (W * w).T`), a weight-sized op;
- q/k/v are one matmul, RoPE one complex multiply (q/k weight rows reordered per head so that
  rotate_half's pairs (i, i + D/2) are adjacent: q.k sums over the head dim, so reordering q and
  k alike leaves the scores unchanged), and the backward writes q, k and v's gradients into one
  buffer;
- the MLP (gate, up, SiLU, product, down, residual) is one function whose backward keeps the
  gate and up gradients apart, each contiguous (on the tiny model MKL computes their weight
  gradients ~1.6x faster than from the strided halves of one (M, 2I) buffer);
- residuals are added by `addmm`;
- the LM head runs on the T positions that predict completion tokens only, and the final norm's weight
  scales those rows rather than being folded into the (V, C) head;
- the last token of each row, which predicts nothing and which no other position attends to, does
  not run through the trunk;
- rows with the same prompt (a GRPO group of G samples, a DPO pair) run its positions once and
  their completions attend to that one copy (`shared_prompts`): on the benchmark's GRPO batch
  (8 prompts x 8, 6 + 16 tokens) that is 24% fewer rows through every matmul.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel


class _RMSNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) per row of (M, C): RMSNorm without its weight."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, eps: float) -> Tensor:
        c = x.shape[-1]
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        r = torch.addcmul(torch.tensor(c * eps, dtype=x.dtype, device=x.device), r, r).rsqrt_().mul_(c**0.5)  # (M, 1)
        y = x * r
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        # dy_i/dx_j = r (delta_ij - y_i y_j / C), so dx = r * (grad - y * mean(grad * y))
        y, r = ctx.saved_tensors
        s = torch.linalg.vecdot(grad, y).unsqueeze(-1).div_(-y.shape[-1])
        return torch.addcmul(grad, y, s).mul_(r), None


def _mm_t(x: Tensor, w: Tensor, base: Tensor | None) -> Tensor:
    """x @ w.T (+ base) for w (out, in), as `F.linear` but with the residual or bias added by `addmm`."""
    return torch.mm(x, w.t()) if base is None else torch.addmm(base, x, w.t())


class _Linear(torch.autograd.Function):
    """x @ w.T + b + residual for x (M, K), w (N, K); b (N,) and residual (M, N) optional."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, residual: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_b, ctx.has_residual = b is not None, residual is not None
        base = b if residual is None else residual if b is None else residual + b
        return _mm_t(x, w, base)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        return (torch.mm(grad, w) if need[0] else None, torch.mm(grad.t(), x) if need[1] else None,
                grad.sum(0) if ctx.has_b and need[2] else None, grad if ctx.has_residual else None)


class _RopeSplit(torch.autograd.Function):
    """qkv (M, (H + 2 Hkv) D) -> RoPE'd q (n, H, s, D), k (n, Hkv, s, D) and v (n, Hkv, s, D) per segment.

    The rows of qkv are one or more segments of n sequences x s positions each (`shapes`, summing
    to M: the shared prompts and the completions of `completion_logits`); `rot` (M, 1, D/2) complex
    is cos + j sin per row. q/k columns come pair-adjacent (see the module docstring), so RoPE is
    one complex multiply. The backward writes every gradient into one (M, (H + 2 Hkv) D) buffer,
    where autograd over slices would zero-fill and add two per segment.
    """

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, rot: Tensor, shapes: tuple[tuple[int, int], ...], heads: int,
                kv_heads: int) -> tuple[Tensor, ...]:
        m, width = qkv.shape
        d, hqk = width // (heads + 2 * kv_heads), heads + kv_heads
        qk_all = torch.view_as_real(torch.view_as_complex(qkv[:, : hqk * d].view(m, hqk, d // 2, 2)) * rot)
        v_all = qkv[:, hqk * d :].clone()
        out, row = [], 0
        for n, s in shapes:
            qk = qk_all[row : row + n * s].view(n, s, hqk, d)
            v = v_all[row : row + n * s].view(n, s, kv_heads, d)
            out += [qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2)]
            row += n * s
        ctx.save_for_backward(rot)
        ctx.dims = shapes, heads, kv_heads, d
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        (rot,) = ctx.saved_tensors
        shapes, h, hk, d = ctx.dims
        grad = grads[0].new_empty(rot.shape[0], h + 2 * hk, d)
        rot_conj = rot.conj().resolve_conj()  # a lazy conj makes mul ~3x slower
        row = 0
        for i, (n, s) in enumerate(shapes):
            gq, gk, gv = grads[3 * i : 3 * i + 3]
            rows = slice(row, row + n * s)
            out = grad[rows].view(n, s, h + 2 * hk, d)
            r = rot_conj[rows].view(n, s, 1, d // 2)
            for g, cols in ((gq, slice(0, h)), (gk, slice(h, h + hk))):
                g = g.transpose(1, 2)
                if g.stride(-1) != 1:
                    g = g.contiguous()
                torch.mul(torch.view_as_complex(g.unflatten(-1, (d // 2, 2))), r,
                          out=torch.view_as_complex(out[:, :, cols].unflatten(-1, (d // 2, 2))))
            out[:, :, h + hk :] = gv.transpose(1, 2)
            row += n * s
        return grad.view(rot.shape[0], -1), None, None, None, None


class _GatedMLP(torch.autograd.Function):
    """x + (silu(y @ wg.T + bg) * (y @ wu.T + bu)) @ wd.T + bd: LlamaMLP plus the residual, y and x (M, C)."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, x: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, bg: Tensor | None,
                bu: Tensor | None, bd: Tensor | None) -> Tensor:
        g, u = _mm_t(y, wg, bg), _mm_t(y, wu, bu)
        s = F.silu(g)
        h = s * u
        out = _mm_t(h, wd, x)
        if bd is not None:
            out += bd
        ctx.save_for_backward(y, g, u, s, h, wg, wu, wd)
        ctx.has_b = bg is not None, bu is not None, bd is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        y, g, u, s, h, wg, wu, wd = ctx.saved_tensors
        has_bg, has_bu, has_bd = ctx.has_b
        gh = torch.mm(grad, wd)  # (M, I)
        du = gh * s
        dg = torch.ops.aten.silu_backward(gh.mul_(u), g)
        gy = torch.mm(dg, wg).addmm_(du, wu)
        return (gy, grad, torch.mm(dg.t(), y), torch.mm(du.t(), y), torch.mm(grad.t(), h),
                dg.sum(0) if has_bg else None, du.sum(0) if has_bu else None, grad.sum(0) if has_bd else None)


def cat_or_none(tensors: list[Tensor | None]) -> Tensor | None:
    return None if any(t is None for t in tensors) else torch.cat(tensors)


def rope_pair_rows(heads: int, kv_heads: int, head_dim: int, device: torch.device | str = "cpu") -> Tensor:
    """Row order of a fused (q, k, v) projection ((H + 2 Hkv) D rows) that puts each q/k head's RoPE
    pair (i, i + D/2) side by side, so RoPE is one complex multiply (module docstring); v rows stay put.
    The decoder (`generate._LlamaDecoder`) and the training forward use the same order."""
    half = head_dim // 2
    order = torch.arange(head_dim).view(2, half).t().reshape(-1)  # (i, i + D/2) adjacent
    qk_rows = (torch.arange(heads + kv_heads)[:, None] * head_dim + order).reshape(-1)
    v_rows = torch.arange((heads + kv_heads) * head_dim, (heads + 2 * kv_heads) * head_dim)
    return torch.cat([qk_rows, v_rows]).to(device)


def _attention_mask(mask: Tensor) -> dict[str, Tensor | bool]:
    """SDPA arguments for (N, S) left-padded rows: plain causal when nothing is padded."""
    if bool(mask.all()):
        return {"is_causal": True}
    s = mask.shape[1]
    eye = torch.eye(s, dtype=torch.bool, device=mask.device)
    keep = mask.bool()[:, None, :] | eye  # a pad query sees itself: no all -inf row
    return {"attn_mask": (torch.ones(s, s, dtype=torch.bool, device=mask.device).tril() & keep)[:, None]}


def shared_prompts(ids: Tensor, mask: Tensor, p: int) -> tuple[Tensor, Tensor] | None:
    """Rows whose first p tokens (and mask) are identical: (one row index per distinct prompt (U,), each row's
    distinct prompt (N,)), or None when every prompt is distinct (or there is no prompt)."""
    if p == 0:
        return None
    distinct, inverse = torch.unique(torch.cat([ids[:, :p], mask[:, :p].to(ids.dtype)], 1), dim=0,
                                     return_inverse=True)
    if distinct.shape[0] == ids.shape[0]:
        return None
    rows = torch.arange(ids.shape[0], device=ids.device)
    first = torch.empty(distinct.shape[0], dtype=torch.long, device=ids.device).scatter_(0, inverse, rows)
    return first, inverse


def _completion_mask(prompt_mask: Tensor, t: int) -> Tensor:
    """SDPA mask (N or 1, 1, T, P + T) for completion queries: every real prompt key, causal completion keys."""
    causal = torch.ones(t, t, dtype=torch.bool, device=prompt_mask.device).tril()
    if bool(prompt_mask.all()):
        keys = torch.ones(t, prompt_mask.shape[1], dtype=torch.bool, device=prompt_mask.device)
        return torch.cat([keys, causal], 1)[None, None]
    n, p = prompt_mask.shape
    return torch.cat([prompt_mask.bool()[:, None, :].expand(n, t, p), causal.expand(n, t, t)], 2)[:, None]


def completion_logits(model: PreTrainedModel, ids: Tensor, mask: Tensor, pos: Tensor, t: int) -> Tensor:
    """Logits (N, T, V) predicting the last T tokens of `ids` (N, S), as `model(...).logits[:, -T-1:-1]`.

    `mask` (N, S) is 0 on left padding only; `pos` (N, S) the position ids. The caller checks the
    model is eligible (`logprobs.train_fast_path_ok`: no dropout, no gradient checkpointing).

    Rows that share their prompt (a GRPO group, a DPO pair) run the prompt positions once: the
    prompt's hidden states do not depend on what follows it (causal attention), so the completions
    attend to one copy of its keys and values, and autograd sums the gradient each completion sends
    back into that copy. The same maths as one forward per row, with (G - 1) / G fewer prompt
    positions through every matmul; float rounding only differs.

    The last token of each row predicts nothing and, under causal attention, no other position sees it: the
    trunk runs without it (1 / (P + T) fewer rows through every matmul, the same logits).
    """
    cfg, inner = model.config, model.model
    n, s = ids.shape
    p, t_out = s - t, t
    if t > 0:  # the trunk's rows: every position but the last (t: the completion positions it runs)
        s, t = s - 1, t - 1
        ids, mask, pos = ids[:, :s], mask[:, :s], pos[:, :s]
    h, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    eps, half = cfg.rms_norm_eps, d // 2
    embed = inner.embed_tokens.weight
    shared = shared_prompts(ids, mask, p) if t > 0 else None
    if shared is None:  # one segment: every row, every position
        shapes, rows_ids, rows_pos = ((n, s),), ids.reshape(-1), pos
    else:  # two segments: the U distinct prompts (U, P), then every row's completion but its last token (N, T - 1)
        first, inverse = shared
        shapes = ((first.shape[0], p), (n, t))
        rows_ids = torch.cat([ids[first, :p].reshape(-1), ids[:, p:].reshape(-1)])
        rows_pos = torch.cat([pos[first, :p].reshape(-1), pos[:, p:].reshape(-1)])[None]
        prompt_args = _attention_mask(mask[first, :p])
        completion_args = {"attn_mask": _completion_mask(mask[:, :p], t)}
    cos, sin = inner.rotary_emb(embed, rows_pos)  # cat(freqs, freqs)
    rot = torch.complex(cos[..., :half], sin[..., :half]).view(-1, 1, half)
    rows = rope_pair_rows(h, hk, d, embed.device)
    att_args = _attention_mask(mask) if shared is None else None
    gqa = {"enable_gqa": True} if hk != h else {}
    # padding_idx as the model's embedding: that row never gets a gradient, even where the pad id is a real token
    x = F.embedding(rows_ids, embed, padding_idx=inner.embed_tokens.padding_idx)  # (rows, C)
    for layer in inner.layers:
        at, mlp = layer.self_attn, layer.mlp
        w_qkv = (torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]) * layer.input_layernorm.weight)[rows]
        b_qkv = cat_or_none([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
        qkv = _Linear.apply(_RMSNorm.apply(x, eps), w_qkv, None if b_qkv is None else b_qkv[rows], None)
        if shared is None:
            q, k, v = _RopeSplit.apply(qkv, rot, shapes, h, hk)
            att = F.scaled_dot_product_attention(q, k, v, scale=at.scaling, **att_args, **gqa)
            att = att.transpose(1, 2).reshape(n * s, h * d)
        else:
            qp, kp, vp, qc, kc, vc = _RopeSplit.apply(qkv, rot, shapes, h, hk)
            att_p = F.scaled_dot_product_attention(qp, kp, vp, scale=at.scaling, **prompt_args, **gqa)
            # each completion attends to its prompt's keys and values, then to its own
            k_all, v_all = torch.cat([kp[inverse], kc], 2), torch.cat([vp[inverse], vc], 2)
            att_c = F.scaled_dot_product_attention(qc, k_all, v_all, scale=at.scaling, **completion_args, **gqa)
            att = torch.cat([att_p.transpose(1, 2).reshape(-1, h * d), att_c.transpose(1, 2).reshape(n * t, h * d)])
        x = _Linear.apply(att, at.o_proj.weight, at.o_proj.bias, x)
        w_norm = layer.post_attention_layernorm.weight
        x = _GatedMLP.apply(_RMSNorm.apply(x, eps), x, mlp.gate_proj.weight * w_norm, mlp.up_proj.weight * w_norm,
                            mlp.down_proj.weight, mlp.gate_proj.bias, mlp.up_proj.bias, mlp.down_proj.bias)
    # the positions that predict completion tokens: the last prompt position, then every completion one run
    if shared is None:
        x = x.view(n, s, -1)[:, s - t_out :].reshape(n * t_out, x.shape[-1])
    else:
        u = first.shape[0]
        last_prompt = x[: u * p].view(u, p, -1)[:, -1][inverse]  # (N, C)
        x = torch.cat([last_prompt[:, None], x[u * p :].view(n, t, -1)], 1).reshape(n * t_out, -1)
    head: nn.Linear = model.get_output_embeddings()
    # the final norm's weight scales the (N T, C) rows, not the (V, C) head: a V / (N T) times smaller op
    logits = _Linear.apply(_RMSNorm.apply(x, eps) * inner.norm.weight, head.weight, None, None)
    return logits.view(n, t_out, logits.shape[-1])
