"""The collect step every on-policy loop shares (GRPO, RLOO, PPO): sample B prompts, roll out G
completions each, score them, feed the verdicts back to the task, and measure the rollout.

A loop calls `collect` once per step and gets a `Batch`: what the losses need (token ids, masks,
rewards) and what people and monitors read (texts, verdicts, metrics). The losses only see the
tensors, so a rollout of another shape (a multi-turn episode whose completion interleaves the
policy's turns with tool output) plugs in by returning the same `Batch`, with `completion_mask` set
on the policy's own tokens only.

Scoring goes through one `Scorer`: the task's verifier (`task_scorer`), or whatever the recipe's
`[reward]` section builds (a learned reward model, a composition of reward sources), optionally
with a hidden gold score logged beside it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.external import ExternalTask
from feedbackrl.envs.multi_turn import EpisodicTask
from feedbackrl.rewards.verdict import Problem, Verdict, fail
from feedbackrl.rollout.generate import Rollout, generate

# (problems, completions) -> (one verdict per completion, extra metrics for the step's log line)
Scorer = Callable[[Sequence[Problem], Sequence[str]], tuple[list[Verdict], dict[str, float]]]


def task_scorer(task: Task) -> Scorer:
    """The task's own verifier (in parallel where the task verifies batches, e.g. code sandboxes)."""
    return lambda problems, completions: (task.verify_batch(problems, completions), {})


@dataclass
class Batch:
    """One step's rollouts. N = B * G rows; rows i*G .. i*G + G - 1 answer problem i."""

    problems: list[Problem]  # (N,) the problem each row answers
    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded
    completion_mask: Tensor  # (N, T) 1 on the policy's own tokens: what the losses train on
    texts: list[str]  # (N,) decoded completions
    verdicts: list[Verdict]  # (N,)
    rewards: Tensor  # (N,) the verdicts' scores
    truncated: Tensor  # (N,) bool: cut off by the token limit
    metrics: dict[str, float] = field(default_factory=dict)
    # named per-completion signals, (N,) each: "reward" (the tensor above) always; "cost" with a [cost] section,
    # "gold" when a proxy-trained run scores the hidden gold too (from the verdicts' details["signals"])
    signals: dict[str, Tensor] = field(default_factory=dict)
    # asynchronous collectors: (N, T) log-probs of the sampled tokens under the policy that sampled
    # them (the behaviour policy); workers' collectors: (N,) the version (updates seen) of the policy that
    # sampled each row
    logprobs: Tensor | None = None
    policy_versions: Tensor | None = None
    # multi-turn episodes only (train/episodes.py): per-token credit from per-turn rewards, and the transcripts
    turn_advantages: Tensor | None = None  # (N, T) added to the trajectory advantages; None = outcome only
    episodes: list[Any] | None = None  # (N,) EpisodeRecord, written to OUT/episodes.jsonl

    def __post_init__(self) -> None:
        self.signals = {"reward": self.rewards, **self.signals}

    @property
    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(prompt_ids, prompt_mask, completion_ids, completion_mask): the arguments of `sequence_logprobs`."""
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask


def fail_truncated(verdicts: Sequence[Verdict], truncated: Sequence[bool]) -> list[Verdict]:
    """Verdicts with every cut-off completion failed (score 0), its original verdict kept as evidence."""
    return [fail("cut off by max_new_tokens before an end token", original=v.reason,
                 **{k: v.details[k] for k in ("signals", "cost") if k in v.details}) if cut else v
            for v, cut in zip(verdicts, truncated, strict=True)]


def verdict_signals(verdicts: Sequence[Verdict], device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The named signals the scorer attached to every verdict (`details["signals"]`) as (N,) tensors."""
    named = [v.details.get("signals", {}) for v in verdicts]
    names = set(named[0]) if named else set()
    if any(set(s) != names for s in named):
        raise ValueError("the scorer attached different signals to the completions of one batch")
    return {k: torch.tensor([float(s[k]) for s in named], device=device) for k in sorted(names)}


