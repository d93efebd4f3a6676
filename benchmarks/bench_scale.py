"""Ray workers against one process, in one invocation: the demo task's RL phase and the code verifier.

    python benchmarks/bench_scale.py demo [--steps 60 --sft-steps 500 --heldout 400 --seeds 0,1 --modes sync,async]
    python benchmarks/bench_scale.py throughput [--steps 30 --rounds 4]   # samples/s, the modes alternating
    python benchmarks/bench_scale.py verdicts [--n 96]     # code-task verdicts/s: 1 vs 2 verifier workers

demo: the demo recipe's SFT warm start runs once; each mode then trains GRPO for `--steps` steps from
that checkpoint with the same seed and is evaluated (greedy held-out accuracy, 400 problems).
samples/s = steps x 128 completions / RL wall time. Every process runs 1 thread (on a shared machine
2 threads per process lose more to waiting on each other than they gain). Modes: one process;
synchronous with 2 rollout workers (the learner waits); asynchronous, staleness 1, with 1 rollout
worker beside the learner (the 2 cores split between generation and training), with the default
importance-weight cap (2.0) and with 1.2. Each run also keeps its per-step trace of the metrics that
tell a stale batch's health (reward, importance weights, clip fraction, entropy, staleness).
throughput: the same warm start, then one process, synchronous and asynchronous runs of `--steps` steps
alternating (ABCABC..., `--rounds` times) in one process, so that the shared machine's load falls on
every mode alike. samples/s = 128 x the steps after the first two / their summed step time (Ray's start
and the first batches are left out); the 1-minute load average is recorded around every run.
verdicts: `n` distinct one-line programs for the code recipe's problems (3 sandboxed tests each), timed
through the task's own verifier (1 sandbox at a time) and through a Ray pool of 1 and 2 verifier workers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import load_average, provenance

from feedbackrl.config import RunConfig, load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.episodes.kinds import evaluate
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.tiny import make_tiny
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.sft import sft_warmstart

ROOT = Path(__file__).resolve().parents[1]
# per-step costs: the learner's wait for rollouts, scoring, the whole step, the weights' put into the object store
PERF = ("perf/gen_s", "perf/score_s", "perf/step_s", "perf/weights_put_s")
MODES: dict[str, tuple[dict[str, Any], int]] = {  # name -> ([scale] section, learner threads)
    "one process": ({}, 1),
    "sync, 2 rollout workers": ({"rollout_workers": 2}, 1),
    "async (staleness 1), 1 rollout worker": ({"rollout_workers": 1, "max_staleness": 1}, 1),
    "async (staleness 1, cap 1.2), 1 rollout worker": ({"rollout_workers": 1, "max_staleness": 1,
                                                        "importance_cap": 1.2}, 1),
}
# per-step metrics kept for every run (the keys a run logs; the asynchronous ones only there)
TRACE = ("reward/mean", "entropy/mean", "clip_frac", "grad_norm", "is_weight/mean", "is_weight/truncated_frac",
         "scale/staleness_mean", "rollout/len_mean", "perf/step_s")
WARMUP_STEPS = 2  # throughput: steps left out of samples/s (Ray's start, the first batch, no overlap yet)


def selected(modes: str) -> list[str]:
    """The MODES whose name starts with one of the comma-separated `modes` (all when empty), in MODES order."""
    want = [m.strip() for m in modes.split(",") if m.strip()]
    names = [name for name in MODES if not want or any(name.startswith(w) for w in want)]
    if not names:
        raise SystemExit(f"--modes {modes!r} matches none of {list(MODES)}")
    return names


def held_out(model: Any, tok: Any, cfg: RunConfig) -> float:
    task = make_task(cfg.task)
    return evaluate(model, tok, task, task.heldout(cfg.task.heldout_size), cfg.rollout.max_new_tokens,
                    k=1, temperature=1.0, batch_size=cfg.eval.batch_size).accuracy


def warm_start(work: Path, overrides: list[str]) -> tuple[RunConfig, float]:
    """The demo's SFT warm start (seed 0), saved to work/sft: its config and held-out accuracy."""
    base = load_config(ROOT / "recipes" / "reverse_grpo.toml", overrides)
    torch.set_num_threads(1)
    path = make_tiny(work / "base", base.model.size, base.model.init_seed)
    model, tok = load_policy(str(path)), load_tokenizer(str(path))
    sft_warmstart(model, tok, make_task(base.task), base.sft, base.train.seed, MemorySink())
    model.save_pretrained(work / "sft")
    tok.save_pretrained(work / "sft")
    return base, held_out(model, tok, base)


def rl_run(work: Path, overrides: list[str], name: str, seed: int, tag: str = "") -> tuple[Any, Any, MemorySink,
                                                                                            RunConfig, float]:
    """GRPO from the warm start in mode `name`: (model, tokenizer, sink, config, wall seconds)."""
    scale, threads = MODES[name]
    cfg = load_config(ROOT / "recipes" / "reverse_grpo.toml", [*overrides, f"train.seed={seed}"])
    cfg.scale = cfg.scale.model_validate(scale)
    torch.set_num_threads(threads)
    model, tok = load_policy(str(work / "sft")), load_tokenizer(str(work / "sft"))
    sink, t0 = MemorySink(), time.perf_counter()
    train_grpo(cfg, model, tok, make_task(cfg.task), work / f"{name.replace(' ', '_')}_{seed}{tag}", sink)
    wall = time.perf_counter() - t0
    torch.set_num_threads(1)
    return model, tok, sink, cfg, wall


