"""Where a `generate` call's time goes, per op, and the decoder's matmuls timed alone, on this CPU.

    python benchmarks/profile_generate.py --model smollm2 --threads 1 --batch 64 --new-tokens 64 \
        --sides fp32 int8 --out benchmarks/results/profile_generate_b64.json

For each side (our `generate` with float32, int8 or bf16 rollout weights, or `hf` for `model.generate`): one
warm-up call, then one call under `torch.profiler` (self CPU time per op, the top `--top` ops and their
share of the total). Then each decoder matmul shape (M = batch; SmolLM2's q/k/v, o, gate/up, down and LM
head) timed alone, median of 5 after a warm-up: float32 `mm` on the (in, out) weight,
`quantized::linear_dynamic` (the int8 kernel `rollout/int8.py` calls) with this CPU's `reduce_range`, and the
bf16 product `rollout/bf16.py` runs (where the CPU has bf16 instructions; its activation's cast included). Prints
the instruction set beside every figure; `--out` writes JSON with provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import cpu_isa, gen_prompts, load_average, provenance, setup_threads


def profile_side(side: str, model, tok, prompts: list[str], new: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from feedbackrl.rollout.generate import generate

    gen = torch.Generator().manual_seed(0)
    enc = tok(prompts, return_tensors="pt", padding=True)

    def call() -> None:
        if side == "hf":
            model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0,
                           top_k=0, pad_token_id=tok.pad_token_id)
        else:
            generate(model, tok, prompts, new, generator=gen, min_new_tokens=new, weights=side)

    call()  # warm-up (the native kernel's build, first allocations)
    t = time.perf_counter()
    call()
    plain_s = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    rows = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]
    total = sum(r[1] for r in rows)
    rows.sort(key=lambda r: -r[1])
    return {"unprofiled_s": plain_s, "unprofiled_tok_s": len(prompts) * new / plain_s, "self_cpu_total_ms": total / 1e3,
            "ops": [{"op": k, "self_ms": v / 1e3, "share": v / total, "calls": c} for k, v, c in rows[:top]]}


def time_ms(fn, repeats: int = 5) -> float:
    fn()
    vals = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        vals.append((time.perf_counter() - t) * 1e3)
    return statistics.median(vals)


def matmul_table(model, m: int) -> list[dict]:
    from feedbackrl.rollout import bf16, int8

    cfg = model.config
    c, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size // cfg.num_attention_heads
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    shapes = {"qkv": (c, qkv), "o": (c, c), "gate_up": (c, 2 * inter), "down": (inter, c),
              "lm_head": (c, cfg.vocab_size)}
    reduce = int8.reduce_range()
    out = []
    gen = torch.Generator().manual_seed(0)
    for name, (k, n) in shapes.items():
        y = torch.randn(m, k, generator=gen)
        w = torch.randn(n, k, generator=gen) * 0.02
        wt = w.t().contiguous()
        packed, _ = int8.pack(w)
        lin = int8.Linear(w, None, None)
        row = {"matmul": name, "m": m, "k": k, "n": n,
               "fp32_mm_ms": time_ms(lambda: torch.mm(y, wt)),  # noqa: B023
               "int8_kernel_ms": time_ms(lambda: torch.ops.quantized.linear_dynamic(y, packed, reduce)),  # noqa: B023
               "int8_linear_ms": time_ms(lambda: lin(y, reduce))}  # noqa: B023  (+ outliers, row scales)
        if bf16.missing() is None:
            wb = bf16.prepare(w)
            row["bf16_mm_ms"] = time_ms(lambda: bf16.mm(y, wb))  # noqa: B023
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--sides", nargs="+", choices=["hf", "fp32", "int8", "bf16"], default=["fp32", "int8"])
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-matmuls", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    setup_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from feedbackrl.models.load import resolve_model_path

    path = str(resolve_model_path(args.model))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    isa = ", ".join(cpu_isa()) or "unknown ISA"
    res = {"provenance": provenance(), "command": " ".join(sys.argv), "batch": args.batch,
           "new_tokens": args.new_tokens, "threads": args.threads, "isa": isa,
           "aten_capability": torch.backends.cpu.get_cpu_capability(), "vnni": torch.cpu._is_vnni_supported(),
           "load_before": load_average(), "profiles": {}}
    prompts = gen_prompts(args.batch)
    for side in args.sides:
        p = profile_side(side, model, tok, prompts, args.new_tokens, args.top)
        res["profiles"][side] = p
        print(f"== {side}: {p['unprofiled_tok_s']:.1f} tok/s unprofiled [{isa}]")
        for r in p["ops"]:
            print(f"  {r['share']:6.1%} {r['self_ms']:9.1f} ms {r['calls']:6d}  {r['op']}")
    if not args.no_matmuls:
        res["matmuls"] = matmul_table(model, args.batch)
        for r in res["matmuls"]:
            b = f", bf16 {r['bf16_mm_ms']:.2f} ms" if "bf16_mm_ms" in r else ""
            print(f"  {r['matmul']:8s} {r['m']}x{r['k']}x{r['n']}: fp32 {r['fp32_mm_ms']:.2f} ms, int8 kernel "
                  f"{r['int8_kernel_ms']:.2f} ms, int8 Linear {r['int8_linear_ms']:.2f} ms{b} [{isa}]")
    res["load_after"] = load_average()
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
