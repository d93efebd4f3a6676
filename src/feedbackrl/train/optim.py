"""The optimizer every loop uses: AdamW with torch's fused kernel.

The fused CPU kernel updates each parameter in one pass, where the default multi-tensor ("foreach")
path builds several whole-model temporaries per step: on the 27M-parameter model it is ~4x faster
(about 0.16 -> 0.04 s per step) and those temporaries no longer count towards peak memory. Same
update rule (tests/train/test_optim.py compares it with the reference implementation).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    params = list(params)
    # fused needs floating-point parameters on a device with a fused kernel (CPU and CUDA have one)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
