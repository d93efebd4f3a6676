"""What preparing the fast decoder's weights costs per call, and what checking kept ones costs.

    python benchmarks/prepare_cost.py --model smollm2 --threads 1 --out benchmarks/results/prepare_cost.json

Times, medians in one process: `_weights_key` (the check `generate` runs before reusing kept int8 weights: every
parameter's XOR hash and float32 sum) and building `_LlamaDecoder` for one 4-token row with float32, int8 and bf16
weights, the kept int8 weights dropped before each build (so each build prepares them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import isa_label, provenance, setup_threads


def median_s(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    setup_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from feedbackrl.models.load import resolve_model_path
    from feedbackrl.rollout import generate as gen_mod

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=torch.float32).eval()
    mask = torch.ones(1, 4, dtype=torch.long)
    out = {"weights_key_s": median_s(lambda: gen_mod._weights_key(model), args.repeats)}
    for w in ("fp32", "int8", "bf16"):
        def build(w: str = w) -> None:
            gen_mod._PREPARED.pop(model, None)
            gen_mod._LlamaDecoder(model, mask, 1, w)
        out[f"decoder_build_{w}_s"] = median_s(build, args.repeats)
    print(f"{json.dumps(out)}  [{isa_label()}]")
    if args.out is not None:
        args.out.write_text(json.dumps({"provenance": provenance(), "command": " ".join(sys.argv), **out}, indent=2))


if __name__ == "__main__":
    main()
