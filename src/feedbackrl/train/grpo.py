"""The online RL loop (GRPO family), top to bottom: sample prompts, roll out, score, compute
advantages, then for each epoch and minibatch compute the loss, step and log.

All maths lives in `feedbackrl.algos`; this file only wires it. Setup helpers sit above the loop.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.advantages import group_advantages
from feedbackrl.algos.aggregate import AGGREGATIONS
from feedbackrl.algos.kl import kl_k3
from feedbackrl.algos.policy_gradient import clipped_pg_loss
from feedbackrl.algos.rloo import rloo_advantages
from feedbackrl.algos.staleness import decoupled_pg_loss, staleness
from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.external import ExternalTask
from feedbackrl.log import MetricsSink, console, progress
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.models.lora import adapters_disabled, is_lora
from feedbackrl.models.policy import train_autocast
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.train.checkpoint import frozen_reference, latest_checkpoint, load_extra, restore, save_checkpoint
from feedbackrl.train.collect import Collector, InProcessCollector, Scorer, minibatches, task_scorer
from feedbackrl.train.constraint import CONSTRAINT_FILE, Multiplier, constrained_advantages
from feedbackrl.train.context import OneProcess, Ranks, Run
from feedbackrl.train.episodes import write_transcripts
from feedbackrl.train.monitoring import after_step, live_monitor, roll_back
from feedbackrl.train.optim import adamw

# the algorithm's name picks its advantage function (GRPO: group-normalised; RLOO: leave-one-out)
ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {"grpo": group_advantages, "rloo": rloo_advantages}


def make_optimizer(model: PreTrainedModel, cfg: RunConfig) -> torch.optim.Optimizer:
    # the trainable parameters only: with LoRA the frozen base has no optimizer state to keep
    params = [p for p in model.parameters() if p.requires_grad]
    return adamw(params, lr=cfg.algo.lr, weight_decay=cfg.algo.weight_decay)


def make_collector(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                   scorer: Scorer, ranks: Ranks | None = None) -> Collector:
    """This process's collect step, the `torchrun` ranks' (each generates a share), vLLM's
    (`rollout.backend = "vllm"`), or Ray workers' when the recipe's `[scale]` section asks for them."""
    ranked = ranks is not None and ranks.world > 1
    if isinstance(task, ExternalTask) and (cfg.scale.uses_ray or cfg.rollout.backend == "vllm" or ranked):
        raise ConfigError(f"task {task.name!r} plays its episodes in another program against this process's "
                          "policy endpoint; [scale] rollout or reward workers, rollout.backend = 'vllm' and "
                          "torchrun are not supported for it")
    if ranks is not None and ranked:
        return ranks.collector(model, tokenizer, task, scorer, cfg.rollout)
    if cfg.rollout.backend == "vllm":
        from feedbackrl.scale.vllm_rollout import vllm_collector  # vLLM is an optional extra: imported only when used

        return vllm_collector(cfg, model, tokenizer, task, scorer)
    if not cfg.scale.uses_ray:
        return InProcessCollector(model, tokenizer, task, scorer, cfg.rollout)
    from feedbackrl.scale.collectors import ray_collector  # Ray is an optional extra: imported only when used

    return ray_collector(cfg, model, tokenizer, task, scorer)


def stale_metrics(versions: torch.Tensor | None, learner_version: int, bound: int) -> dict[str, float]:
    """scale/staleness_{mean,max} of a batch sampled by workers; an error past the bound."""
    if versions is None:
        return {}
    age = staleness(versions, learner_version)
    if int(age.max()) > bound:
        raise RuntimeError(f"a sample is {int(age.max())} policy versions old, past scale.max_staleness={bound}")
    return {"scale/staleness_mean": age.float().mean().item(), "scale/staleness_max": float(age.max())}


def train_grpo(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
               out_dir: Path, sink: MetricsSink, resume_from: Path | None = None,
               on_eval: Callable[[int], dict[str, Any]] | None = None,
               scorer: Scorer | None = None, monitor: Monitor | None = None,
               collector: Collector | None = None, reference_source: Path | None = None,
               ranks: Ranks | None = None) -> dict[str, Any]:
    """Run GRPO or RLOO from step 0 (or from a checkpoint) to `cfg.algo.steps`. Returns the last metrics.

    Completions are scored by the task's verifier, or by `scorer` when given; batches come from
    `collector` when given, else from `make_collector` (this process unless `[scale]` asks for workers).
    `monitor` (default: one built from `[monitors]`) checks every step and may stop, roll back or raise
    the KL coefficient. `reference_source`: a model directory that already holds the starting weights
    (recorded instead of a copy of the KL reference). `ranks`: the data-parallel learner's processes under
    `torchrun` (`scale/ddp.py`); each trains on its share of every minibatch and only rank 0 writes.
    """
    ranks = ranks or OneProcess()
    scorer = scorer or task_scorer(task)
    collector = collector or make_collector(cfg, model, tokenizer, task, scorer, ranks)
    a, ro_cfg = cfg.algo, cfg.rollout
    B, G = ro_cfg.prompts_per_step, ro_cfg.group_size
    optimizer = make_optimizer(model, cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    prompt_rng = random.Random(cfg.train.seed)
    sample_rng = torch.Generator().manual_seed(cfg.train.seed)
    start = 0
    # [constraint]: the Lagrange multiplier that keeps the mean cost under the threshold (train/constraint.py)
    multiplier = Multiplier.from_config(cfg.constraint) if cfg.constraint is not None else None
    if resume_from is not None:
        start = restore(resume_from, optimizer, prompt_rng, sample_rng, task,
                        load_optimizer=functools.partial(ranks.load_optimizer_state, model, optimizer))
        if multiplier is not None:
            multiplier.load_state_dict(load_extra(resume_from, CONSTRAINT_FILE))
        console.print(f"resumed from {resume_from} at step {start}")
        collector.update(model, start)  # the resumed weights are policy version `start`
    monitor = live_monitor(cfg, out_dir, monitor, task)
    kl_coef = a.kl_coef  # a monitor's raise_kl action may raise it
    wants_ref = a.kl_coef > 0 or (monitor is not None and monitor.needs_reference)
    # LoRA: the reference is the base model with the adapters disabled, no second copy
    ref = None
    if wants_ref and not is_lora(model):
        ref = frozen_reference(model, tokenizer, out_dir, resume_from, reference_source, ranks=ranks)
    precision = functools.partial(train_autocast, cfg.train.precision, model.device)
    aggregate = AGGREGATIONS[a.aggregation]
    n_updates = a.epochs * a.minibatches
    micro = cfg.train.micro_batch_size  # 0: each minibatch in one forward/backward
    metrics: dict[str, Any] = {}

    def checkpoint(step: int) -> None:
        if not (ranks.main or ranks.sharded):  # rank 0 writes; the replicas are equal
            return
        whole = ranks.full_model(model)  # a sharded policy's ranks all take part in gathering it to rank 0
        state = ranks.full_optimizer_state(model, optimizer) if cfg.train.save_optimizer else None
        if ranks.main:
            extras = {CONSTRAINT_FILE: multiplier.state_dict()} if multiplier is not None else None
            save_checkpoint(out_dir, whole, tokenizer, state, step, prompt_rng, sample_rng,
                            cfg.model_dump_json(indent=2), task.state_dict(), extras)

    def checkpoint_after(step: int) -> bool:
        every = cfg.train.checkpoint_every
        return step + 1 == a.steps or bool(every and (step + 1) % every == 0)

    end = a.steps
    if monitor is not None and monitor.needs_rollback and latest_checkpoint(out_dir) is None:
        checkpoint(start)  # something to roll back to before the first periodic checkpoint
    with progress() as bar, contextlib.closing(collector):
        job = bar.add_task(a.name.upper(), total=a.steps, completed=start, info="")
        for step in range(start, a.steps):
            t0 = time.perf_counter()
            # 1. roll out G completions for each of B prompts, 2. score them (the collect step); an asynchronous
            # collector starts the next batch now, except before a checkpoint (a resume then continues this run)
            batch = collector.collect(prompt_rng, sample_rng, prefetch=not checkpoint_after(step))
            behaviour = batch.logprobs  # None: on-policy; else the stale batch's sampling log-probs (N, T)
            batch.metrics.update(stale_metrics(batch.policy_versions, step, cfg.scale.max_staleness))
            # 3. advantages: group-normalised (GRPO) or leave-one-out (RLOO); with [constraint], the multiplier
            # steps on this batch's costs first, then combines the reward's and the cost's advantages
            if multiplier is None:
                advantages = ADVANTAGES[a.name](batch.rewards, G, scale=a.scale_advantages)
            else:
                if "cost" not in batch.signals:
                    raise ConfigError(f"[constraint]: the batches of task {task.name!r} carry no cost (its episodes "
                                      "are scored by the environment, not by [cost]); remove [constraint]")
                batch.metrics.update(multiplier.update(batch.signals["cost"]))
                advantages, adv_stats = constrained_advantages(ADVANTAGES[a.name], batch.rewards,
                                                               batch.signals["cost"], G, multiplier.lam,
                                                               a.scale_advantages)
                batch.metrics.update(adv_stats)
            if batch.turn_advantages is not None:  # episodes with per-turn credit: (N,) -> (N, T)
                advantages = advantages[:, None] + batch.turn_advantages
            if batch.episodes is not None and ranks.main:
                write_transcripts(out_dir / "episodes.jsonl", step + 1, batch.episodes)
            tensors, mask = batch.tensors, batch.completion_mask.float()
            # each rank computes its share of the rows' old and reference log-probs; every rank gets them all
            mine, n = [t[ranks.share(B * G)] for t in tensors], B * G
            with torch.no_grad(), precision():
                # old log-probs only matter when the policy moves within a batch; with one update the
                # ratio is exactly 1 and the detached current log-probs serve
                old_lp = ranks.gather(sequence_logprobs(model, *mine, ro_cfg.temperature)[0], n) \
                    if n_updates > 1 else None
                ref_lp = ranks.gather(sequence_logprobs(ref, *mine, ro_cfg.temperature)[0], n) \
                    if ref is not None else None
                if wants_ref and ref is None:
                    with adapters_disabled(model):
                        ref_lp = ranks.gather(sequence_logprobs(model, *mine, ro_cfg.temperature)[0], n)
            # 4. optimise: epochs x minibatches
            stats: dict[str, list[float]] = {k: [] for k in ("loss/policy", "loss/kl", "kl/mean", "entropy/mean",
                                                              "clip_frac", "grad_norm")}
            model.train()
            for _ in range(a.epochs):
                for idx in minibatches(B * G, a.minibatches, sample_rng):
                    mb_mask = mask[idx]
                    # the loss's normalisers are the whole minibatch's, so summing the micro-batches'
                    # losses (gradient accumulation) and the ranks' gradients gives the minibatch's gradient
                    norm = {"num_tokens": float(mb_mask.sum()), "num_sequences": float(len(idx)),
                            "max_len": ro_cfg.max_new_tokens}
                    parts: dict[str, list[torch.Tensor]] = {"pg": [], "kl": [], "entropy": [], "clipped": []}
                    own = idx[ranks.share(len(idx))]  # this rank's rows of the minibatch (all of them in one process)
                    for sub in own.split(micro or len(own)):
                        mb = [t[sub] for t in tensors]
                        with precision():
                            logprobs, entropy = sequence_logprobs(model, *mb, ro_cfg.temperature, with_entropy=True)
                        old = old_lp[sub] if old_lp is not None else logprobs.detach()
                        if behaviour is None:
                            pg, pg_stats = clipped_pg_loss(logprobs, old, advantages[sub], mask[sub], a.clip_low,
                                                           a.clip_high)
                        else:  # clip around the policy before this update, weight by its gap to the sampler
                            pg, pg_stats = decoupled_pg_loss(logprobs, old, behaviour[sub], advantages[sub],
                                                             mask[sub], a.clip_low, a.clip_high,
                                                             cfg.scale.importance_cap)
                            for k in ("is_weight/mean", "is_weight/truncated_frac"):
                                stats.setdefault(k, []).append(pg_stats[k].item())
                        per_token = pg
                        kl = torch.zeros_like(pg)
                        if ref_lp is not None:
                            kl = kl_k3(logprobs, ref_lp[sub])
                            per_token = pg + kl_coef * kl
                        aggregate(per_token, mask[sub], **norm).backward()
                        parts["pg"].append(pg.detach())
                        parts["kl"].append(kl.detach())
                        parts["entropy"].append(entropy)
                        parts["clipped"].append(pg_stats["clip_frac"] * mask[sub].sum().clamp(min=1.0))
                        del logprobs, entropy, pg, kl, per_token  # this micro-batch's graph goes now
                    ranks.sum_gradients(trainable)
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
                    optimizer.step()
                    # free the gradients now, not before the next backward: they would otherwise sit in
                    # memory through the next rollout (a model's worth of floats at peak RSS)
                    optimizer.zero_grad(set_to_none=True)
                    pg, kl, entropy = (ranks.gather(torch.cat(parts[k]), len(idx)) for k in ("pg", "kl", "entropy"))
                    n_tok = mb_mask.sum().clamp(min=1)
                    stats["loss/policy"].append(aggregate(pg, mb_mask, max_len=ro_cfg.max_new_tokens).item())
                    stats["loss/kl"].append(aggregate(kl, mb_mask, max_len=ro_cfg.max_new_tokens).item())
                    stats["kl/mean"].append(((kl * mb_mask).sum() / n_tok).item())
                    stats["entropy/mean"].append(((entropy * mb_mask).sum() / n_tok).item())
                    stats["clip_frac"].append((ranks.sum(sum(parts["clipped"])) / n_tok).item())
                    stats["grad_norm"].append(float(grad_norm))
            collector.update(model, step + 1)  # the workers sample the next batches with these weights
            # 5. log
            dt = time.perf_counter() - t0
            metrics = {"phase": "rl", **batch.metrics, **{k: sum(v) / len(v) for k, v in stats.items()},
                       "perf/step_s": dt, "perf/tokens_per_s": float(batch.completion_mask.sum()) / dt}
            done = step + 1
            # 6. periodic eval and the monitors: statistics and alerts into the metrics (and OUT/alerts.jsonl)
            # rank 0's monitors; a sharded policy's ranks also evaluate with rank 0 (their `on_eval`)
            decision = after_step(cfg, done, batch, metrics, monitor if ranks.main else None, on_eval, kl_coef)
            if monitor is not None:  # rank 0's monitors decide for every rank
                decision = ranks.from_main(decision)
            if ranks.main:
                sink.log(done, metrics)
            bar.update(job, advance=1, info=f"reward {metrics['reward/mean']:.3f}  kl {metrics['kl/mean']:.4f}")
            # 7. the recipe's actions on this step's alerts (a rolled-back step is not checkpointed)
            if decision is not None and monitor is not None:
                if decision.stop:
                    end = done
                    console.print(f"monitors stopped the run at step {done}: {decision.alerts[0].message}")
                    break
                if decision.raise_kl:
                    kl_coef = monitor.raised_kl(kl_coef)
                if decision.rollback:
                    back_to, ckpt = roll_back(out_dir, model, optimizer, ranks)
                    if multiplier is not None:  # lambda as it was at that checkpoint
                        multiplier.load_state_dict(load_extra(ckpt, CONSTRAINT_FILE))
                    monitor.rolled_back(back_to)
                    collector.update(model, done)  # the workers sample from the rolled-back weights
                    continue
            if cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0:
                checkpoint(done)
    if start < a.steps or resume_from is None:
        checkpoint(end)
    return metrics


def run_grpo(run: Run) -> dict[str, Any]:
    """GRPO or RLOO as the run path calls it: the recipe's reward, resume and periodic eval included."""
    final = train_grpo(run.cfg, run.model, run.tokenizer, run.task, run.out_dir, run.sink,
                       resume_from=run.resume_from, on_eval=run.on_eval, scorer=run.scorer,
                       reference_source=run.start_dir, ranks=run.ranks)
    return {"steps": run.cfg.algo.steps, "final": final}
