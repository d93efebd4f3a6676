"""Held-out evaluation: greedy pass@1 and sampled pass@k on a task's fixed held-out problems."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.envs.base import Task
from feedbackrl.envs.external import ExternalTask
from feedbackrl.envs.multi_turn import EpisodicTask
from feedbackrl.log import console
from feedbackrl.rewards.verdict import Problem
from feedbackrl.rollout.generate import generate


@dataclass
class EvalResult:
    accuracy: float  # greedy pass@1
    pass_at_k: float  # fraction of problems with at least one of k samples correct
    k: int
    n: int
    mean_len: float
    truncated_frac: float = 0.0  # greedy answers cut off by max_new_tokens
    samples: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # episodic tasks: `episode_stats` of the greedy episodes

    def to_dict(self) -> dict[str, Any]:
        sampled = {f"pass@{self.k}": self.pass_at_k} if self.k else {}  # k = 0: greedy only, no pass@k
        return {"accuracy": self.accuracy, **sampled, "k": self.k, "n": self.n,
                "mean_len": self.mean_len, "truncated_frac": self.truncated_frac, "samples": self.samples,
                **self.metrics}


def _batches(items: list[Problem], size: int) -> list[list[Problem]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
             max_new_tokens: int, k: int = 4, temperature: float = 1.0, batch_size: int = 256,
             seed: int = 1234, n_samples: int = 5, truncated_fails: bool = False,
             warn_truncated: float = 0.1, all_done: Callable[[Tensor], bool] | None = None) -> EvalResult:
    """Greedy accuracy and pass@k (k = 0: greedy only, pass@k is NaN). Sampling uses its own generator,
    so evaluating mid-run never perturbs the training RNG streams (resumed runs stay exact). Episodic
    tasks play whole episodes; external tasks (`envs/external.py`) play them against the served policy.

    Reports the fraction of greedy answers cut off by `max_new_tokens` and warns above `warn_truncated`
    (an answer cut off is usually graded on text that never reached its end); `truncated_fails` fails them.
    Episodic tasks play whole episodes (`train/episodes.py`; the truncation options do not apply there).
    `all_done`: when decoding stops (`generate`); ranks that share a sharded policy all evaluate, in step.
    """
    if isinstance(task, ExternalTask):  # another program plays the episodes against the served policy
        from feedbackrl.train.external import evaluate_external  # it returns an EvalResult: imported here

        return evaluate_external(model, tokenizer, task, problems, max_new_tokens, k, temperature, n_samples)
    if isinstance(task, EpisodicTask):
        from feedbackrl.train.episodes import evaluate_episodes  # it returns an EvalResult: imported here

        return evaluate_episodes(model, tokenizer, task, problems, k, temperature, batch_size, seed, n_samples)
    gen = torch.Generator().manual_seed(seed)
    correct, any_correct, lengths, cut, samples = 0, 0, 0, 0, []
    for batch in _batches(problems, max(1, batch_size // max(k, 1))):
        greedy = generate(model, tokenizer, [p.prompt for p in batch], max_new_tokens, greedy=True, all_done=all_done)
        lengths += int(greedy.completion_mask.sum())
        cut += int(greedy.truncated.sum())
        ok = [task.verify(p, t).passed and not (truncated_fails and c)
              for p, t, c in zip(batch, greedy.texts, greedy.truncated.tolist(), strict=True)]
        correct += sum(ok)
        for p, t, good in zip(batch, greedy.texts, ok, strict=True):
            if len(samples) < n_samples:
                samples.append({"prompt": p.prompt, "completion": t, "correct": good})
        if not k:  # greedy only
            continue
        sampled = generate(model, tokenizer, [p.prompt for p in batch for _ in range(k)], max_new_tokens,
                           temperature=temperature, generator=gen, all_done=all_done)
        for i, p in enumerate(batch):
            hits = [task.verify(p, t).passed and not (truncated_fails and c)
                    for t, c in zip(sampled.texts[i * k : (i + 1) * k], sampled.truncated[i * k : (i + 1) * k].tolist(),
                                    strict=True)]
            any_correct += int(any(hits))
    n = len(problems)
    any_correct = any_correct if k else float("nan")
    if cut / n > warn_truncated:
        console.print(f"[yellow]warning: {cut}/{n} greedy eval answers hit max_new_tokens={max_new_tokens} before an "
                      "end token; raise rollout.max_new_tokens"
                      + ("" if truncated_fails else " (or set rollout.truncated_fails = true)"))
    return EvalResult(correct / n, any_correct / n, k, n, lengths / n, cut / n, samples)
