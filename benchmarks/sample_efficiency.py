"""Sample efficiency on the demo task: feedbackrl's GRPO and TRL's GRPOTrainer from the same start.

    python benchmarks/sample_efficiency.py                       # 2 seeds x 120 steps each (~15-25 min at 1 thread)
    python benchmarks/sample_efficiency.py --seeds 0 --steps 60  # a quicker look

Speed must not be bought with learning: steps to reach the same held-out accuracy should be
no more than TRL's at the same settings. Both sides start from one SFT checkpoint (the demo's
recipe, recipes/reverse_grpo.toml: noisy demonstrations, so greedy decoding copies long words) and
train with the demo's GRPO settings: 16 prompts x 8 samples per step, up to 8 new tokens with EOS,
temperature 1, lr 5e-4 constant, AdamW, clip 0.2, grad-norm clip 1.0, token-mean (DAPO) loss,
group-std-scaled advantages, no KL, one update per batch, fp32. The reward is the task's verifier
on both sides. Every `--eval-every` steps both are evaluated by the same function
(`feedbackrl.episodes.kinds.evaluate`, greedy, 400 held-out words). Prompts: ours are drawn by the
run's seeded RNG, TRL's from a shuffled dataset of prompts drawn the same way: same distribution,
not the same order.

Writes benchmarks/results/sample_efficiency.json and .md (accuracy after every eval; per run the
first step at which held-out accuracy reaches each threshold) and docs/sample_efficiency.png.
`--replot` redraws the table and plot from the JSON without training.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import provenance

from feedbackrl.log import MemorySink

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RECIPE = HERE.parent / "recipes" / "reverse_grpo.toml"
PLOT = HERE.parent / "docs" / "sample_efficiency.png"
THRESHOLDS = (0.5, 0.6, 0.7, 0.75)


def heldout_accuracy(model: Any, tokenizer: Any, task: Any, cfg: Any) -> float:
    from feedbackrl.episodes.kinds import evaluate

    problems = task.heldout(cfg.task.heldout_size)
    return evaluate(model, tokenizer, task, problems, cfg.rollout.max_new_tokens, k=1).accuracy


def build_sft(cfg: Any, out: Path) -> Path:
    """The demo's SFT warm start, once: both frameworks start from this checkpoint."""
    from feedbackrl.envs.registry import make_task
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.tiny import make_tiny
    from feedbackrl.train.sft import sft_warmstart

    base = make_tiny(out / "base", cfg.model.size, cfg.model.init_seed)
    model, tokenizer = load_policy(str(base)), load_tokenizer(str(base))
    sft_warmstart(model, tokenizer, make_task(cfg.task), cfg.sft, cfg.train.seed, MemorySink())
    model.save_pretrained(out / "sft")
    tokenizer.save_pretrained(out / "sft")
    return out / "sft"


def run_ours(cfg: Any, sft: Path, seed: int, steps: int, every: int) -> list[tuple[int, float]]:
    from feedbackrl.config import build_config
    from feedbackrl.envs.registry import make_task
    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.train.grpo import train_grpo

    data = cfg.model_dump()
    data["algo"].update(steps=steps)
    data["train"].update(seed=seed, checkpoint_every=0)
    data["eval"].update(every=every)
    run_cfg = build_config(data)
    model, tokenizer = load_policy(str(sft)), load_tokenizer(str(sft))
    task = make_task(run_cfg.task)
    curve = [(0, heldout_accuracy(model, tokenizer, task, run_cfg))]

    def on_eval(step: int) -> dict[str, Any]:
        curve.append((step, heldout_accuracy(model, tokenizer, task, run_cfg)))
        return {}

    with tempfile.TemporaryDirectory() as out:
        train_grpo(run_cfg, model, tokenizer, task, Path(out), MemorySink(), on_eval=on_eval)
    curve.append((steps, heldout_accuracy(model, tokenizer, task, run_cfg)))
    return curve


