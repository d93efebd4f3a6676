"""`generate` with and without the C decode-attention kernel, alternating call by call in one process.

    python benchmarks/ab_native.py                 # tiny and small, GRPO shape (L=16) and 128 new tokens
    python benchmarks/ab_native.py --threads 2 --repeats 10

The two paths compute the same thing (the tokens are checked identical); the ratio is the kernel's
speed-up of a whole `generate` call, measured under the same machine load for both paths.
Shapes: "grpo" = 8 prompts x 8 samples of `a+b=` (6 tokens, one shared prefill per group), L = 16;
"gen" = the benchmark's generation row, 64 distinct 12-token prompts, 128 new tokens. EOS is suppressed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import provenance

from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rollout import generate as gen_mod
from feedbackrl.rollout import native

SHAPES = {
    "grpo": ([f"{a}+{b}=" for a, b in zip(range(10, 18), range(30, 38), strict=True) for _ in range(8)], 16),
    "gen": (["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(12)) for i in range(64)], 128),
}


def one_call(model, tok, prompts: list[str], length: int, use_kernel: bool) -> tuple[float, torch.Tensor]:
    available = native.available
    if not use_kernel:
        native.available = lambda: False
    try:
        start = time.perf_counter()
        ro = gen_mod.generate(model, tok, prompts, length, generator=torch.Generator().manual_seed(0),
                              min_new_tokens=length)
        return time.perf_counter() - start, ro.completion_ids
    finally:
        native.available = available


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/ab_native.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit("the decode-attention kernel did not build here (no C compiler?): nothing to compare")
    tok, rows = build_tokenizer(), []
    for size in args.sizes:
        model = build_model(tok, size)
        for shape in args.shapes:
            prompts, length = SHAPES[shape]
            _, ids_kernel = one_call(model, tok, prompts, length, True)  # warm-up, and the tokens to compare
            _, ids_torch = one_call(model, tok, prompts, length, False)
            if not torch.equal(ids_kernel, ids_torch):
                raise SystemExit(f"{size}/{shape}: the two paths sampled different tokens")
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for use_kernel in (False, True):
                    times[use_kernel].append(one_call(model, tok, prompts, length, use_kernel)[0])
            torch_ms, kernel_ms = (statistics.median(times[k]) * 1e3 for k in (False, True))
            per_pair = sorted(a / b for a, b in zip(times[False], times[True], strict=True))
            rows.append({"size": size, "shape": shape, "new_tokens": length, "torch_ms": round(torch_ms, 1),
                         "kernel_ms": round(kernel_ms, 1), "speedup": round(torch_ms / kernel_ms, 3),
                         "speedup_per_pair_min_max": [round(per_pair[0], 3), round(per_pair[-1], 3)],
                         "threads": args.threads})
            print(f"{size:5s} {shape:4s} L={length:3d}: PyTorch path {torch_ms:8.1f} ms, kernel {kernel_ms:8.1f} ms "
                  f"-> {torch_ms / kernel_ms:.2f}x (pairs {per_pair[0]:.2f}-{per_pair[-1]:.2f})", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"provenance": provenance(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
