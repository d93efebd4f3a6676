"""PPO with a value head (RLHF as in Ziegler et al. 2019 and InstructGPT), top to bottom: sample
prompts, roll out, score, fold the per-token KL penalty into the rewards, GAE, whiten, then for
each epoch and minibatch the clipped policy and value losses, step and log.

All maths lives in `feedbackrl.algos.ppo`; this file only wires it. The score comes from the
task's verifier or from a `Scorer` (a learned reward model, see `train/rlhf.py`).

Departures from InstructGPT: the value head sits on the policy's own last hidden state (one
network, loss = policy + vf_coef * value, as in Ziegler et al.'s shared-trunk variant and TRL's
old `AutoModelForCausalLMWithValueHead`) rather than a separate critic initialised from the
reward model: half the compute on a CPU. The head is zero-initialised, so the first values are 0.
No resume: a PPO run saves its final policy (and value head) but cannot be continued.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.ppo import gae, kl_penalised_rewards, ppo_policy_loss, value_loss, whiten
from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.log import MetricsSink, progress
from feedbackrl.models.logprobs import positions, sequence_logprobs
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.train.checkpoint import save_checkpoint
from feedbackrl.train.collect import Scorer, collect, minibatches, task_scorer
from feedbackrl.train.monitoring import live_monitor
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
    logp_all = torch.log_softmax(model.get_output_embeddings()(hidden).float() / temperature, dim=-1)
    m = completion_mask.float()
    logprobs = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1) * m
    values = value_head(hidden).squeeze(-1).float() * m
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1) * m
    return logprobs, values, entropy


def train_ppo(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
              out_dir: Path, sink: MetricsSink, scorer: Scorer | None = None,
              monitor: Monitor | None = None) -> dict[str, Any]:
    """Run PPO for `cfg.algo.steps` steps; saves the final policy as a checkpoint. Returns the last metrics.

    `monitor` (default: one built from `[monitors]`) checks every step and may stop the run or raise the
    KL coefficient; PPO keeps no periodic checkpoints, so it cannot roll back.
    """
    scorer = scorer or task_scorer(task)
    a, ro_cfg = cfg.algo, cfg.rollout
    B, G, temp = ro_cfg.prompts_per_step, ro_cfg.group_size, ro_cfg.temperature
    value_head = make_value_head(model)
    params = list(model.parameters()) + list(value_head.parameters())
    optimizer = adamw(params, lr=a.lr, weight_decay=0.0)
    prompt_rng = random.Random(cfg.train.seed)
    sample_rng = torch.Generator().manual_seed(cfg.train.seed)
    monitor = live_monitor(cfg, out_dir, monitor, task)
    if monitor is not None and monitor.needs_rollback:
        raise ConfigError("monitors.actions: PPO keeps no checkpoints to roll back to; use log, stop or raise_kl")
    kl_coef = a.kl_coef  # a monitor's raise_kl action may raise it
    wants_ref = a.kl_coef > 0 or (monitor is not None and monitor.needs_reference)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if wants_ref else None
    metrics: dict[str, Any] = {}
    with progress() as bar:
        job = bar.add_task("PPO", total=a.steps, info="")
        for step in range(a.steps):
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
            # 6. monitors: statistics and alerts into the metrics, then the recipe's action
            decision = monitor.after_step(step + 1, batch, metrics) if monitor is not None else None
            if decision is not None:
                metrics.update({**decision.metrics, "algo/kl_coef": kl_coef})
            sink.log(step + 1, metrics)
            bar.update(job, advance=1, info=f"reward {metrics['reward/mean']:.3f}  kl {metrics['kl/mean']:.4f}")
            if decision is not None and monitor is not None:
                if decision.stop:
                    break
                if decision.raise_kl:
                    kl_coef = monitor.raised_kl(kl_coef)
    ckpt = save_checkpoint(out_dir, model, tokenizer, optimizer, a.steps, prompt_rng, sample_rng,
                           cfg.model_dump_json(indent=2))
    torch.save(value_head.state_dict(), ckpt / VALUE_HEAD_FILE)
    return metrics
