"""Where the GRPO training step's time goes (everything after the rollout), per phase and per op, on this CPU.

    python benchmarks/profile_train_step.py --model smollm2 --threads 1 --length 16 --repeats 3 \
        --out benchmarks/results/profile_train_step.json

The batch is the GRPO benchmark's (`bench_grpo.py`): 8 prompts 'a+b=' x 8 completions of `--length` tokens (no
EOS, every token real), random completion tokens (the training step's cost does not depend on which). The step is
the on-policy loop's for one epoch and one minibatch: `GroupRelative.loss` (the training forward through
`sequence_logprobs` with entropy, the clipped policy-gradient loss, token-mean), backward, grad-norm clip, fused
AdamW, zero_grad. Each phase is timed alone (median of `--repeats` after one warm-up, wall and CPU seconds); then
one whole step runs under `torch.profiler` (self CPU time per op, the top `--top` ops), and the step's matmul
shapes are timed alone in float32 and bfloat16 (GFLOP/s). `--precision bf16` runs the step under the loop's
autocast. Prints the instruction set; `--out` writes JSON with provenance.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import SumTask, cpu_isa, load_average, provenance, setup_threads

PROMPTS, GROUP = 8, 8


def make_batch(tok: Any, length: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    """(prompt_ids, prompt_mask, completion_ids, completion_mask) as the collector builds them: left-padded prompts,
    each repeated G times, completions of exactly `length` tokens."""
    from feedbackrl.models.logprobs import encode_prompts

    rng = random.Random(seed)
    prompts = [SumTask().sample(rng).prompt for _ in range(PROMPTS)]
    tok.padding_side = "left"
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(GROUP)])
    gen = torch.Generator().manual_seed(seed)
    comp = torch.randint(0, vocab, (PROMPTS * GROUP, length), generator=gen)
    return [ids, mask, comp, torch.ones_like(comp)]


def timed(fn: Any, repeats: int) -> dict[str, float]:
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


def matmul_table(cfg: Any, rows: int, repeats: int) -> list[dict[str, Any]]:
    """The training step's matmul shapes (M = `rows`: its completion tokens) timed alone, float32 and bfloat16
    operands (CPU seconds, best of `repeats` after a warm-up): how near this CPU's matmul rate the step runs."""
    c, inter = cfg.hidden_size, cfg.intermediate_size
    d = getattr(cfg, "head_dim", None) or c // cfg.num_attention_heads
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    gen = torch.Generator().manual_seed(0)
    table = []
    for name, k, n in (("qkv", c, qkv), ("gate/up", c, inter), ("down", inter, c), ("lm_head", c, cfg.vocab_size)):
        rates = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, w = torch.randn(rows, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype)
            torch.mm(x, w.t())
            best = float("inf")
            for _ in range(repeats):
                c0 = time.process_time()
                torch.mm(x, w.t())
                best = min(best, time.process_time() - c0)
            rates[dtype] = 2 * rows * k * n / best / 1e9
        table.append({"shape": f"{name} ({rows} x {k}) @ ({k} x {n})", "fp32_gflop_s": rates[torch.float32],
                      "bf16_gflop_s": rates[torch.bfloat16]})
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    setup_threads(args.threads)
    from feedbackrl.config import build_config
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.logprobs import sequence_logprobs
    from feedbackrl.models.policy import train_autocast
    from feedbackrl.train.grpo import GroupRelative
    from feedbackrl.train.onpolicy import make_optimizer

    cfg = build_config({
        "rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": args.length},
        "algo": {"name": "grpo", "steps": 1, "lr": 1e-4, "kl_coef": 0.0, "epochs": 1, "minibatches": 1,
                 "max_grad_norm": 1.0, "aggregation": "token_mean", "scale_advantages": True},
        "train": {"seed": 0, "precision": args.precision},
    })
    model, tok = load_policy(args.model), load_tokenizer(args.model)
    model.train()
    batch = make_batch(tok, args.length, model.config.vocab_size)
    n = batch[0].shape[0]
    objective = GroupRelative(cfg)
    rows = {"advantages": torch.randn(n, generator=torch.Generator().manual_seed(1))}
    norm = {"num_tokens": float(batch[3].sum()), "num_sequences": float(n), "max_len": args.length}
    optimizer = make_optimizer(model, cfg)
    params = list(model.parameters())

    def precision() -> Any:
        return train_autocast(args.precision, model.device)

    def forward_only() -> None:
        with torch.no_grad(), precision():
            sequence_logprobs(model, *batch, 1.0)

    def forward_entropy_only() -> None:
        with torch.no_grad(), precision():
            sequence_logprobs(model, *batch, 1.0, with_entropy=True)

    def loss_backward() -> None:
        with precision():
            parts = objective.loss(model, batch, rows, norm, 0.0)
        parts.loss.backward()
        optimizer.zero_grad(set_to_none=True)

    def optimizer_phase() -> None:
        for p in params:
            p.grad = torch.zeros_like(p)
        t = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        clip_s.append(time.perf_counter() - t)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def whole_step() -> None:
        with precision():
            parts = objective.loss(model, batch, rows, norm, 0.0)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    clip_s: list[float] = []
    isa = ", ".join(cpu_isa()) or "unknown ISA"
    out: dict[str, Any] = {"provenance": provenance(), "model": args.model, "threads": args.threads,
                           "length": args.length, "precision": args.precision, "isa": isa,
                           "rows": [int(x) for x in batch[0].shape] + [int(batch[2].shape[1])],
                           "load_at_start": load_average()}
    phases = {"forward (no grad, log-probs)": forward_only, "forward (no grad, log-probs + entropy)":
              forward_entropy_only, "loss forward + backward": loss_backward, "grad clip + AdamW step": optimizer_phase,
              "whole training step": whole_step}
    out["phases"] = {}
    for name, fn in phases.items():
        out["phases"][name] = timed(fn, args.repeats)
        print(f"{name}: {out['phases'][name]} [{isa}]", flush=True)
    out["grad_clip_s"] = statistics.median(clip_s)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        whole_step()
    ev = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]
    total = sum(e[1] for e in ev)
    ev.sort(key=lambda e: -e[1])
    out["profile_self_cpu_ms"] = total / 1e3
    out["ops"] = [{"op": k, "self_ms": v / 1e3, "share": v / total, "calls": c} for k, v, c in ev[: args.top]]
    for o in out["ops"]:
        print(f"  {o['op']:<45} {o['self_ms']:9.1f} ms {100 * o['share']:5.1f}%  x{o['calls']}")
    out["matmuls"] = matmul_table(model.config, int(batch[3].numel()), args.repeats)
    for m in out["matmuls"]:
        print(f"  {m['shape']}: fp32 {m['fp32_gflop_s']:.1f} GFLOP/s, bf16 {m['bf16_gflop_s']:.1f} GFLOP/s [{isa}]")
    out["load_at_end"] = load_average()
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
