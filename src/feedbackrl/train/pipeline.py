"""One run, start to finish: build or load the policy, optional SFT warm start, evaluate, RL,
evaluate again, write the report, the metrics and the plot.

`OUT/` after a run: `config.json` (resolved config), `metrics.jsonl` (one line per step),
`report.json`, `curves.png`, `checkpoints/step_*/` and, when built locally, `base_model/`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.registry import make_task
from feedbackrl.log import JsonlSink, MetricsSink, MultiSink, TensorBoardSink, console
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.tiny import make_tiny
from feedbackrl.train.checkpoint import CheckpointError, read_config_json, resolve_resume
from feedbackrl.train.evaluate import EvalResult, evaluate
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.report import print_report, write_plot
from feedbackrl.train.rlhf import finish_rlhf, run_rlhf
from feedbackrl.train.sft import sft_warmstart


def set_threads(n: int) -> None:
    torch.set_num_threads(n or os.cpu_count() or 1)


def resolve_device(name: str) -> torch.device:
    """`train.device` -> a torch device; 'auto' is the first GPU when torch sees one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but torch sees no CUDA device (a CPU build of torch, or no GPU "
                         "here); use 'cpu' or 'auto'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"train.device = {name!r} but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def load_or_build(cfg: RunConfig, out_dir: Path) -> tuple[Any, Any]:
    path = cfg.model.path
    if path == "tiny":
        path = str(make_tiny(out_dir / "base_model", cfg.model.size, cfg.model.init_seed))
    return load_policy(path), load_tokenizer(path)


def make_sink(cfg: RunConfig, out_dir: Path) -> MetricsSink:
    sinks: list[MetricsSink] = [JsonlSink(out_dir / "metrics.jsonl")]
    if cfg.train.tensorboard:
        sinks.append(TensorBoardSink(out_dir / "tensorboard"))
    return MultiSink(sinks)


def run_eval(model: Any, tokenizer: Any, task: Task, cfg: RunConfig) -> EvalResult:
    problems = task.heldout(cfg.task.heldout_size)
    return evaluate(model, tokenizer, task, problems, cfg.rollout.max_new_tokens, k=cfg.eval.pass_k,
                    temperature=cfg.rollout.temperature, batch_size=cfg.eval.batch_size)


def start_run(cfg: RunConfig, out_dir: str | Path) -> Path:
    """What every run does first: quiet HF bars, make the out dir, set threads, print and save the config."""
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    set_threads(cfg.train.threads)
    console.print_json(cfg.model_dump_json())
    (out_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    return out_dir


def _eval_metrics(result: dict[str, Any], k: int) -> dict[str, Any]:
    return {"phase": "eval", "eval/accuracy": result["accuracy"], f"eval/pass@{k}": result[f"pass@{k}"]}


def run(cfg: RunConfig, out_dir: str | Path, resume: str | Path | None = None) -> dict[str, Any]:
    """Run the recipe into `out_dir`; with `resume`, continue RL from a checkpoint (SFT is not redone)."""
    if cfg.algo.name not in ("grpo", "rloo") or cfg.reward.model:
        return run_preference(cfg, out_dir, resume)
    device = resolve_device(cfg.train.device)  # before any work: a bad device fails the run at once
    t_start = time.perf_counter()
    out_dir = start_run(cfg, out_dir)
    task = make_task(cfg.task)
    ckpt = resolve_resume(resume) if resume is not None else None
    sink = make_sink(cfg, out_dir)
    try:
        if ckpt is not None:
            saved = read_config_json(ckpt)
            if saved != json.loads(cfg.model_dump_json()):
                console.print("[yellow]warning: resuming with a config that differs from the checkpoint's")
            model, tokenizer = load_policy(str(ckpt)).to(device), load_tokenizer(str(ckpt))
            before = json.loads((out_dir / "eval_before.json").read_text()) \
                if (out_dir / "eval_before.json").exists() else None
        else:
            model, tokenizer = load_or_build(cfg, out_dir)
            model.to(device)
            if cfg.sft.steps:
                sft_warmstart(model, tokenizer, task, cfg.sft, cfg.train.seed, sink)
            before = run_eval(model, tokenizer, task, cfg).to_dict()
            (out_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
            sink.log(0, _eval_metrics(before, cfg.eval.pass_k))

        def on_eval(step: int) -> dict[str, Any]:
            r = run_eval(model, tokenizer, task, cfg)
            return {"eval/accuracy": r.accuracy, f"eval/pass@{r.k}": r.pass_at_k}

        t_rl = time.perf_counter()
        train_grpo(cfg, model, tokenizer, task, out_dir, sink, resume_from=ckpt, on_eval=on_eval)
        rl_seconds = time.perf_counter() - t_rl
        after = run_eval(model, tokenizer, task, cfg).to_dict()
        sink.log(cfg.algo.steps, _eval_metrics(after, cfg.eval.pass_k))
    finally:
        sink.close()
    report = {"task": cfg.task.name, "algo": cfg.algo.name, "steps": cfg.algo.steps, "eval_before": before,
              "eval_after": after, "rl_seconds": rl_seconds, "wall_seconds": time.perf_counter() - t_start,
              "resumed_from": str(ckpt) if ckpt else None}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_plot(out_dir / "metrics.jsonl", out_dir / "curves.png")
    print_report(report)
    return report


def run_preference(cfg: RunConfig, out_dir: str | Path, resume: str | Path | None = None) -> dict[str, Any]:
    """reward_model, dpo, ppo, or online RL against a learned reward: see `train/rlhf.py`."""
    if resume is not None:
        raise CheckpointError(f"--resume works for grpo and rloo against the task's verifier only, not "
                              f"algo.name={cfg.algo.name!r} with reward.model={cfg.reward.model!r}")
    if resolve_device(cfg.train.device).type != "cpu":
        raise ConfigError(f"train.device = {cfg.train.device!r}: only the SFT + GRPO/RLOO pipeline runs off the CPU "
                         f"so far, not algo.name={cfg.algo.name!r} with reward.model={cfg.reward.model!r}")
    out_dir = start_run(cfg, out_dir)
    sink = make_sink(cfg, out_dir)
    try:
        model, tokenizer = load_or_build(cfg, out_dir)
        report = run_rlhf(cfg, model, tokenizer, out_dir, sink)
    finally:
        sink.close()
    finish_rlhf(report, out_dir)
    return report
