"""Single-turn tasks: one prompt, one completion, judged by the recipe's scorer.

The collect step samples B problems, rolls out G completions each with the native decoder (`generate`),
scores them with one `Scorer` (the task's verifier, `task_scorer`, or whatever the recipe's `[reward]`
section builds, optionally with a hidden gold score logged beside it), feeds the verdicts back to the task
and measures the rollout. `score_rollout` is the part every single-turn collector shares: the workers'
(`scale/ray_collect.py`), the ranks' (`scale/ddp.py`) and vLLM's (`scale/vllm_rollout.py`) sample their own
way and score here. Evaluation is greedy pass@1 and sampled pass@k; a demonstration is a completion string,
trained on whole (EOS appended).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ModelConfig, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.chat import chat_task
from feedbackrl.episodes.contracts import Batch, EvalResult, EvalSettings, Scorer, Support
from feedbackrl.log import console
from feedbackrl.models.logprobs import encode_completions, encode_prompts
from feedbackrl.rewards.verdict import Problem, Verdict, fail
from feedbackrl.rollout.generate import Rollout, generate


def task_scorer(task: Task) -> Scorer:
    """The task's own verifier (in parallel where the task verifies batches, e.g. code sandboxes)."""
    return lambda problems, completions: (task.verify_batch(problems, completions), {})


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


def _batches(items: list[Problem], size: int) -> list[list[Problem]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class SingleTurn:
    """The kind of every task that answers a prompt with one completion (`Task.kind = "single_turn"`)."""

    name = "single_turn"
    support = Support(torchrun=True, rollout_workers=True, reward_workers=True, vllm=True, quantized_sampling=True,
                      recipe_scored=True)
    refuses = "its completions are sampled in one process"  # nothing is refused: every flag above is True

    def for_model(self, task: Task, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig) -> Task:
        """Prompts rendered with the model's chat template (`model.chat_template`)."""
        return chat_task(task, tokenizer, cfg.chat_template, cfg.system_prompt)

    def collect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                cfg: RolloutConfig, prompt_rng: random.Random, sample_rng: torch.Generator) -> Batch:
        t0 = time.perf_counter()
        owners = sample_owners(task, cfg, prompt_rng)
        ro = generate(model, tokenizer, [p.prompt for p in owners], cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                      generator=sample_rng, min_new_tokens=cfg.min_new_tokens, weights=cfg.weights)
        batch = score_rollout(task, scorer, owners, ro, t0, time.perf_counter(), cfg.truncated_fails)
        if cfg.weights != "fp32":  # the sampler's own log-probs: the loop corrects for its gap to the float32 learner
            batch.logprobs = ro.logprobs
        return batch

    def evaluate(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                 problems: list[Problem], settings: EvalSettings) -> EvalResult:
        """Greedy answers judged by the task's verifier, and k sampled answers per problem (pass@k)."""
        s = settings
        k, max_new_tokens, truncated_fails, all_done = s.k, s.max_new_tokens, s.truncated_fails, s.all_done
        gen = torch.Generator().manual_seed(s.seed)
        correct, finished_correct, any_correct, lengths, cut, samples = 0, 0, 0, 0, 0, []
        for batch in _batches(problems, max(1, s.batch_size // max(k, 1))):
            greedy = generate(model, tokenizer, [p.prompt for p in batch], max_new_tokens, greedy=True,
                              all_done=all_done)
            lengths += int(greedy.completion_mask.sum())
            cut += int(greedy.truncated.sum())
            ok = [task.verify(p, t).passed and not (truncated_fails and c)
                  for p, t, c in zip(batch, greedy.texts, greedy.truncated.tolist(), strict=True)]
            correct += sum(ok)
            finished_correct += sum(good and not c for good, c in zip(ok, greedy.truncated.tolist(), strict=True))
            for p, t, good in zip(batch, greedy.texts, ok, strict=True):
                if len(samples) < s.n_samples:
                    samples.append({"prompt": p.prompt, "completion": t, "correct": good})
            if not k:  # greedy only
                continue
            sampled = generate(model, tokenizer, [p.prompt for p in batch for _ in range(k)], max_new_tokens,
                               temperature=s.temperature, generator=gen, all_done=all_done)
            for i, p in enumerate(batch):
                hits = [task.verify(p, t).passed and not (truncated_fails and c)
                        for t, c in zip(sampled.texts[i * k : (i + 1) * k],
                                        sampled.truncated[i * k : (i + 1) * k].tolist(), strict=True)]
                any_correct += int(any(hits))
        n = len(problems)
        any_correct = any_correct if k else float("nan")
        if cut / n > s.warn_truncated:
            console.print(f"[yellow]warning: {cut}/{n} greedy eval answers hit max_new_tokens={max_new_tokens} "
                          "before an end token; raise rollout.max_new_tokens"
                          + ("" if truncated_fails else " (or set rollout.truncated_fails = true)"))
        finished = n - cut
        return EvalResult(correct / n, any_correct / n, k, n, lengths / n, cut / n,
                          finished_correct / finished if finished else float("nan"), samples)

    def demonstrations(self, tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem],
                       demos: list[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The prompts left-padded, the demonstrated completions right-padded with EOS appended."""
        p_ids, p_mask = encode_prompts(tokenizer, [p.prompt for p in problems])
        c_ids, c_mask = encode_completions(tokenizer, demos)
        return p_ids, p_mask, c_ids, c_mask
