"""DPO and reward-model training throughput: optimizer steps per second, ours vs TRL, one run.

Run: .venv/bin/python benchmarks/bench_preference.py [--threads 2] [--steps 12] [--repeats 3] [--size small]
       [--parts dpo]
Prints a markdown table and writes benchmarks/results/preference.json (benchmarks/run.py runs the DPO
part for both sizes as one of its sections).

Same tiny or small model (the char-level Llamas of `models/tiny.py`, seed 0), same data and
batch as the TRL CPU anchor (its DPO part): 16 pairs per step, prompt
"Question: what is a+b? Answer: " (31 tokens), chosen/rejected "a+b=s, so the answer is s."
with a right or wrong sum (~26 tokens + EOS). max_length is set high enough that TRL truncates
nothing, so both sides see the same tokens. fp32, lr 1e-4, no gradient checkpointing.

What each side does per step:
- DPO, ours: `train.preference.train_dpo` (one policy forward/backward over 2 x 16 rows; the
  reference log-probs were computed once before the first step and are not in the step time).
  TRL: `DPOTrainer` with its default `precompute_ref_log_probs=False`, so a reference forward is
  part of every step; the `trl_precompute` row turns that on for a like-for-like comparison.
- Reward model, ours: `train.preference.train_reward_model` (`models/reward.py`: backbone +
  scalar head, 2 x 16 rows per step). TRL: `RewardTrainer` on `LlamaForSequenceClassification`
  loaded from the same directory (num_labels = 1).

Step time is the wall time between consecutive optimizer steps (our sink's `log` calls, TRL's
`on_step_end`), median over the timed steps after `--warmup`; each variant runs `--repeats`
times, interleaved, and the median repeat is reported. TRL is optional: without it the script
reports our numbers and says TRL is missing. The machine is shared, so ratios from one run
(same conditions for both sides) are more meaningful than absolute steps/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULT_TAG, emit, provenance  # the tag lets run.py read the result off stdout

from feedbackrl.config import DPOConfig, RewardModelConfig
from feedbackrl.data.preferences import PreferencePair
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.reward import build_reward_model
from feedbackrl.models.tiny import make_tiny
from feedbackrl.train.preference import train_dpo, train_reward_model

RESULTS = Path(__file__).parent / "results" / "preference.json"
BATCH = 16


def make_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        wrong = a + b + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
        rows.append({"prompt": f"Question: what is {a}+{b}? Answer: ",
                     "chosen": f"{a}+{b}={a + b}, so the answer is {a + b}.",
                     "rejected": f"{a}+{b}={wrong}, so the answer is {wrong}."})
    return rows


class StepTimes:
    """A metrics sink that only records when each optimizer step ended."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ends: list[float] = []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if metrics.get("phase") in ("dpo", "rm"):
            self.ends.append(time.perf_counter())

    def close(self) -> None:
        pass

    def durations(self) -> list[float]:
        ts = [self.t0, *self.ends]
        return [b - a for a, b in zip(ts[:-1], ts[1:], strict=True)]


def ours(kind: str, model_dir: str, rows: list[dict[str, str]], warmup: int) -> float:
    torch.manual_seed(0)
    tok = load_tokenizer(model_dir)
    pairs = [PreferencePair(r["prompt"], r["chosen"], r["rejected"]) for r in rows]
    timer = StepTimes()
    if kind == "dpo":
        model = load_policy(model_dir)
        cfg = DPOConfig(epochs=1, batch_size=BATCH, lr=1e-4)
        from feedbackrl.train import preference

        ref = preference.reference_logprobs(model, tok, preference.as_ranked(pairs))  # once, untimed
        original = preference.reference_logprobs
        preference.reference_logprobs = lambda *a, **k: ref
        try:
            timer.t0 = time.perf_counter()
            train_dpo(cfg, model, tok, pairs, seed=0, sink=timer)
        finally:
            preference.reference_logprobs = original
    else:
        rm = build_reward_model(load_policy(model_dir), head_type="last_token")  # the head TRL uses: like for like
        cfg = RewardModelConfig(epochs=1, batch_size=BATCH, lr=1e-4)
        held = pairs[:BATCH]  # train_reward_model evaluates before and after; not in the step times
        timer.t0 = time.perf_counter()
        train_reward_model(cfg, rm, tok, pairs, held, seed=0, sink=_AfterEval(timer))
    return statistics.median(timer.durations()[warmup:])


