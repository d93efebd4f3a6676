"""Ray workers against one process, in one invocation: the demo task's RL phase and the code verifier.

    python benchmarks/bench_scale.py demo [--steps 60 --sft-steps 500 --heldout 400]
    python benchmarks/bench_scale.py verdicts [--n 96]     # code-task verdicts/s: 1 vs 2 verifier workers

demo: the demo recipe's SFT warm start runs once; each mode then trains GRPO for `--steps` steps from
that checkpoint with the same seed and is evaluated (greedy held-out accuracy, 400 problems).
samples/s = steps x 128 completions / RL wall time. Every process runs 1 thread (on a shared machine
2 threads per process lose more to waiting on each other than they gain). Modes: one process;
synchronous with 2 rollout workers (the learner waits); asynchronous, staleness 1, with 1 rollout
worker beside the learner (the 2 cores split between generation and training).
verdicts: `n` distinct one-line programs for the code recipe's problems (3 sandboxed tests each), timed
through the task's own verifier (1 sandbox at a time) and through a Ray pool of 1 and 2 verifier workers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import load_average

from feedbackrl.config import RunConfig, load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.tiny import make_tiny
from feedbackrl.train.evaluate import evaluate
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.sft import sft_warmstart

ROOT = Path(__file__).resolve().parents[1]
# per-step costs: the learner's wait for rollouts, scoring, the whole step, the weights' put into the object store
PERF = ("perf/gen_s", "perf/score_s", "perf/step_s", "perf/weights_put_s")
MODES: dict[str, tuple[dict[str, Any], int]] = {  # name -> ([scale] section, learner threads)
    "one process": ({}, 1),
    "sync, 2 rollout workers": ({"rollout_workers": 2}, 1),
    "async (staleness 1), 1 rollout worker": ({"rollout_workers": 1, "max_staleness": 1}, 1),
}


def held_out(model: Any, tok: Any, cfg: RunConfig) -> float:
    task = make_task(cfg.task)
    return evaluate(model, tok, task, task.heldout(cfg.task.heldout_size), cfg.rollout.max_new_tokens,
                    k=1, temperature=1.0, batch_size=cfg.eval.batch_size).accuracy


def demo(steps: int, sft_steps: int, heldout: int, seeds: list[int], modes: str) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp())
    overrides = [f"algo.steps={steps}", f"sft.steps={sft_steps}", f"task.heldout_size={heldout}"]
    base = load_config(ROOT / "recipes" / "reverse_grpo.toml", overrides)
    torch.set_num_threads(1)
    path = make_tiny(work / "base", base.model.size, base.model.init_seed)
    model, tok = load_policy(str(path)), load_tokenizer(str(path))
    sft_warmstart(model, tok, make_task(base.task), base.sft, base.train.seed, MemorySink())
    model.save_pretrained(work / "sft")
    tok.save_pretrained(work / "sft")
    rows = [{"mode": "after SFT", "accuracy": held_out(model, tok, base)}]
    runs = [(seed, name) for seed in seeds for name in MODES if modes in name]
    for seed, name in runs:
        scale, threads = MODES[name]
        cfg = load_config(ROOT / "recipes" / "reverse_grpo.toml", [*overrides, f"train.seed={seed}"])
        cfg.scale = cfg.scale.model_validate(scale)
        torch.set_num_threads(threads)
        model, tok = load_policy(str(work / "sft")), load_tokenizer(str(work / "sft"))
        sink, load0, t0 = MemorySink(), load_average()[0], time.perf_counter()
        train_grpo(cfg, model, tok, make_task(cfg.task), work / f"{name.replace(' ', '_')}_{seed}", sink)
        wall = time.perf_counter() - t0
        torch.set_num_threads(1)
        last, by_step = sink.by_step[steps], list(sink.by_step.values())
        medians = {k: statistics.median(r[k] for r in by_step) for k in PERF if k in last}
        rows.append({"mode": name, "seed": seed, "accuracy": held_out(model, tok, cfg), "rl_s": wall,
                     "samples_per_s": steps * 128 / wall, "reward_last": last["reward/mean"],
                     "staleness_mean": last.get("scale/staleness_mean"), "median": medians,
                     "load_1min": [load0, load_average()[0]]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def verdicts(n: int) -> list[dict[str, Any]]:
    from feedbackrl.scale.ray_collect import RewardPool, start_ray

    data = ROOT / "recipes" / "data" / "tiny_programs.jsonl"  # absolute: the verifier actors run elsewhere
    cfg = load_config(ROOT / "recipes" / "code_grpo.toml", ["task.options.verify_workers=1",
                                                           f'task.options.path="{data}"'])
    task = make_task(cfg.task)
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(n)]
    programs = [f"print(int(input())+{i})" for i in range(n)]  # distinct: the verifier's cache never hits
    rows = []
    t0 = time.perf_counter()
    want = task.verify_batch(problems, programs)
    rows.append({"scorer": "task verifier, 1 sandbox at a time", "verdicts_per_s": n / (time.perf_counter() - t0)})
    start_ray("", 2)
    for workers in (1, 2):
        pool = RewardPool(cfg.task, workers)
        pool(problems[:2], ["print(0)", "print(1)"])  # actors started and the sandbox warm, not timed
        t0 = time.perf_counter()
        got, _ = pool(problems, programs)
        rows.append({"scorer": f"Ray pool, {workers} verifier worker(s)",
                     "verdicts_per_s": n / (time.perf_counter() - t0),
                     "same_verdicts": [v.score for v in got] == [v.score for v in want]})
    for r in rows:
        r["load_1min"] = load_average()[0]
        print(json.dumps(r), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["demo", "verdicts"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sft-steps", type=int, default=500)
    ap.add_argument("--heldout", type=int, default=400)
    ap.add_argument("--seeds", default="0", help="RL seeds (train.seed), comma-separated; SFT always uses 0")
    ap.add_argument("--modes", default="", help="only the modes whose name contains this")
    ap.add_argument("--n", type=int, default=96)
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.what == "demo":
        rows = demo(args.steps, args.sft_steps, args.heldout, seeds, args.modes)
    else:
        rows = verdicts(args.n)
    out = ROOT / "benchmarks" / "results" / f"scale_{args.what}.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
