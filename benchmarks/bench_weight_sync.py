"""Weights to 2 Ray rollout workers per update: the object store against a gloo broadcast, in one invocation.

    python benchmarks/bench_weight_sync.py [--reps 10 --rounds 3 --sizes tiny,small,100m]

For each model size and round, a `RayCollector` with 2 rollout workers is made for each
`scale.weight_sync` in turn (the modes alternate, so the shared machine's load falls on both), then
`--reps` updates are timed after one warm-up. An update's time runs from the learner's call until
every worker holds the new weights: `collector.update(...)` followed by one call to each worker that
answers once its earlier calls are done (with the object store the update returns after the put and
the workers load the weights afterwards, so the learner-side time alone would flatter it). The
learner-side time is reported too (`perf/weights_put_s` or `perf/weights_broadcast_s`).

Models are built from their config, random weights, fp32, no download: tiny (~1M params, the demo's),
small (~25M) and 100m (a Llama of width 768, 14 layers, ~99M). The machine's 2 cores are shared
with the 2 workers and Ray's own processes, so both modes are measured under CPU contention; on a
GPU node NCCL would move the weights GPU to GPU, which this does not measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch
from common import load_average, provenance
from transformers import LlamaConfig, LlamaForCausalLM

from feedbackrl.config import RolloutConfig, ScaleConfig
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.episodes.single_turn import task_scorer
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.scale.ray_collect import RayCollector

ROOT = Path(__file__).resolve().parents[1]
MODES = ("object_store", "collective")


def make_model(size: str, tokenizer: Any) -> torch.nn.Module:
    if size in ("tiny", "small"):
        return build_model(tokenizer, size=size, seed=0)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=2048, num_hidden_layers=14,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(cfg).eval()


def time_updates(mode: str, model: torch.nn.Module, tokenizer: Any, reps: int) -> dict[str, Any]:
    task = AdditionTask(digits=2)
    t0 = time.perf_counter()
    c = RayCollector(ScaleConfig(rollout_workers=2, weight_sync=mode), model, tokenizer, task, task_scorer(task),
                     RolloutConfig(), log=lambda line: None)
    ray.get([w.ping.remote() for w in c.workers])
    start_s = time.perf_counter() - t0
    totals, learner = [], []
    try:
        for version in range(reps + 1):
            with torch.no_grad():  # a new policy version: every weight moves
                for p in model.parameters():
                    p.add_(1e-3)
            t0 = time.perf_counter()
            c.update(model, version + 1)
            ray.get([w.ping.remote() for w in c.workers])
            if version:  # the first is a warm-up (connections, buffers)
                totals.append(time.perf_counter() - t0)
                learner.append(c.sync_s)
        # the workers hold the learner's weights, bit for bit (cloned: a collective worker's tensors are views of
        # one buffer, and Ray would serialise the whole buffer with each of them)
        state = ray.get(c.workers[1].__ray_call__.remote(lambda w: {k: v.clone() for k, v in
                                                                    w.model.state_dict().items()}))
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()), mode
    finally:
        c.close()
    return {"mode": mode, "start_s": start_s, "update_s": statistics.median(totals), "update_s_all": totals,
            "learner_s": statistics.median(learner)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="tiny,small,100m")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/weight_sync.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    tokenizer = build_tokenizer()
    rows = []
    for size in args.sizes.split(","):
        model = make_model(size, tokenizer)
        params = sum(t.numel() for t in model.state_dict().values())
        mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
        for r in range(args.rounds):
            for mode in MODES:
                load = load_average()[0]
                row = {"size": size, "params": params, "state_mib": round(mb, 1), "round": r, "load_1min": load,
                       **time_updates(mode, model, tokenizer, args.reps)}
                rows.append(row)
                print(f"{size:5} round {r} {mode:12} update {row['update_s'] * 1e3:8.1f} ms  learner "
                      f"{row['learner_s'] * 1e3:8.1f} ms  load {load}", flush=True)
    summary = {}
    for size in args.sizes.split(","):
        med = {m: statistics.median(x["update_s"] for x in rows if x["size"] == size and x["mode"] == m)
               for m in MODES}
        summary[size] = {**{f"{m}_s": v for m, v in med.items()},
                         "object_store_over_collective": med["object_store"] / med["collective"]}
        print(f"{size}: object store {med['object_store'] * 1e3:.1f} ms, collective {med['collective'] * 1e3:.1f} ms, "
              f"ratio {summary[size]['object_store_over_collective']:.2f}")
    result = {"provenance": provenance(), "rows": rows, "summary": summary, "torch_threads": 1}
    Path(args.out).write_text(json.dumps(result, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
