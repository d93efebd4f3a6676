"""PPO with a value head (RLHF as in Ziegler et al. 2019 and InstructGPT), top to bottom: sample
prompts, roll out, score, fold the per-token KL penalty into the rewards, GAE, whiten, then for
each epoch and minibatch the clipped policy and value losses, step and log.

All maths lives in `feedbackrl.algos.ppo`; this file only wires it. The score comes from the
task's verifier or from a `Scorer` (the recipe's reward, see `train/run.py`).

Departures from InstructGPT: the value head sits on the policy's own last hidden state (one
network, loss = policy + vf_coef * value, as in Ziegler et al.'s shared-trunk variant and TRL's
old `AutoModelForCausalLMWithValueHead`) rather than a separate critic initialised from the
reward model: half the compute on a CPU. The head is zero-initialised, so the first values are 0.
Checkpoints carry the value head (`value_head.pt`) beside the policy, so `--resume` continues a run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.ppo import gae, kl_penalised_rewards, ppo_policy_loss, value_loss, whiten
from feedbackrl.config import RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.log import MetricsSink, console, progress
from feedbackrl.models.logprobs import positions, sequence_logprobs, token_logprobs
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.train.checkpoint import frozen_reference, latest_checkpoint, load_extra, restore, save_checkpoint
from feedbackrl.train.collect import Scorer, collect, minibatches, task_scorer
from feedbackrl.train.context import Run
from feedbackrl.train.monitoring import after_step, live_monitor, roll_back
from feedbackrl.train.optim import adamw

VALUE_HEAD_FILE = "value_head.pt"


def make_value_head(model: PreTrainedModel) -> nn.Linear:
    head = nn.Linear(model.config.hidden_size, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def logprobs_and_values(model: PreTrainedModel, value_head: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor,
                        completion_ids: Tensor, completion_mask: Tensor,
                        temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """One forward pass -> per-token log-probs, values and entropy, each (N, T), 0 on padding.

    values[:, t] is read at the position that predicts completion token t: the state before acting.
    """
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    p = prompt_ids.shape[1]
    # The trunk's last hidden states, then the LM head on the completion positions only. Not
    # `output_hidden_states=True`: transformers then installs output-capturing hooks on the model for
    # good, and a hooked model loses the fast decode path (models.logprobs.fast_path_ok).
    hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                              use_cache=False).last_hidden_state[:, p - 1 : -1]
    m = completion_mask.float()
    logprobs, entropy = token_logprobs(model.get_output_embeddings()(hidden), completion_ids, m, temperature,
                                       with_entropy=True)
    values = value_head(hidden).squeeze(-1).float() * m
    return logprobs, values, entropy


def train_ppo(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
              out_dir: Path, sink: MetricsSink, scorer: Scorer | None = None, resume_from: Path | None = None,
              on_eval: Callable[[int], dict[str, Any]] | None = None, monitor: Monitor | None = None,
              reference_source: Path | None = None) -> dict[str, Any]:
    """Run PPO from step 0 (or from a checkpoint) to `cfg.algo.steps`. Returns the last metrics.

    `monitor` (default: one built from `[monitors]`) checks every step and may stop, roll back or raise
    the KL coefficient.
    """
    scorer = scorer or task_scorer(task)
    a, ro_cfg = cfg.algo, cfg.rollout
    B, G, temp = ro_cfg.prompts_per_step, ro_cfg.group_size, ro_cfg.temperature
    value_head = make_value_head(model).to(model.device)
    params = list(model.parameters()) + list(value_head.parameters())
    optimizer = adamw(params, lr=a.lr, weight_decay=0.0)
    prompt_rng = random.Random(cfg.train.seed)
    sample_rng = torch.Generator().manual_seed(cfg.train.seed)
    start = 0
    if resume_from is not None:
        value_head.load_state_dict(load_extra(resume_from, VALUE_HEAD_FILE))
        start = restore(resume_from, optimizer, prompt_rng, sample_rng, task)
        console.print(f"resumed from {resume_from} at step {start}")
    monitor = live_monitor(cfg, out_dir, monitor, task)
    kl_coef = a.kl_coef  # a monitor's raise_kl action may raise it
    wants_ref = a.kl_coef > 0 or (monitor is not None and monitor.needs_reference)
    ref = frozen_reference(model, tokenizer, out_dir, resume_from, reference_source) if wants_ref else None
    metrics: dict[str, Any] = {}

    def checkpoint(step: int) -> None:
        save_checkpoint(out_dir, model, tokenizer, optimizer.state_dict(), step, prompt_rng, sample_rng,
                        cfg.model_dump_json(indent=2), task.state_dict(),
                        extras={VALUE_HEAD_FILE: value_head.state_dict()})

    end = a.steps
    if monitor is not None and monitor.needs_rollback and latest_checkpoint(out_dir) is None:
        checkpoint(start)  # something to roll back to before the first periodic checkpoint
    with progress() as bar:
        job = bar.add_task("PPO", total=a.steps, completed=start, info="")
        for step in range(start, a.steps):
            t0 = time.perf_counter()
            # 1. roll out G completions for each of B prompts, 2. score them (the collect step)
            batch = collect(model, tokenizer, task, scorer, ro_cfg, prompt_rng, sample_rng)
            scores, mask = batch.rewards, batch.completion_mask  # (N,), (N, T)
            tensors = batch.tensors
            # 3. KL-shaped per-token rewards, GAE over the rollout-time values, whitened advantages
            with torch.no_grad():
                old_lp, old_values, _ = logprobs_and_values(model, value_head, *tensors, temp)
                ref_lp = sequence_logprobs(ref, *tensors, temp)[0] if ref is not None else old_lp
                rewards = kl_penalised_rewards(scores, old_lp, ref_lp, mask, kl_coef)  # (N, T)
                advantages, returns = gae(rewards, old_values, mask, a.gamma, a.lam)
                if a.whiten_advantages:
                    advantages = whiten(advantages, mask)
            # 4. optimise: epochs x minibatches
            stats: dict[str, list[float]] = {}
            model.train()
            for _ in range(a.epochs):
                for idx in minibatches(B * G, a.minibatches, sample_rng):
                    mb = [t[idx] for t in tensors]
                    logprobs, values, entropy = logprobs_and_values(model, value_head, *mb, temp)
                    pg, pg_stats = ppo_policy_loss(logprobs, old_lp[idx], advantages[idx], mask[idx], a.clip)
                    vl, v_stats = value_loss(values, old_values[idx], returns[idx], mask[idx], a.value_clip)
                    loss = pg + a.vf_coef * vl
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)
                    optimizer.step()
                    n_tok = mask[idx].sum().clamp(min=1)
                    for k, v in {"loss/policy": pg, "loss/value": vl, **pg_stats, **v_stats, "grad_norm": grad_norm,
                                 "entropy/mean": (entropy * mask[idx]).sum() / n_tok}.items():
                        stats.setdefault(k, []).append(float(v.detach()))
            # 5. log
            dt = time.perf_counter() - t0
            gen_tokens = int(mask.sum())
            metrics = {"phase": "rl", **batch.metrics,
                       "kl/mean": ((old_lp - ref_lp) * mask).sum().item() / max(gen_tokens, 1),
                       **{k: sum(v) / len(v) for k, v in stats.items()},
                       "perf/step_s": dt, "perf/tokens_per_s": gen_tokens / dt}
            done = step + 1
            # 6. periodic eval and the monitors: statistics and alerts into the metrics (and OUT/alerts.jsonl)
            decision = after_step(cfg, done, batch, metrics, monitor, on_eval, kl_coef)
            sink.log(done, metrics)
            bar.update(job, advance=1, info=f"reward {metrics['reward/mean']:.3f}  kl {metrics['kl/mean']:.4f}")
            # 7. the recipe's actions on this step's alerts (a rolled-back step is not checkpointed)
            if decision is not None and monitor is not None:
                if decision.stop:
                    end = done
                    break
                if decision.raise_kl:
                    kl_coef = monitor.raised_kl(kl_coef)
                if decision.rollback:
                    back, ckpt = roll_back(out_dir, model, optimizer)
                    value_head.load_state_dict(load_extra(ckpt, VALUE_HEAD_FILE))
                    monitor.rolled_back(back)
                    continue
            if cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0:
                checkpoint(done)
    if start < a.steps or resume_from is None:
        checkpoint(end)
    return metrics


def run_ppo(run: Run) -> dict[str, Any]:
    """PPO as the run path calls it, against the recipe's reward."""
    final = train_ppo(run.cfg, run.model, run.tokenizer, run.task, run.out_dir, run.sink, run.scorer,
                      resume_from=run.resume_from, on_eval=run.on_eval, reference_source=run.start_dir)
    return {"steps": run.cfg.algo.steps, "final": final}
