"""The one run path: `feedbackrl train RECIPE` (and `feedbackrl demo`) for every algorithm.

build or load the policy -> optional SFT warm start -> held-out evaluation -> the algorithm, looked
up by `algo.name` in `ALGORITHMS` -> held-out evaluation again (when it trains the policy) -> the
gold comparison (when the training signal is not the task's own verifier) -> report.json, the
printed summary and curves.png.

Every algorithm gets the same `Run` (`train/context.py`): the policy on its device, the task, the
metrics sink and the recipe's reward as one `Scorer`. Adding an algorithm is its loop in one file
under train/ (pure losses in algos/), its config class in config.py, and one line here.

`OUT/` after a run: `config.json` (the resolved config), `metrics.jsonl` (one line per step),
`eval_before.json`, `report.json`, `curves.png`; `base_model/` when the model was built locally;
`sft_policy/` after an SFT warm start (reusable as `model.path`); and what the algorithm writes:
`checkpoints/step_N/` (grpo, rloo, ppo; PPO's also hold its value head) and, with a KL term,
`reference.json` (the model directory holding the starting weights) or `reference/` (a copy),
`prefs/*.jsonl` (generated preference data), `reward_model/` (reward_model), `policy/` (dpo),
`labels.db` (online_reward_model).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.data.labeller import gold_score_for
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.base import Task
from feedbackrl.envs.chat import chat_task
from feedbackrl.envs.external import ExternalTask
from feedbackrl.envs.multi_turn import EpisodicTask
from feedbackrl.envs.registry import make_task
from feedbackrl.log import JsonlSink, MetricsSink, MultiSink, TensorBoardSink, console
from feedbackrl.models.load import ModelLoadError, load_policy, load_tokenizer, resolve_model_path
from feedbackrl.models.policy import setup_policy
from feedbackrl.models.tiny import make_tiny
from feedbackrl.monitors.report import alerts_section
from feedbackrl.train.checkpoint import CheckpointError, read_config_json, resolve_resume
from feedbackrl.train.context import Algorithm, Run
from feedbackrl.train.evaluate import EvalResult, evaluate
from feedbackrl.train.grpo import run_grpo
from feedbackrl.train.online_labels import run_online_labels
from feedbackrl.train.ppo import run_ppo
from feedbackrl.train.preference import run_dpo, run_reward_model
from feedbackrl.train.prefs import gold_comparison, gold_scorer, training_reward
from feedbackrl.train.report import print_report, write_plot
from feedbackrl.train.sft import run_sft, sft_warmstart


@dataclass(frozen=True)
class Entry:
    train: Algorithm
    trains_policy: bool = True  # False: the policy is only the starting point (reward models): no eval after
    resumable: bool = False  # `--resume` continues it from a checkpoint
    off_cpu: bool = False  # runs on `train.device` = cuda


ALGORITHMS: dict[str, Entry] = {
    "grpo": Entry(run_grpo, resumable=True, off_cpu=True),
    "rloo": Entry(run_grpo, resumable=True, off_cpu=True),
    "ppo": Entry(run_ppo, resumable=True),
    "dpo": Entry(run_dpo),
    "reward_model": Entry(run_reward_model, trains_policy=False),
    "online_reward_model": Entry(run_online_labels, trains_policy=False),
    "sft": Entry(run_sft, off_cpu=True),
}


def set_threads(n: int, processes_per_node: int = 1) -> None:
    """`train.threads`, or the cores this process can actually get (CPU affinity, the cgroup's CPU quota)
    shared among `processes_per_node` busy processes: never more threads than cores (oversubscribed
    threads that wait on a descheduled peer made a shared 2-core machine many times slower)."""
    from feedbackrl.scale.threads import threads_per_process  # torch only; no Ray

    torch.set_num_threads(threads_per_process(processes_per_node, requested=n))


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


def load_or_build(cfg: RunConfig, out_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = cfg.model.path
    if path == "tiny":
        path = str(make_tiny(out_dir / "base_model", cfg.model.size, cfg.model.init_seed))
    return load_policy(path), load_tokenizer(path)


def start_dir(cfg: RunConfig, out_dir: Path) -> Path | None:
    """A model directory that holds the policy's weights as the algorithm starts (the KL reference), or None:
    the SFT policy the run saved, the tiny model it built, or the local directory it loaded."""
    if cfg.sft.steps and cfg.algo.name != "sft":
        return out_dir / "sft_policy"
    if cfg.model.path == "tiny":
        return out_dir / "base_model"
    try:
        path = Path(resolve_model_path(cfg.model.path))
    except ModelLoadError:
        return None
    return path if (path / "config.json").is_file() else None


def make_sink(cfg: RunConfig, out_dir: Path) -> MetricsSink:
    sinks: list[MetricsSink] = [JsonlSink(out_dir / "metrics.jsonl")]
    if cfg.train.tensorboard:
        sinks.append(TensorBoardSink(out_dir / "tensorboard"))
    return MultiSink(sinks)


def run_eval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, cfg: RunConfig) -> EvalResult:
    problems = task.heldout(cfg.task.heldout_size)
    return evaluate(model, tokenizer, task, problems, cfg.rollout.max_new_tokens, k=cfg.eval.pass_k,
                    temperature=cfg.rollout.temperature, batch_size=cfg.eval.batch_size,
                    truncated_fails=cfg.rollout.truncated_fails, warn_truncated=cfg.eval.warn_truncated)


def model_task(cfg: RunConfig, task: Task, tokenizer: PreTrainedTokenizerBase) -> Task:
    """The task as this model sees it: prompts rendered with its chat template (`model.chat_template`);
    multi-turn and external tasks render their own transcripts."""
    if isinstance(task, EpisodicTask | ExternalTask):
        return task
    return chat_task(task, tokenizer, cfg.model.chat_template, cfg.model.system_prompt)


def start_run(cfg: RunConfig, out_dir: str | Path) -> Path:
    """What every run does first: quiet HF bars, make the out dir, set threads, print and save the config."""
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = cfg.scale  # asynchronous local workers generate while the learner trains: they share the cores
    set_threads(cfg.train.threads, 1 + s.rollout_workers if s.max_staleness and not s.ray_address else 1)
    console.print_json(cfg.model_dump_json())
    (out_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    return out_dir


def _eval_metrics(result: dict[str, Any], k: int) -> dict[str, Any]:
    sampled = {f"eval/pass@{k}": result[f"pass@{k}"]} if k else {}  # eval.pass_k = 0: greedy only
    return {"phase": "eval", "eval/accuracy": result["accuracy"], **sampled}


def check_run(cfg: RunConfig, resume: str | Path | None) -> tuple[Entry, torch.device, Path | None]:
    """Everything that can fail before any work: the algorithm, the device, the checkpoint to resume."""
    entry = ALGORITHMS[cfg.algo.name]
    device = resolve_device(cfg.train.device)
    if cfg.rollout.backend == "vllm":  # installed, and a GPU to run on: checked before any work
        from feedbackrl.scale.vllm_rollout import check_vllm

        check_vllm(device)
    if device.type != "cpu" and not entry.off_cpu:
        on = [name for name, e in ALGORITHMS.items() if e.off_cpu]
        raise ConfigError(f"train.device = {cfg.train.device!r}: algo.name = {cfg.algo.name!r} runs on the CPU only "
                          f"so far (off the CPU: {', '.join(on)})")
    if resume is not None and not entry.resumable:
        can = [name for name, e in ALGORITHMS.items() if e.resumable]
        raise CheckpointError(f"--resume: algo.name = {cfg.algo.name!r} cannot continue from a checkpoint "
                              f"(these can: {', '.join(can)}); start the run again")
    return entry, device, resolve_resume(resume) if resume is not None else None


def prepare_policy(cfg: RunConfig, task: Task, out_dir: Path, ckpt: Path | None, device: torch.device,
                   sink: MetricsSink) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Task, dict[str, Any] | None]:
    """The policy the algorithm starts from, the task as it sees it, and its held-out evaluation: built or
    loaded, `[lora]` and checkpointing applied, then SFT and evaluated; or, resuming, the checkpoint's
    policy (adapters included) and the evaluation the run saved when it started."""
    if ckpt is not None:
        if read_config_json(ckpt) != json.loads(cfg.model_dump_json()):
            console.print("[yellow]warning: resuming with a config that differs from the checkpoint's")
        model, tokenizer = load_policy(str(ckpt)), load_tokenizer(str(ckpt))
    else:
        model, tokenizer = load_or_build(cfg, out_dir)
    model = setup_policy(model.to(device), cfg.lora, cfg.train)  # [lora], gradient checkpointing, precision
    task = model_task(cfg, task, tokenizer)
    if ckpt is not None:
        before_path = out_dir / "eval_before.json"
        return model, tokenizer, task, json.loads(before_path.read_text()) if before_path.exists() else None
    if cfg.sft.steps and cfg.algo.name != "sft":  # a warm start; with algo.name = "sft" it is the algorithm
        sft_warmstart(model, tokenizer, task, cfg.sft, cfg.train.seed, sink)
        model.save_pretrained(out_dir / "sft_policy")
        tokenizer.save_pretrained(out_dir / "sft_policy")
    before = run_eval(model, tokenizer, task, cfg).to_dict()
    (out_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
    sink.log(0, _eval_metrics(before, cfg.eval.pass_k))
    return model, tokenizer, task, before


def run(cfg: RunConfig, out_dir: str | Path, resume: str | Path | None = None) -> dict[str, Any]:
    """Run the recipe into `out_dir`; with `resume`, continue from a checkpoint (SFT is not redone)."""
    entry, device, ckpt = check_run(cfg, resume)
    t_start = time.perf_counter()
    out_dir = start_run(cfg, out_dir)
    task = make_task(cfg.task)
    reward = training_reward(cfg, task)
    proxy = cfg.algo.name == "dpo" or reward != task.verify_batch  # trained on something other than the verifier
    sink = make_sink(cfg, out_dir)
    report: dict[str, Any] = {"task": cfg.task.name, "algo": cfg.algo.name,
                              "reward": cfg.reward.model or cfg.reward.source or "verifier"}
    try:
        model, tokenizer, task, before = prepare_policy(cfg, task, out_dir, ckpt, device, sink)
        baseline = copy.deepcopy(model).eval() if proxy and entry.trains_policy else None

        def on_eval(step: int) -> dict[str, Any]:
            r = run_eval(model, tokenizer, task, cfg)
            return {k: v for k, v in _eval_metrics(r.to_dict(), r.k).items() if k != "phase"}

        gold = gold_score_for(task) if proxy else None  # the hidden score a proxy-trained policy is judged by
        scorer = gold_scorer(reward, gold)
        t_train = time.perf_counter()
        start = None if ckpt is not None else start_dir(cfg, out_dir)
        report.update(entry.train(Run(cfg, out_dir, model, tokenizer, task, sink, device, scorer, ckpt, on_eval,
                                      start)))
        report["train_seconds"] = time.perf_counter() - t_train
        report["eval_before"], report["eval_after"] = before, None
        if entry.trains_policy:
            after = run_eval(model, tokenizer, task, cfg).to_dict()
            # at the algorithm's last step, not a longer SFT warm start's
            last = max((r["step"] for r in read_jsonl(out_dir / "metrics.jsonl") if r.get("phase") != "sft"),
                       default=0)
            sink.log(last, _eval_metrics(after, cfg.eval.pass_k))
            report["eval_after"] = after
        if report.get("prefs", {}).get("gold") is False:  # the user's own pairs: the task's gold says nothing
            baseline = None
            report["no_gold"] = (f"trained on preferences from {report['prefs']['source']} that carry no gold score: "
                                 "no gold comparison with the starting policy; judge it on your own held-out data")
        if baseline is not None and gold is not None:
            report["gold_vs_sft"] = gold_comparison(model, baseline, tokenizer, task.heldout(cfg.task.heldout_size),
                                                    gold, cfg.rollout.max_new_tokens, cfg.rollout.temperature)
        report["alerts"] = alerts_section(out_dir)  # the monitors' alerts (none when they are off)
    finally:
        sink.close()
    report.update(wall_seconds=time.perf_counter() - t_start, resumed_from=str(ckpt) if ckpt else None)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_plot(out_dir / "metrics.jsonl", out_dir / "curves.png", f"{cfg.task.name} / {cfg.algo.name}")
    print_report(report)
    return report
