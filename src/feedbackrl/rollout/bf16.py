"""Bf16 rollout weights: the fast decoder's matmuls on bfloat16 weights and activations (CPUs with bf16 instructions).

`rollout.weights = "bf16"` (`generate(..., weights="bf16")`): every matmul of `_LlamaDecoder` (q/k/v, o, gate/up,
down, the LM head) takes its weight rounded to bfloat16 once per call of `generate` (the RMSNorm weight folded in
first, as in float32: bf16 rounds each element relative to itself, so folding costs nothing; the cast costs about
what checking that a kept copy is current would, so it is not kept across calls) and its activation rounded to
bfloat16 at every matmul; the products accumulate in float32 inside oneDNN's kernel (AMX tiles or AVX-512 BF16 dot
products) and the output is rounded to bfloat16 before it joins the float32 residual stream. Attention, the KV
cache, the norms, softmax and sampling stay float32.

Each rounding is relative, at most u = 2^-8 of the value (bf16 keeps 8 significant bits), so one matmul's output
is off by at most (2u + u^2) sum_j |y_j w_j| (its inputs) plus u |y w| (its output) plus float32 accumulation:
the bound `tests/rollout/test_bf16_rollout.py` holds the matmul to. What that costs in log-probs is measured
(docs/performance.md, "Bf16 rollout weights"); the training loop corrects for it as for int8: the batch carries
the bf16 sampler's log-probs as the behaviour log-probs and each token is weighted by
min(pi_fp32 / pi_bf16, scale.importance_cap) (`algos/staleness.py`).

Only where the CPU has bf16 instructions: without them PyTorch still multiplies bf16 matrices, but through a
slow emulation (about 1 GFLOP/s measured on an AVX2-only CPU, against 35 for float32), so
`rollout.weights = "bf16"` is refused there, naming the missing feature (`missing()`), before any work.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

# ONEDNN_MAX_CPU_ISA values that cap oneDNN (which runs PyTorch's bf16 matmuls on the CPU) below bf16 instructions
ONEDNN_BELOW_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"})

UNIT_ROUNDOFF = 2.0**-8  # bf16: 8 significant bits, round to nearest


def cpu_features() -> list[str]:
    """The bf16 instructions this CPU has, as its flags name them: AMX (PyTorch reports AMX tiles; every x86 CPU
    with them so far also has amx_bf16) and AVX-512 BF16. x86 only: other CPUs report none and are refused."""
    found = []
    if torch.cpu._is_amx_tile_supported():
        found.append("amx_bf16")
    if torch.cpu._is_avx512_bf16_supported():
        found.append("avx512_bf16")
    return found


def missing(device: torch.device | str = "cpu") -> str | None:
    """Why bf16 rollout weights cannot run here (None where they can): a non-CPU device, or no bf16 instructions."""
    if torch.device(device).type != "cpu":
        return f"bf16 rollout weights run on the CPU only so far; the model is on {device}"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap in ONEDNN_BELOW_BF16:
        return (f"rollout.weights = 'bf16' needs oneDNN's bf16 instructions, and ONEDNN_MAX_CPU_ISA={cap} keeps it "
                "below them (bf16 matmuls would be emulated, slower than float32): use rollout.weights = 'fp32' "
                "(or 'int8'), or unset ONEDNN_MAX_CPU_ISA")
    if not cpu_features():
        return ("rollout.weights = 'bf16' needs a CPU with bf16 instructions (AMX, flag amx_bf16, or AVX-512 BF16, "
                "flag avx512_bf16); this CPU has neither, and emulated bf16 matmuls are slower than float32: "
                "use rollout.weights = 'fp32' (or 'int8')")
    return None


def prepare(weight: Tensor, in_scale: Tensor | None = None) -> Tensor:
    """(out, in) float32 weight, optional (in,) column scale (the RMSNorm weight) -> the (out, in) bf16 weight.

    With `in_scale` the weight must be the caller's own copy (the decoder's concatenated q/k/v or gate/up): it is
    scaled in place, as the float32 decoder folds its norms, saving a pass over it on every call."""
    w = weight.detach()
    if in_scale is not None:
        w = w.mul_(in_scale)
    return w.to(torch.bfloat16).contiguous()


def mm(y: Tensor, w: Tensor) -> Tensor:
    """y (M, in) float32 @ w.T, w (out, in) bf16 -> (M, out) bf16: inputs rounded, float32 accumulation."""
    return torch.mm(y.to(torch.bfloat16), w.t())