def sample_owners(task: Task, cfg: RolloutConfig, prompt_rng: random.Random) -> list[Problem]:
    """B problems from the task, each repeated G times: (N,) the problem each row answers."""
    B, G = cfg.prompts_per_step, cfg.group_size
    problems = [task.sample(prompt_rng) for _ in range(B)]
    return [problems[i // G] for i in range(B * G)]


def score_rollout(task: Task, scorer: Scorer, owners: list[Problem], ro: Rollout, t0: float,
                  t_gen: float, truncated_fails: bool = False) -> Batch:
    """Score the rollout's N completions, feed the verdicts back to the task, measure: the step's Batch.

    t0 and t_gen (perf_counter) are when the step and its scoring started: the metrics' perf/gen_s.
    `truncated_fails` (rollout.truncated_fails) fails every completion cut off by the token limit.
    """
    verdicts, extra = scorer(owners, ro.texts)
    if len(verdicts) != len(owners):
        raise ValueError(f"the reward returned {len(verdicts)} verdicts for {len(owners)} completions")
    if truncated_fails:
        verdicts = fail_truncated(verdicts, ro.truncated.tolist())
    t_score = time.perf_counter()
    task.observe(owners, verdicts)
    rewards = torch.tensor([float(v.score) for v in verdicts], device=ro.completion_ids.device)
    gen_tokens = int(ro.completion_mask.sum())
    metrics = {
        "reward/mean": rewards.mean().item(), "reward/std": rewards.std().item() if len(verdicts) > 1 else 0.0,
        "reward/pass_rate": sum(v.passed for v in verdicts) / len(verdicts),
        "rollout/len_mean": gen_tokens / len(owners), "rollout/truncated_frac": ro.truncated.float().mean().item(),
        "perf/gen_s": t_gen - t0, "perf/score_s": t_score - t_gen, **extra,
    }
    if task.difficulty is not None:  # adaptive tasks: where the controller is now
        metrics["task/difficulty"] = task.difficulty
    return Batch(owners, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, ro.texts, verdicts,
                 rewards, ro.truncated, metrics, verdict_signals(verdicts, ro.completion_ids.device))


def collect(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
            cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
    """Sample `cfg.prompts_per_step` problems, roll out `cfg.group_size` completions each, score, observe."""
    if cfg.weights != "fp32" and isinstance(task, (ExternalTask, EpisodicTask)):
        raise ConfigError(f"rollout.weights = {cfg.weights!r} samples single-turn tasks so far; task {task.name!r} "
                          "plays multi-turn episodes: use rollout.weights = 'fp32'")
    if isinstance(task, ExternalTask):  # another program plays the episodes against the served policy
        from feedbackrl.train.external import collect_external  # it builds a Batch: imported here

        return collect_external(model, tokenizer, task, cfg, prompt_rng, sample_rng)
    if isinstance(task, EpisodicTask):  # multi-turn: the environment's verdict replaces the scorer
        from feedbackrl.train.episodes import collect_episodes  # it builds a Batch: imported here, not at the top

        return collect_episodes(model, tokenizer, task, cfg, prompt_rng, sample_rng)
    t0 = time.perf_counter()
    owners = sample_owners(task, cfg, prompt_rng)
    ro = generate(model, tokenizer, [p.prompt for p in owners], cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                  generator=sample_rng, min_new_tokens=cfg.min_new_tokens, weights=cfg.weights)
    batch = score_rollout(task, scorer, owners, ro, t0, time.perf_counter(), cfg.truncated_fails)
    if cfg.weights != "fp32":  # the sampler's own log-probs: the loop corrects for its gap to the float32 learner
        batch.logprobs = ro.logprobs
    return batch


class Collector(Protocol):
    """Where a loop's batches come from: this process (`InProcessCollector`) or workers (`feedbackrl.scale`).

    `collect` returns the step's batch; `prefetch` lets an asynchronous collector start sampling the
    next batch now (the loop passes False before a checkpoint, so a resume continues the same run).
    `update` hands over the learner's weights after its `version`-th update.
    """

    def collect(self, prompt_rng: random.Random, sample_rng: torch.Generator, prefetch: bool = False) -> Batch: ...

    def update(self, model: PreTrainedModel, version: int) -> None: ...

    def close(self) -> None: ...


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

    def update(self, model: PreTrainedModel, version: int) -> None:
        pass

    def close(self) -> None:
        pass


def minibatches(n: int, parts: int, generator: torch.Generator) -> list[Tensor]:
    """Row indices of `parts` minibatches: all rows in order when parts = 1, else a seeded shuffle."""
    if parts == 1:
        return [torch.arange(n)]
    return list(torch.randperm(n, generator=generator).chunk(parts))
