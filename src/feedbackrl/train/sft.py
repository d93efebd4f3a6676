"""Offline training on fixed targets: SFT warm start on a task's demonstrations.

The task's kind encodes the demonstrations as it encodes rollouts (`TaskKind.demonstrations`): a
single-turn task's demonstration is a completion string, trained on whole (EOS appended); an
episodic task's is a conversation (assistant turns and the environment's messages between them),
encoded as episodes are (`episodes/multi_turn.py:demonstration_rows`, the model's turn format) with
the loss on the assistant turns only: a tool's output is context, never a target.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.sft import sft_loss
from feedbackrl.config import SFTConfig
from feedbackrl.envs.base import CannotDemonstrate, Task
from feedbackrl.episodes.kinds import task_kind
from feedbackrl.log import MetricsSink, progress
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.train.context import Run
from feedbackrl.train.optim import adamw


class SFTUnavailable(ValueError):
    """SFT was asked for but the task cannot write demonstrations."""


def warmup_lambda(warmup_steps: int):
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0


def sft_warmstart(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, cfg: SFTConfig,
                  seed: int, sink: MetricsSink) -> dict[str, float]:
    """Train on `cfg.steps` batches of the task's (possibly noisy) demonstrations."""
    kind = task_kind(task)
    rng = random.Random(seed + 7_919)  # its own stream: SFT never shifts the RL data order
    opt = adamw(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_lambda(cfg.warmup_steps))
    model.train()
    loss_val = float("nan")
    with progress() as bar:
        job = bar.add_task("SFT warm start", total=cfg.steps, info="")
        for step in range(cfg.steps):
            problems = [task.sample(rng) for _ in range(cfg.batch_size)]
            try:
                demos = [task.demonstrate(p, rng) for p in problems]
            except CannotDemonstrate as e:  # the task's default: it writes none
                raise SFTUnavailable(f"sft.steps={cfg.steps} but {e}") from None
            p_ids, p_mask, c_ids, c_mask = kind.demonstrations(tokenizer, task, problems, demos)
            p_ids, p_mask, c_ids, c_mask = (t.to(model.device) for t in (p_ids, p_mask, c_ids, c_mask))
            logprobs, _ = sequence_logprobs(model, p_ids, p_mask, c_ids, c_mask)
            loss = sft_loss(logprobs, c_mask)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            loss_val = loss.item()
            sink.log(step, {"phase": "sft", "loss/sft": loss_val, "lr": sched.get_last_lr()[0]})
            bar.update(job, advance=1, info=f"loss {loss_val:.3f}")
    return {"loss/sft_final": loss_val}


def run_sft(run: Run) -> dict[str, Any]:
    """SFT as the algorithm (algo.name = "sft"): the [sft] steps, then the policy saved as OUT/sft_policy/."""
    final = sft_warmstart(run.model, run.tokenizer, run.task, run.cfg.sft, run.cfg.train.seed, run.sink)
    run.model.save_pretrained(run.out_dir / "sft_policy")
    run.tokenizer.save_pretrained(run.out_dir / "sft_policy")
    return {"steps": run.cfg.sft.steps, "final": final}
