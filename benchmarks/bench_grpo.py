"""Lock-step GRPO workers, feedbackrl's `train_grpo` and TRL's `GRPOTrainer`; run by benchmarks/run.py.

    python benchmarks/bench_grpo.py {feedbackrl,trl} --model DIR --length 16 --steps 10 --threads 2

Each worker is its own process (so its peak RSS is its own) and trains exactly as its framework
does. Both pause at the end of every step: the worker prints `BENCH_STEP {json}` and waits for a
line on stdin before it goes on, so the parent runs one framework's step, then the other's, and
the two alternate under the same machine load. A step's time runs from the moment the worker is
released to the end of that step, so everything the trainer does between two steps (logging,
progress bars, the next batch's sampling) counts once and the pause itself never counts.

Settings (the baseline's bench_trl.py `worker_grpo`): 8 prompts x 8 samples = 64 completions per
step, EOS suppressed (`min_new_tokens` = L) so every step generates and trains on exactly 64 x L
tokens, lr 1e-4, KL coefficient 0 (no reference model), one optimisation pass per batch, clip 0.2,
grad-norm clip 1.0, token-mean (DAPO) loss, group-std-scaled advantages, fp32 (or `--precision bf16`), no gradient
checkpointing. The first `--warmup` steps are timed but excluded from the medians. `--rollout-weights int8`
or `bf16` (feedbackrl only) samples the rollouts with int8 or bf16 matmuls (`rollout.weights`), training stays
fp32.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULT_TAG, STEP_TAG, SumTask, emit, peak_rss_mib, setup_threads, sum_dataset, sum_reward

PROMPTS_PER_STEP, GROUP = 8, 8
LR = 1e-4


class LockStep:
    """Report a finished step, then block until the parent says go; times steps between releases."""

    def __init__(self) -> None:
        self.released = time.perf_counter()
        self.cpu = time.process_time()

    def wait(self) -> None:
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("parent closed the pipe")
        self.released, self.cpu = time.perf_counter(), time.process_time()

    def step_done(self, step: int, **extra: Any) -> None:
        emit(STEP_TAG, {"step": step, "step_s": time.perf_counter() - self.released,
                        "cpu_s": time.process_time() - self.cpu, "peak_rss_mib": peak_rss_mib(), **extra})
        self.wait()


def run_feedbackrl(args: argparse.Namespace) -> dict[str, Any]:
    import feedbackrl.train.grpo as online
    from feedbackrl.config import build_config
    from feedbackrl.models.load import load_policy, load_tokenizer

    cfg = build_config({
        "rollout": {"prompts_per_step": PROMPTS_PER_STEP, "group_size": GROUP, "max_new_tokens": args.length,
                    "temperature": 1.0, "top_p": 1.0, "min_new_tokens": args.length,
                    "weights": args.rollout_weights},
        "algo": {"name": "grpo", "steps": args.steps, "lr": LR, "kl_coef": 0.0, "epochs": 1, "minibatches": 1,
                 "clip_low": 0.2, "clip_high": 0.2, "max_grad_norm": 1.0, "weight_decay": 0.0,
                 "aggregation": "token_mean", "scale_advantages": True},
        "train": {"seed": 0, "checkpoint_every": 0, "micro_batch_size": args.micro_batch_size,
                  "precision": args.precision},
    })
    model, tokenizer = load_policy(args.model), load_tokenizer(args.model)
    lock = LockStep()

    class Sink:
        def log(self, step: int, metrics: dict[str, Any]) -> None:
            lock.step_done(step, gen_s=metrics["perf/gen_s"], completion_len=metrics["rollout/len_mean"],
                           reward=metrics["reward/mean"])

        def close(self) -> None:
            pass

    emit(STEP_TAG, {"ready": True})
    lock.wait()
    with tempfile.TemporaryDirectory() as out:
        online.train_grpo(cfg, model, tokenizer, SumTask(), Path(out), Sink())
    return {}


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    gen_times: list[float] = []
    generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = generate(*a, **k)
        gen_times.append(time.perf_counter() - t)
        return out

    model.generate = timed_generate
    lock = LockStep()

    class Callback(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            emit(STEP_TAG, {"ready": True})
            lock.wait()

        def on_step_end(self, a: Any, state: Any, *rest: Any, **k: Any) -> None:
            logs = [h for h in state.log_history if "completions/mean_length" in h]
            lock.step_done(state.global_step, gen_s=gen_times[-1] if gen_times else None,
                           completion_len=logs[-1]["completions/mean_length"] if logs else None,
                           reward=logs[-1].get("reward") if logs else None)

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, per_device_train_batch_size=PROMPTS_PER_STEP * GROUP, num_generations=GROUP,
            max_completion_length=args.length, learning_rate=LR, bf16=args.precision == "bf16", use_cpu=True,
            gradient_checkpointing=False, beta=0.0, report_to="none", logging_steps=1, max_steps=args.steps,
            save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
            generation_kwargs={"min_new_tokens": args.length},
        )
        data = Dataset.from_list(sum_dataset(max(512, PROMPTS_PER_STEP * args.steps * 2)))
        trainer = GRPOTrainer(model=model, reward_funcs=[sum_reward], args=cfg, train_dataset=data,
                              processing_class=tok, callbacks=[Callback()])
        trainer.train()
    return {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=["feedbackrl", "trl"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--length", type=int, required=True, help="L: completion tokens (EOS suppressed)")
    ap.add_argument("--steps", type=int, required=True, help="all steps, warm-up included")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--micro-batch-size", type=int, default=0,
                    help="feedbackrl: train.micro_batch_size (0 = all 64 completions in one forward/backward)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: feedbackrl's train.precision (autocast, fp32 master weights); TRL's bf16=True")
    ap.add_argument("--rollout-weights", choices=["fp32", "int8", "bf16"], default="fp32",
                    help="feedbackrl: rollout.weights (int8 / bf16 sampling, importance-weighted; training fp32)")
    args = ap.parse_args()
    if args.framework == "trl" and args.rollout_weights != "fp32":
        ap.error("--rollout-weights is feedbackrl's option; TRL samples with the model's own weights")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    setup_threads(args.threads)
    res = (run_feedbackrl if args.framework == "feedbackrl" else run_trl)(args)
    emit(RESULT_TAG, {**res, "peak_rss_mib": peak_rss_mib()})


if __name__ == "__main__":
    main()