def demo(steps: int, sft_steps: int, heldout: int, seeds: list[int], modes: str,
         save: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp())
    overrides = [f"algo.steps={steps}", f"sft.steps={sft_steps}", f"task.heldout_size={heldout}"]
    base, acc = warm_start(work, overrides)
    rows: list[dict[str, Any]] = [{"mode": "after SFT", "accuracy": acc}]
    for seed in seeds:
        for name in selected(modes):
            load0 = load_average()[0]
            model, tok, sink, cfg, wall = rl_run(work, overrides, name, seed)
            last, by_step = sink.by_step[steps], list(sink.by_step.values())
            medians = {k: statistics.median(r[k] for r in by_step) for k in PERF if k in last}
            rows.append({"mode": name, "seed": seed, "accuracy": held_out(model, tok, cfg), "rl_s": wall,
                         "samples_per_s": steps * 128 / wall, "reward_last": last["reward/mean"],
                         "staleness_mean": last.get("scale/staleness_mean"), "median": medians,
                         "load_1min": [load0, load_average()[0]]})
            print(json.dumps(rows[-1]), flush=True)
            rows[-1]["trace"] = {k: [r.get(k) for r in by_step] for k in TRACE if k in last}
            save(rows)  # what has run so far survives a later run's failure
    return rows


def throughput(steps: int, rounds: int, modes: str,
               save: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """samples/s of each mode, the modes alternating round by round in this one process (see the module doc)."""
    if steps <= WARMUP_STEPS:
        raise SystemExit(f"--steps must be > {WARMUP_STEPS} (the first {WARMUP_STEPS} are not timed)")
    work = Path(tempfile.mkdtemp())
    overrides = [f"algo.steps={steps}", "task.heldout_size=50"]  # the warm start's eval only: kept short
    warm_start(work, overrides)
    rows = []
    for r in range(rounds):
        for name in selected(modes):
            load0 = load_average()[0]
            _, _, sink, _, wall = rl_run(work, overrides, name, seed=0, tag=f"_r{r}")
            timed = [row["perf/step_s"] for s, row in sink.by_step.items() if s > WARMUP_STEPS]
            rows.append({"round": r, "mode": name, "samples_per_s": len(timed) * 128 / sum(timed),
                         "median_step_s": statistics.median(timed), "rl_s": wall,
                         "load_1min": [load0, load_average()[0]]})
            print(json.dumps(rows[-1]), flush=True)
            save(rows)
    return rows


def throughput_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: median samples/s over rounds; per pair of modes, B's samples/s over A's in each round and its
    median (a ratio within one round is what the alternation protects from the machine's load)."""
    names = list(dict.fromkeys(r["mode"] for r in rows))
    by_round: dict[int, dict[str, float]] = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["mode"]] = r["samples_per_s"]
    ratios = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            per_round = [by_round[k][b] / by_round[k][a] for k in sorted(by_round) if {a, b} <= by_round[k].keys()]
            if per_round:
                ratios[f"{b} / {a}"] = {"per_round": per_round, "median": statistics.median(per_round)}
    return {"median_samples_per_s": {n: statistics.median(r["samples_per_s"] for r in rows if r["mode"] == n)
                                     for n in names},
            "ratios": ratios,
            "load_1min": [min(x for r in rows for x in r["load_1min"]), max(x for r in rows for x in r["load_1min"])]}


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
    ap.add_argument("what", choices=["demo", "throughput", "verdicts"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sft-steps", type=int, default=500)
    ap.add_argument("--heldout", type=int, default=400)
    ap.add_argument("--seeds", default="0", help="RL seeds (train.seed), comma-separated; SFT always uses 0")
    ap.add_argument("--modes", default="", help="comma-separated: only the modes whose name starts with one of them")
    ap.add_argument("--rounds", type=int, default=4, help="throughput: how many times each mode runs")
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--out", default="", help="result file name in benchmarks/results (default scale_WHAT.json)")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    result: dict[str, Any] = {"provenance": provenance(), "argv": sys.argv[1:]}
    out = ROOT / "benchmarks" / "results" / (args.out or f"scale_{args.what}.json")

    def save(rows: list[dict[str, Any]]) -> None:
        out.write_text(json.dumps({**result, "rows": rows}, indent=2))

    if args.what == "demo":
        result["rows"] = demo(args.steps, args.sft_steps, args.heldout, seeds, args.modes, save)
    elif args.what == "throughput":
        result["rows"] = throughput(args.steps, args.rounds, args.modes, save)
        result["summary"] = throughput_summary(result["rows"])
        print(json.dumps(result["summary"]), flush=True)
    else:
        result["rows"] = verdicts(args.n)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
