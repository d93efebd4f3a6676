"""The rollout contracts: what the training loops get from a task's rollouts and what they call to get it.

- `Batch`: one step's rollouts, N = B * G rows (B problems, G samples each): what the losses read (token
  ids and masks, rewards and the other named signals) and what people and monitors read (texts, verdicts,
  metrics, episode transcripts).
- `Scorer`: the recipe's reward as one function from (problems, completions) to verdicts.
- `EvalResult` and `EvalSettings`: a held-out evaluation and how to run it.
- `TaskKind`: how the tasks of one kind (single turn, multi-turn episodes, episodes played by another
  program) are rolled out, evaluated and written as demonstrations, and what their rollouts run with
  (`Support`). A task names its kind (`Task.kind`); `episodes/kinds.py` keeps the registry, so no code
  asks which class a task is.
- `Collector`: where a loop's batches come from (this process, `torchrun`'s ranks, vLLM or Ray workers).

A loss only sees the `Batch`'s tensors, so a rollout of another shape (a multi-turn episode whose
completion interleaves the policy's turns with tool output) plugs in by returning the same `Batch`,
with `completion_mask` set on the policy's own tokens only. The `Collector` and `TaskKind` signatures
take the policy as a torch module and name nothing of a token sequence beyond the `Batch` itself.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ModelConfig, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict

# (problems, completions) -> (one verdict per completion, extra metrics for the step's log line)
Scorer = Callable[[Sequence[Problem], Sequence[str]], tuple[list[Verdict], dict[str, float]]]


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
    # multi-turn episodes only (episodes/multi_turn.py): per-token credit from per-turn rewards, and the transcripts
    turn_advantages: Tensor | None = None  # (N, T) added to the trajectory advantages; None = outcome only
    episodes: list[Any] | None = None  # (N,) EpisodeRecord, written to OUT/episodes.jsonl
    # constraint.probe_prompts: (M,) the costs of this step's probe completions, which the multiplier steps on
    # instead of the batch's own (train/probe.py); None without probe prompts
    probe_costs: Tensor | None = None

    def __post_init__(self) -> None:
        self.signals = {"reward": self.rewards, **self.signals}

    @property
    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(prompt_ids, prompt_mask, completion_ids, completion_mask): the arguments of `sequence_logprobs`."""
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask


def _number_or_null(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass
class EvalResult:
    accuracy: float  # greedy pass@1
    pass_at_k: float  # fraction of problems with at least one of k samples correct
    k: int
    n: int
    mean_len: float
    truncated_frac: float = 0.0  # greedy answers cut off by max_new_tokens
    # greedy accuracy among the answers that ended before max_new_tokens (NaN when none did, null in to_dict so
    # that reports stay valid JSON and compare equal); None = not measured
    finished_accuracy: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    # episodic tasks: `episode_stats` of the greedy episodes (a NaN, e.g. turns per success with no success, is
    # null in to_dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        sampled = {f"pass@{self.k}": self.pass_at_k} if self.k else {}  # k = 0: greedy only, no pass@k
        f = self.finished_accuracy
        finished = {} if f is None else {"finished_accuracy": _number_or_null(f)}
        return {"accuracy": self.accuracy, **sampled, "k": self.k, "n": self.n,
                "mean_len": self.mean_len, "truncated_frac": self.truncated_frac,
                **finished,
                "samples": self.samples,
                **{k: _number_or_null(v) if isinstance(v, float) else v for k, v in self.metrics.items()}}


@dataclass(frozen=True)
class EvalSettings:
    """How a held-out evaluation runs (`episodes/kinds.py:evaluate` has the meaning of each)."""

    max_new_tokens: int
    k: int = 4  # sampled answers per problem for pass@k; 0 = greedy only
    temperature: float = 1.0
    batch_size: int = 256
    seed: int = 1234  # the sampling generator's own seed: evaluating never moves the training streams
    n_samples: int = 5  # greedy answers kept in the result
    truncated_fails: bool = False
    warn_truncated: float = 0.1
    all_done: Callable[[Tensor], bool] | None = None  # when decoding stops (`Ranks.all_done`)


@dataclass(frozen=True)
class Support:
    """What a task kind's rollouts run with besides the collect step in one process; each False is refused
    before any work (`episodes/kinds.py:check_task_kind`), naming the setting."""

    torchrun: bool = False  # torchrun's ranks generate shares of every step (scale/ddp.py, scale/fsdp.py)
    rollout_workers: bool = False  # Ray rollout workers (scale.rollout_workers)
    reward_workers: bool = False  # a pool of Ray verifier workers scores the completions (scale.reward_workers)
    vllm: bool = False  # rollout.backend = "vllm"
    quantized_sampling: bool = False  # rollout.weights other than "fp32"
    recipe_scored: bool = False  # the recipe's scorers ([reward], [cost]) judge the completions


class TaskKind(Protocol):
    """How the tasks of one kind are rolled out and evaluated; registered by name in `episodes/kinds.py`.

    `collect` is the step every on-policy loop shares: B problems from the task's stream, G rollouts each,
    scored, the verdicts fed back to the task (`Task.observe`), one `Batch`. `evaluate` scores the policy on
    held-out problems. `demonstrations` encodes SFT demonstrations (`Task.demonstrate`) as training rows the
    way `collect` encodes rollouts: (prompt_ids, prompt_mask, completion_ids, completion_mask). `for_model`
    is the task as a model with this tokenizer sees it (single-turn prompts in its chat template).
    `refuses` completes refusals of unsupported settings: how this kind's rollouts run, e.g. "its episodes
    are played in one process".
    """

    name: str
    support: Support
    refuses: str

    def for_model(self, task: Task, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig) -> Task: ...

    def collect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch: ...

    def evaluate(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                 problems: list[Problem], settings: EvalSettings) -> EvalResult: ...

    def demonstrations(self, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
                       demos: list[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


class Collector(Protocol):
    """Where a loop's batches come from: this process (`episodes/kinds.py:InProcessCollector`) or workers
    (`feedbackrl.scale`).

    `collect` returns the step's batch; `prefetch` lets an asynchronous collector start sampling the
    next batch now (the loop passes False before a checkpoint, so a resume continues the same run).
    `update` hands over the learner's weights after its `version`-th update.
    """

    def collect(self, prompt_rng: random.Random, sample_rng: torch.Generator, prefetch: bool = False) -> Batch: ...

    def update(self, model: nn.Module, version: int) -> None: ...

    def close(self) -> None: ...
