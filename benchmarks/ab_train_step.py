"""The GRPO training step (no rollout) with the training forward of two source trees, alternating in one process.

    git worktree add ../before <commit>
    python benchmarks/ab_train_step.py --before ../before --model smollm2 --threads 1 --length 16 --repeats 4 \
        [--out benchmarks/results/NAME.json]

The batch and the step are `profile_train_step.py`'s (8 prompts x 8 completions of `--length` tokens; loss,
backward, grad clip, fused AdamW). Both sides run this tree's loop and optimizer; the before side swaps in the
other tree's `models/llama_forward.py` and `models/logprobs.py` (the training forward and the log-softmax), so
only changes confined to those two files are compared. Steps alternate before/after, one warm-up each, so
machine load hits both alike; prints wall and CPU seconds per side and the ratio before/after (> 1: after is
faster), and the largest log-prob difference between the two on the first step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from common import cpu_isa, load_average, provenance, setup_threads
from profile_train_step import GROUP, PROMPTS, make_batch


def load_tree_module(tree: Path, name: str, replace: dict[str, str]) -> ModuleType:
    """`feedbackrl/models/{name}.py` of `tree` as a module of its own, its imports renamed by `replace`."""
    src = (tree / "src" / "feedbackrl" / "models" / f"{name}.py").read_text()
    for old, new in replace.items():
        src = src.replace(old, new)
    mod = ModuleType(f"before_{name}")
    sys.modules[mod.__name__] = mod
    exec(compile(src, str(tree / f"{name}.py"), "exec"), mod.__dict__)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="source tree of the earlier training forward")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if importlib.util.find_spec("feedbackrl") is None:
        ap.error("feedbackrl is not importable: put this tree's src on PYTHONPATH")
    setup_threads(args.threads)
    import feedbackrl.train.grpo as grpo
    from feedbackrl.config import build_config
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.train.onpolicy import make_optimizer

    before_fwd = load_tree_module(args.before, "llama_forward", {})
    before_lp = load_tree_module(args.before, "logprobs", {"from feedbackrl.models.llama_forward import":
                                                           "from before_llama_forward import"})
    sides = {"before": before_lp.sequence_logprobs, "after": grpo.sequence_logprobs}
    cfg = build_config({
        "rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": args.length},
        "algo": {"name": "grpo", "steps": 1, "lr": 1e-4, "kl_coef": 0.0, "epochs": 1, "minibatches": 1,
                 "max_grad_norm": 1.0, "aggregation": "token_mean", "scale_advantages": True},
        "train": {"seed": 0},
    })
    model, tok = load_policy(args.model), load_tokenizer(args.model)
    model.train()
    assert before_fwd.__name__ == "before_llama_forward"
    batch = make_batch(tok, args.length, model.config.vocab_size)
    n = batch[0].shape[0]
    objective = grpo.GroupRelative(cfg)
    rows = {"advantages": torch.randn(n, generator=torch.Generator().manual_seed(1))}
    norm = {"num_tokens": float(batch[3].sum()), "num_sequences": float(n), "max_len": args.length}
    # lr 0: the weights stay as loaded, so every step of either side does the same work on the same values
    optimizer = make_optimizer(model, cfg)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    params = list(model.parameters())
    with torch.no_grad():
        lps = {k: fn(model, *batch, 1.0)[0] for k, fn in sides.items()}
    max_diff = (lps["before"] - lps["after"]).abs().max().item()

    def step(side: str) -> tuple[float, float]:
        grpo.sequence_logprobs = sides[side]
        t, c = time.perf_counter(), time.process_time()
        parts = objective.loss(model, batch, rows, norm, 0.0)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t, time.process_time() - c

    isa = ", ".join(cpu_isa()) or "unknown ISA"
    times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    loads = [load_average()]
    for i in range(args.repeats + 1):
        for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
            got = step(side)
            if i > 0:  # the first round warms both sides up
                times[side].append(got)
        loads.append(load_average())
        print(f"round {i}: " + ", ".join(f"{k} {v[-1][0]:.2f} s wall {v[-1][1]:.2f} s CPU" for k, v in times.items()
                                          if v and i > 0), flush=True)
    grpo.sequence_logprobs = sides["after"]
    med = {k: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v),
               "steps": [{"wall_s": w, "cpu_s": c} for w, c in v]} for k, v in times.items()}
    ratio = {key: med["before"][key] / med["after"][key] for key in ("wall_s", "cpu_s")}
    print(f"before/after: wall {ratio['wall_s']:.3f}x, CPU {ratio['cpu_s']:.3f}x; max |log-prob diff| "
          f"{max_diff:.2e} [{isa}]")
    if args.out:
        args.out.write_text(json.dumps({"provenance": provenance(), "before": str(args.before), "model": args.model,
                                        "threads": args.threads, "length": args.length, "isa": isa,
                                        "load_1min": loads, "sides": med, "ratio_before_over_after": ratio,
                                        "max_logprob_diff": max_diff}, indent=2))


if __name__ == "__main__":
    main()
