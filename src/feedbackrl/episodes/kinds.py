"""The task kinds and the entry points the loops call: `collect`, `evaluate`, `InProcessCollector`.

A task names its kind (`Task.kind`): "single_turn" (the default, `episodes/single_turn.py`), "episodic"
(`envs/multi_turn.py:EpisodicTask`, played by `episodes/multi_turn.py`) or "external"
(`envs/external.py:ExternalTask`, `episodes/external.py`). `TASK_KINDS` maps the name to the kind's
implementation of the `TaskKind` contract; nothing else looks at what a task is. A new kind (e.g. a
gymnasium environment) is one module with its `TaskKind` and one `register_task_kind` call.

`check_task_kind` refuses, before any work, a recipe that asks a kind for what its rollouts do not run
with (`Support`), naming the setting.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RolloutConfig, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, EvalResult, EvalSettings, Scorer, TaskKind
from feedbackrl.episodes.external import External
from feedbackrl.episodes.multi_turn import Episodic
from feedbackrl.episodes.single_turn import SingleTurn
from feedbackrl.rewards.verdict import Problem
from feedbackrl.rollout import bf16

TASK_KINDS: dict[str, TaskKind] = {"single_turn": SingleTurn(), "episodic": Episodic(), "external": External()}


def register_task_kind(kind: TaskKind) -> None:
    """Make `kind` the implementation of the tasks whose `kind` is `kind.name`."""
    TASK_KINDS[kind.name] = kind


def task_kind(task: Task) -> TaskKind:
    """The implementation of the kind `task` declares (`Task.kind`)."""
    kind = TASK_KINDS.get(task.kind)
    if kind is None:
        raise ConfigError(f"task {task.name!r} declares kind = {task.kind!r}, which no task kind implements; known "
                          f"kinds: {sorted(TASK_KINDS)} (a new one is registered with "
                          "feedbackrl.episodes.kinds.register_task_kind)")
    return kind


def check_rollout(cfg: RolloutConfig, task: Task) -> None:
    """The `[rollout]` sampling settings the task's kind cannot sample with (checked by every collect step)."""
    kind = task_kind(task)
    if cfg.weights == "bf16" and (why := bf16.missing()) is not None:  # this machine's CPU, before any work
        raise ConfigError(why)
    if cfg.weights != "fp32" and not kind.support.quantized_sampling:
        raise ConfigError(f"rollout.weights = {cfg.weights!r} with task.name = {task.name!r}: {kind.refuses}, "
                          "sampled in float32 so far; use rollout.weights = 'fp32'")


def check_task_kind(cfg: RunConfig, task: Task, world: int | None = None, sharded: bool = False) -> None:
    """Refuse, naming the setting, a recipe that asks the task's kind for something its rollouts do not run
    with. `world`: torchrun's WORLD_SIZE (default: from the environment); `sharded`: the policy is sharded
    over the ranks (`scale.learner = "fsdp"`)."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    kind, s = task_kind(task), cfg.scale
    named = f"source = {cfg.reward.source!r}" if cfg.reward.source else f"model = {cfg.reward.model!r}"
    check_rollout(cfg.rollout, task)
    needs = [
        (sharded or (world > 1 and s.learner == "fsdp"), kind.support.torchrun, "scale.learner = 'fsdp'",
         "run it without torchrun"),
        (world > 1, kind.support.torchrun, "torchrun", "run it without torchrun"),
        (cfg.rollout.backend == "vllm", kind.support.vllm, "rollout.backend = 'vllm'",
         "set rollout.backend = 'native'"),
        (s.rollout_workers > 0, kind.support.rollout_workers, f"scale.rollout_workers = {s.rollout_workers}",
         "set scale.rollout_workers = 0"),
        (s.reward_workers > 0, kind.support.reward_workers, f"scale.reward_workers = {s.reward_workers}",
         "set scale.reward_workers = 0"),
        (bool(cfg.reward.source or cfg.reward.model), kind.support.recipe_scored,
         f"[reward] {named}",
         "its rollouts are scored by the environment, not by the recipe's scorers, so that reward would never be "
         "used; remove it from [reward]"),
        (cfg.cost is not None, kind.support.recipe_scored, "[cost]",
         "its rollouts are scored by the environment, not by the recipe's scorers, so no cost would be measured; "
         "remove [cost] (and [constraint])"),
    ]
    for asked, supported, setting, fix in needs:
        if asked and not supported:
            raise ConfigError(f"{setting} with task.name = {task.name!r}: {kind.refuses} so far; {fix}")


def collect(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
            cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
    """One step's batch from the task's kind: `cfg.prompts_per_step` problems, `cfg.group_size` rollouts each,
    scored (by `scorer`, or the environment for episodes), the verdicts fed back to the task."""
    check_rollout(cfg, task)
    return task_kind(task).collect(model, tokenizer, task, scorer, cfg, prompt_rng, sample_rng)


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
             max_new_tokens: int, k: int = 4, temperature: float = 1.0, batch_size: int = 256,
             seed: int = 1234, n_samples: int = 5, truncated_fails: bool = False,
             warn_truncated: float = 0.1, all_done: Callable[[Tensor], bool] | None = None) -> EvalResult:
    """Greedy accuracy and pass@k (k = 0: greedy only, pass@k is NaN) on `problems`, by the task's kind.
    Sampling uses its own generator, so evaluating mid-run never perturbs the training RNG streams (resumed
    runs stay exact). Episodic tasks play whole episodes; external tasks play them against the served policy.

    Reports the fraction of greedy answers cut off by `max_new_tokens` and warns above `warn_truncated`
    (an answer cut off is usually graded on text that never reached its end); `truncated_fails` fails them.
    Episodes end under their task's limits instead (the truncation options do not apply there).
    `all_done`: when decoding stops (`generate`); ranks that share a sharded policy all evaluate, in step.
    """
    settings = EvalSettings(max_new_tokens, k, temperature, batch_size, seed, n_samples, truncated_fails,
                            warn_truncated, all_done)
    return task_kind(task).evaluate(model, tokenizer, task, problems, settings)


@dataclass
class InProcessCollector:
    """The single-process default: `collect` with the learner's own model, nothing to hand over."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    scorer: Scorer
    cfg: RolloutConfig

    def collect(self, prompt_rng: random.Random, sample_rng: torch.Generator, prefetch: bool = False) -> Batch:
        return collect(self.model, self.tokenizer, self.task, self.scorer, self.cfg, prompt_rng, sample_rng)

    def update(self, model: nn.Module, version: int) -> None:
        pass

    def close(self) -> None:
        pass