def run_trl(cfg: Any, sft: Path, seed: int, steps: int, every: int) -> list[tuple[int, float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from feedbackrl.envs.registry import make_task

    task = make_task(cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(sft)
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    rng = random.Random(seed)
    B, G = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    problems = [task.sample(rng) for _ in range(B * (steps + 2))]
    data = Dataset.from_list([{"prompt": p.prompt, "idx": i} for i, p in enumerate(problems)])

    def reward(prompts: list[str], completions: list[str], idx: list[int], **_: Any) -> list[float]:
        return [task.verify(problems[i], c).score for i, c in zip(idx, completions, strict=True)]

    curve = [(0, heldout_accuracy(model, tokenizer, task, cfg))]

    class Eval(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, *rest: Any, **kw: Any) -> None:
            if state.global_step % every == 0 or state.global_step == steps:
                curve.append((state.global_step, heldout_accuracy(model, tokenizer, task, cfg)))

    with tempfile.TemporaryDirectory() as out:
        targs = GRPOConfig(
            output_dir=out, per_device_train_batch_size=B * G, num_generations=G,
            max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=1.0,
            learning_rate=cfg.algo.lr, lr_scheduler_type="constant", weight_decay=cfg.algo.weight_decay,
            max_grad_norm=cfg.algo.max_grad_norm, epsilon=cfg.algo.clip_low, epsilon_high=cfg.algo.clip_high,
            beta=cfg.algo.kl_coef, loss_type="dapo", scale_rewards="group", num_iterations=1,
            bf16=False, use_cpu=True, report_to="none", logging_steps=1, max_steps=steps, save_strategy="no",
            disable_tqdm=True, seed=seed, dataloader_num_workers=0,
        )
        GRPOTrainer(model=model, reward_funcs=[reward], args=targs, train_dataset=data, processing_class=tokenizer,
                    callbacks=[Eval()]).train()
    return curve


def first_reach(curve: list[tuple[int, float]], x: float) -> int | None:
    return next((step for step, acc in curve if acc >= x), None)


def report(res: dict[str, Any]) -> str:
    lines = [f"Run {res['date']}, torch threads {res['threads']}, {res['steps']} GRPO steps per run, eval every "
             f"{res['eval_every']} steps on {res['heldout']} held-out words (greedy), settings of "
             "recipes/reverse_grpo.toml on both sides, fp32.", "",
             "| run | accuracy at step 0 -> end | " + " | ".join(f"steps to {x:.2f}" for x in THRESHOLDS) + " |",
             "|---|---|" + "---|" * len(THRESHOLDS)]
    for run in res["runs"]:
        c = run["curve"]
        reach = [first_reach(c, x) for x in THRESHOLDS]
        lines.append(f"| {run['framework']} seed {run['seed']} | {c[0][1]:.3f} -> {c[-1][1]:.3f} | "
                     + " | ".join("-" if r is None else str(r) for r in reach) + " |")
    for fw in ("feedbackrl", "trl"):
        ends = [run["curve"][-1][1] for run in res["runs"] if run["framework"] == fw]
        if ends:
            lines.append(f"\n{fw}: final accuracy mean {statistics.mean(ends):.3f} over {len(ends)} seed(s)")
    lines.append("\n'-': not reached within the run. Curves (step, accuracy) are in sample_efficiency.json.")
    return "\n".join(lines)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    styles = {"feedbackrl": ("tab:blue", "-"), "trl": ("tab:orange", "--")}
    for run in res["runs"]:
        steps, acc = zip(*run["curve"], strict=True)
        color, line = styles.get(run["framework"], ("gray", ":"))
        ax.plot(steps, acc, color=color, linestyle=line, marker="o", markersize=3,
                label=f"{run['framework']} seed {run['seed']}")
    ax.set_xlabel("GRPO step (16 prompts x 8 samples)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("Demo task from one SFT checkpoint: feedbackrl vs TRL 1.16")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--frameworks", default="feedbackrl,trl")
    ap.add_argument("--replot", action="store_true", help="redraw table and plot from the last JSON; no training")
    args = ap.parse_args()
    if args.replot:
        res = json.loads((RESULTS / "sample_efficiency.json").read_text())
        plot(res, PLOT)
        print(report(res))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from feedbackrl.config import load_config

    hf_logging.disable_progress_bar()
    cfg = load_config(RECIPE)
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": args.threads, "steps": args.steps,
                           "eval_every": args.eval_every, "heldout": cfg.task.heldout_size, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sft = build_sft(cfg, Path(tmp))
        print(f"SFT checkpoint built in {time.perf_counter() - t0:.0f} s", flush=True)
        for seed in (int(s) for s in args.seeds.split(",")):
            for fw in args.frameworks.split(","):
                t0 = time.perf_counter()
                curve = (run_ours if fw == "feedbackrl" else run_trl)(cfg, sft, seed, args.steps, args.eval_every)
                res["runs"].append({"framework": fw, "seed": seed, "curve": curve,
                                    "wall_s": time.perf_counter() - t0})
                print(f"{fw} seed {seed}: {curve}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sample_efficiency.json").write_text(json.dumps({"provenance": provenance(), **res}, indent=1))
    md = report(res)
    (RESULTS / "sample_efficiency.md").write_text(md + "\n")
    plot(res, PLOT)
    print(md)


if __name__ == "__main__":
    main()
