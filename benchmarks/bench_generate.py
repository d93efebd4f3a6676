"""Workers for the machine's limits and for raw generation speed; run by benchmarks/run.py.

    python benchmarks/bench_generate.py matmul --threads 2 [--quick]
    python benchmarks/bench_generate.py generate --model DIR --threads 2 --new-tokens 128 --repeats 3
    python benchmarks/bench_generate.py generate --model smollm2 --threads 1 --batch 16 --new-tokens 64 --int8 \
        --out benchmarks/results/int8_rollout_b16.json
    python benchmarks/bench_generate.py generate --model smollm2 --threads 1 --batch 16 --new-tokens 64 --int8 --bf16

Each prints one line `BENCH_RESULT {json}`. `generate` loads one model and alternates HF
`model.generate` with feedbackrl's `generate` call by call in the same process, so both see the
same machine load: batch 64, 12-token prompts, sampling at temperature 1, top_p 1, top_k 0 (HF),
EOS suppressed (`min_new_tokens`) so every call makes exactly batch x new tokens, as the
baseline's `worker_gen`. `--int8` and `--bf16` add sides, our `generate` with int8 or bf16 rollout weights
(`rollout/int8.py`, `rollout/bf16.py`), and measure their log-probs against float32 scoring of the same tokens.
Every ratio is printed with the CPU's instruction set (AVX2, AVX-512, VNNI, AMX flags) and ATen's vector
capability; `--out` writes the result with its provenance (commit, machine, instruction set).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    RESULT_TAG,
    emit,
    flops_per_token,
    gen_prompts,
    isa_label,
    load_average,
    peak_rss_mib,
    provenance,
    setup_threads,
    summarize,
)


def mm_gflops(n: int, dtype: torch.dtype, min_time: float, repeats: int) -> dict:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    t = time.perf_counter()
    torch.mm(a, b)
    iters = max(1, int(min_time / max(time.perf_counter() - t, 1e-6)))
    vals = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b)
        vals.append(2 * n**3 * iters / (time.perf_counter() - t) / 1e9)
    return summarize(vals)


def run_matmul(args: argparse.Namespace) -> dict:
    """torch.mm GFLOP/s on n x n matrices: the compute bound every '% of bound' figure divides by."""
    min_time, repeats = (0.25, 2) if args.quick else (0.5, 3)
    sizes = [(1024, torch.float32), (2048, torch.float32), (1024, torch.bfloat16)]
    if not args.quick:
        sizes.insert(2, (4096, torch.float32))
    rows = [{"n": n, "dtype": str(dt).removeprefix("torch."), "gflops": mm_gflops(n, dt, min_time, repeats)}
            for n, dt in sizes]
    best = {dt: max(r["gflops"]["median"] for r in rows if r["dtype"] == dt) for dt in ("float32", "bfloat16")}
    return {"mm": rows, "best_fp32_gflops": best["float32"], "best_bf16_gflops": best["bfloat16"]}


def _timed(fn: Callable[[], int]) -> float:
    t = time.perf_counter()
    tokens = fn()
    return tokens / (time.perf_counter() - t)


def run_generate(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from feedbackrl.rollout import generate as gen_mod
    from feedbackrl.rollout.generate import generate

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts, new = gen_prompts(args.batch), args.new_tokens
    enc = tok(prompts, return_tensors="pt", padding=True)
    assert enc["input_ids"].shape[1] == 12, enc["input_ids"].shape
    gc = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0,
                          top_k=0, use_cache=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    gen = torch.Generator().manual_seed(0)

    def hf() -> int:
        out = model.generate(**enc, generation_config=gc)
        assert out.shape[1] - 12 == new
        return args.batch * new

    def ours(weights: str = "fp32") -> int:
        ro = generate(model, tok, prompts, new, generator=gen, min_new_tokens=new, weights=weights)
        assert int(ro.completion_mask.sum()) == args.batch * new
        return args.batch * new

    def repacked(weights: str) -> int:  # as after an optimizer step: the weights prepared again in this call
        gen_mod._PREPARED.pop(model, None)
        return ours(weights)

    fns = {"hf": hf, "feedbackrl": ours}
    reduced = [w for w in ("int8", "bf16") if getattr(args, w)]
    for w in reduced:
        fns[f"feedbackrl_{w}"] = lambda w=w: ours(w)
        if args.repacked:
            fns[f"feedbackrl_{w}_repacked"] = lambda w=w: repacked(w)
    warm = args.new_tokens if args.warmup_tokens is None else args.warmup_tokens
    generate(model, tok, prompts, warm, generator=gen, min_new_tokens=warm)  # warm-up, every side
    warm_gc = copy.deepcopy(gc)
    warm_gc.max_new_tokens = warm_gc.min_new_tokens = warm
    model.generate(**enc, generation_config=warm_gc)
    for w in reduced:
        generate(model, tok, prompts, warm, generator=gen, min_new_tokens=warm, weights=w)
    vals: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.repeats):  # alternate, and alternate who goes first
        for k in list(fns)[:: 1 if r % 2 == 0 else -1]:
            vals[k].append(_timed(fns[k]))
    fpt = flops_per_token(Path(args.model))
    out = {"batch": args.batch, "prompt_len": 12, "new_tokens": new, "flops_per_token": fpt,
           "tokens_per_s": {k: summarize(v) for k, v in vals.items()},
           "ratio_per_repeat": [a / b for a, b in zip(vals["feedbackrl"], vals["hf"], strict=True)]}
    for w in reduced:
        side = vals[f"feedbackrl_{w}"]
        out[f"{w}_ratio_per_repeat"] = [a / b for a, b in zip(side, vals["hf"], strict=True)]
        out[f"{w}_vs_fp32_per_repeat"] = [a / b for a, b in zip(side, vals["feedbackrl"], strict=True)]
        if args.repacked:
            again = vals[f"feedbackrl_{w}_repacked"]
            out[f"{w}_repacked_ratio_per_repeat"] = [a / b for a, b in zip(again, vals["hf"], strict=True)]
        out[f"{w}_agreement"] = agreement(model, tok, prompts, new, w)
    return out


def agreement(model, tok, prompts: list[str], new: int, weights: str) -> dict:
    """Int8 or bf16 rollouts' log-probs against float32 scoring of the same tokens, at temperature 1."""
    from feedbackrl.models.logprobs import sequence_logprobs
    from feedbackrl.rollout.generate import generate

    ro = generate(model, tok, prompts, new, generator=torch.Generator().manual_seed(1), weights=weights)
    with torch.no_grad():
        fp32, _ = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    m = ro.completion_mask.bool()
    gap = (ro.logprobs - fp32)[m].double()
    return {"tokens": int(m.sum()), "mean_abs_logprob_gap": gap.abs().mean().item(),
            "p99_abs_logprob_gap": gap.abs().quantile(0.99).item(), "max_abs_logprob_gap": gap.abs().max().item(),
            "mean_logprob_gap": gap.mean().item(),
            "importance_weight_mean": torch.exp(-gap).mean().item(),
            "importance_weight_truncated_frac_at_2": (torch.exp(-gap) > 2).double().mean().item(),
            "mean_abs_sequence_gap": ((ro.logprobs - fp32) * m).sum(1).abs().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["matmul", "generate"])
    ap.add_argument("--model", default="")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--int8", action="store_true", help="also time our generate with int8 rollout weights")
    ap.add_argument("--bf16", action="store_true", help="also time our generate with bf16 rollout weights")
    ap.add_argument("--repacked", action="store_true",
                    help="also time the int8 / bf16 sides with their weights prepared again in every call (the "
                         "first call after an optimizer step); the plain sides reuse kept ones where `generate` "
                         "keeps them (int8)")
    ap.add_argument("--warmup-tokens", type=int, default=None,
                    help="new tokens of the one warm-up call per side (default: --new-tokens)")
    ap.add_argument("--out", type=Path, default=None, help="write the result JSON here, with provenance")
    args = ap.parse_args()
    setup_threads(args.threads)
    if args.part == "generate":
        from feedbackrl.models.load import resolve_model_path

        args.model = str(resolve_model_path(args.model))
    load = load_average()
    res = run_matmul(args) if args.part == "matmul" else run_generate(args)
    res = {**res, "threads": args.threads, "load_before": load, "load_after": load_average(),
           "peak_rss_mib": peak_rss_mib()}
    if args.out is not None:
        args.out.write_text(json.dumps({"provenance": provenance(), "command": " ".join(sys.argv), **res}, indent=2))
    tps = res.get("tokens_per_s", {})
    for side, v in tps.items():
        if side != "hf":
            print(f"{side} / hf: {v['median'] / tps['hf']['median']:.2f}x at batch {args.batch} x {args.new_tokens} "
                  f"new  [{isa_label()}]")
    emit(RESULT_TAG, res)


if __name__ == "__main__":
    main()
