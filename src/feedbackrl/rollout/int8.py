"""Int8 rollout weights: the fast decoder's matmuls on int8 weights and int8 activations (CPU only).

`rollout.weights = "int8"` (`generate(..., weights="int8")`): every matmul of `_LlamaDecoder` (q/k/v, o, gate/up,
down, the LM head) runs as PyTorch's dynamically quantised linear (`torch.ops.quantized.linear_dynamic`, fbgemm or
oneDNN underneath): the weight quantised to int8 per output channel (symmetric, scale = max |w| / 127 per row,
applied to the kernel's output columns) once per weight version (`generate._prepared` keeps the packed weights
across calls until the weights change), each activation quantised per row to 8 bits at every matmul (7 without
VNNI), int32 accumulation, float32 out. Attention, the KV cache, the norms, softmax and sampling stay float32.

What it costs in accuracy is measured, not assumed: the sampled tokens' log-probs under the int8 decoder
differ from float32 scoring of the same tokens (docs/performance.md, "Int8 rollout weights"). The
training loop corrects for that gap as it does for vLLM's: the batch carries the int8 sampler's log-probs
as the behaviour log-probs and each token is weighted by min(pi_fp32 / pi_int8, scale.importance_cap)
(`algos/staleness.py`, truncated importance sampling; `is_weight/mean` logs it).

`reduce_range`: without VNNI, x86 int8 kernels multiply u8 x s8 pairs into saturating int16 sums
(`vpmaddubsw`); 7-bit activations keep those sums from saturating, as PyTorch's x86 default does. With
VNNI (AVX-512 VNNI or AVX-VNNI) the products go straight to int32 and all 8 bits are used.

torch 2.13 marks the quantised tensor types these kernels take as deprecated (to move to torchao); they
still run, with one warning per process. A move to torchao's int8 kernels would keep the same maths.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

# FBGEMM_ENABLE_INSTRUCTIONS values that cap fbgemm's kernels below AVX-512 VNNI (its names for VNNI end in E1)
FBGEMM_NO_VNNI = frozenset({"AVX2", "AVX512", "AVX512_256"})


def reduce_range() -> bool:
    """7-bit activations where the int8 kernels run without VNNI (int16 intermediate sums could saturate), else 8
    bits: where the CPU lacks VNNI, or where `FBGEMM_ENABLE_INSTRUCTIONS` keeps fbgemm from it (an emulated
    narrower CPU: the AVX2 kernel saturates on 8-bit activations whatever the CPU has)."""
    capped = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").strip().upper() in FBGEMM_NO_VNNI
    return capped or not torch.cpu._is_vnni_supported()


OUTLIER_CHANNELS = 16  # input channels per matmul kept in float32, picked per call by the activation's magnitude


class Linear:
    """y -> (y * in_scale) @ W.T + b: int8 weights and activations, with the activation's outlier channels in float32.

    - Per-row activations: the kernel quantises its input per tensor (one scale for the whole batch);
      dividing each row by its largest magnitude first and multiplying the output rows back gives every
      row all 8 bits (a matmul without bias is linear in each row).
    - Outlier channels (LLM.int8(), Dettmers et al. 2022): a few input channels of a transformer's
      activations are far larger than the rest, and one per-row scale spent on them leaves the others a few
      levels. Each call takes the `OUTLIER_CHANNELS` channels of largest magnitude over the batch out of the
      int8 product and multiplies them in float32 by the same rows of the float32 weight. On
      SmolLM2-135M this cut the mean |log-prob gap| to float32 from 0.22 to 0.06 nats per token.
    - `in_scale` (in,) is the RMSNorm weight before this matmul, applied to the activation rather than
      folded into W: folded, it would scale W's columns unevenly and the per-row quantisation of W would
      lose the small ones.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, in_scale: Tensor | None = None) -> None:
        self.packed, self.scale = pack(weight)
        self.weight_t = weight.detach().float().t().contiguous()  # (in, out): the outlier channels' rows
        self.bias = None if bias is None else bias.detach().float()
        self.in_scale = None if in_scale is None else in_scale.detach().float()
        self.outliers = min(OUTLIER_CHANNELS, weight.shape[1])

    def __call__(self, y: Tensor, reduce: bool) -> Tensor:
        y = y * self.in_scale if self.in_scale is not None else y.clone()  # (M, in), ours to change
        mag = y.abs()
        idx = mag.amax(dim=0).topk(self.outliers).indices
        out = torch.mm(y.index_select(1, idx), self.weight_t.index_select(0, idx))
        y.index_fill_(1, idx, 0.0)
        row_max = mag.index_fill_(1, idx, 0.0).amax(dim=1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny)
        # the kernel's int32 sums times the activation's step; then each output column times its weight row's step
        q = torch.ops.quantized.linear_dynamic(y.div_(row_max), self.packed, reduce)
        out.addcmul_(q.mul_(self.scale), row_max)
        return out if self.bias is None else out.add_(self.bias)


def pack(weight: Tensor) -> tuple[torch.ScriptObject, Tensor]:
    """(out, in) float32 weight -> (packed int8 weights, per-row steps (out,)): symmetric per output channel,
    q = round(w / s) with s = max |w| / 127 per row.

    The kernel gets q as a per-tensor int8 tensor of step 1 and the caller multiplies each output column by its
    row's step s: the same product as a per-channel quantised weight (the kernel would multiply by s itself),
    but packing a per-channel tensor reads its scales one channel at a time (about 17 us each, 1.3 s for
    SmolLM2's 49,152-row LM head, every `generate` call), while a per-tensor one packs in one pass.
    """
    if weight.device.type != "cpu":
        raise ValueError(f"int8 rollout weights run on the CPU only; the model is on {weight.device}")
    w = weight.detach().float()
    scale = torch.linalg.vector_norm(w, ord=float("inf"), dim=1).div_(127.0).clamp_(min=torch.finfo(torch.float32).tiny)
    # quantize_per_tensor at step 1 rounds to the nearest integer (|w / s| <= 127 by construction)
    q = torch.quantize_per_tensor(w / scale[:, None], 1.0, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None), scale


def dequantized(lin: Linear) -> Tensor:
    """The float32 weight (out, in) that `lin`'s int8 product multiplies by: int8 values x per-row steps."""
    q, _ = torch.ops.quantized.linear_unpack(lin.packed)
    return q.int_repr().float() * lin.scale[:, None]