class _AfterEval:
    """Restart the clock after the untimed held-out evaluation that precedes step 1."""

    def __init__(self, timer: StepTimes) -> None:
        self.timer = timer

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if metrics.get("phase") == "rm_eval" and step == 0:
            self.timer.t0 = time.perf_counter()
        self.timer.log(step, metrics)

    def close(self) -> None:
        pass


def trl_variant(kind: str, model_dir: str, rows: list[dict[str, str]], warmup: int, precompute: bool = False) -> float:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, TrainerCallback
    from trl import DPOConfig as TRLDPOConfig
    from trl import DPOTrainer, RewardConfig, RewardTrainer

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.t0 = 0.0

        def on_train_begin(self, args, state, control, **kw) -> None:  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw) -> None:  # noqa: ANN001
            self.ends.append(time.perf_counter())

    torch.manual_seed(0)
    tok = load_tokenizer(model_dir)
    ds = Dataset.from_list(rows)
    timer = Timer()
    common = dict(per_device_train_batch_size=BATCH, learning_rate=1e-4, bf16=False, use_cpu=True,
                  gradient_checkpointing=False, report_to="none", logging_steps=1, num_train_epochs=1,
                  save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, max_length=256)
    with tempfile.TemporaryDirectory() as out:
        if kind == "dpo":
            args = TRLDPOConfig(output_dir=out, precompute_ref_log_probs=precompute, **common)
            trainer = DPOTrainer(model=load_policy(model_dir), args=args, train_dataset=ds, processing_class=tok,
                                 callbacks=[timer])
        else:
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
            model.config.pad_token_id = tok.pad_token_id
            args = RewardConfig(output_dir=out, **common)
            trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[timer])
        trainer.train()
    ts = [timer.t0, *timer.ends]
    return statistics.median([b - a for a, b in zip(ts[:-1], ts[1:], strict=True)][warmup:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per repeat (warmup included)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--size", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--parts", default="dpo,rm", help="comma-separated: dpo, rm")
    ap.add_argument("--model", type=Path, help="an existing model dir of that size (else built in a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rows = make_rows(BATCH * args.steps)
    try:
        import trl

        trl_version: str | None = trl.__version__
    except ImportError:
        trl_version = None
    parts = args.parts.split(",")
    variants: dict[str, Any] = {}
    if "dpo" in parts:
        variants["dpo/ours"] = lambda d: ours("dpo", d, rows, args.warmup)
        if trl_version:
            variants["dpo/trl"] = lambda d: trl_variant("dpo", d, rows, args.warmup)
            variants["dpo/trl_precompute"] = lambda d: trl_variant("dpo", d, rows, args.warmup, precompute=True)
    if "rm" in parts:
        variants["rm/ours"] = lambda d: ours("rm", d, rows, args.warmup)
        if trl_version:
            variants["rm/trl"] = lambda d: trl_variant("rm", d, rows, args.warmup)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(args.model or make_tiny(Path(tmp) / args.size, args.size, 0))
        for _ in range(args.repeats):
            for name, fn in variants.items():  # interleaved, so load changes hit every variant alike
                times[name].append(fn(model_dir))
    steps_per_s = {k: 1.0 / statistics.median(v) for k, v in times.items()}
    result: dict[str, Any] = {
        "steps_per_s": steps_per_s, "step_s_all_repeats": times,
        "ratio_ours_over_trl": {kind: steps_per_s[f"{kind}/ours"] / steps_per_s[f"{kind}/trl"]
                                for kind in ("dpo", "rm") if {f"{kind}/trl", f"{kind}/ours"} <= steps_per_s.keys()},
        "trl": trl_version or "not installed (pip install trl==1.16.0 to compare)",
        "settings": {"batch_pairs": BATCH, "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
                     "repeats": args.repeats, "model": args.size, "dtype": "float32"},
        "loadavg_before_after": [load_before, os.getloadavg()],
        "provenance": provenance(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    if trl_version and "dpo" in parts:
        result["ratio_ours_over_trl"]["dpo_vs_trl_precompute"] = steps_per_s["dpo/ours"] / steps_per_s[
            "dpo/trl_precompute"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print("| variant | steps/s |\n|---|---|")
    for k, v in steps_per_s.items():
        print(f"| {k} | {v:.2f} |")
    print("ratios ours/TRL:", {k: round(v, 2) for k, v in result["ratio_ours_over_trl"].items()} or result["trl"])
    if emit is not None:
        emit(RESULT_TAG, result)


if __name__ == "__main__":
    main()
