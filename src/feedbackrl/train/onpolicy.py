"""The one on-policy loop, top to bottom: sample prompts, roll out, score, let the objective compute what its
loss needs from the batch (advantages, old log-probs, values), then for each epoch and minibatch the
objective's loss over micro-batches, step and log.

The loop owns everything that is the same for every on-policy algorithm: the collector (this process,
`torchrun`'s ranks, vLLM or Ray workers), the RNG streams and resume, the frozen reference policy, the ranks,
micro-batches (`train.micro_batch_size`), precision (`train.precision`), episode transcripts, the monitors and
their rollback, and checkpoints (`train.save_optimizer`). What differs is an `Objective` (GRPO and RLOO in
`train/grpo.py`, PPO in `train/ppo.py`, PPO-Lagrangian in `train/ppo_lagrangian.py`): what to compute from a
batch, the loss of a micro-batch, the modules it trains beside the policy (a value head) and its state in
checkpoints. Each objective declares its `Capabilities` next to it; a recipe that needs one it lacks is refused
before any work (`check_capabilities`), naming the setting.

All maths lives in `feedbackrl.algos`; this file and the objectives only wire it. The checkpoint writer
(`train/checkpoint.py`) and the monitors' check and actions (`train/monitoring.py`) are the control loop's too
(`control/loop.py`, whose docstring says what else one loop for both would need).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.staleness import staleness
from feedbackrl.config import ConfigError, RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Collector, Scorer
from feedbackrl.episodes.kinds import InProcessCollector, check_task_kind
from feedbackrl.episodes.multi_turn import write_transcripts
from feedbackrl.episodes.single_turn import task_scorer
from feedbackrl.log import MetricsSink, console, progress
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.models.lora import adapters_disabled, is_lora
from feedbackrl.models.policy import train_autocast
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.scale.ranks import OneProcess, Ranks
from feedbackrl.train.checkpoint import (
    PretrainedFiles,
    frozen_reference,
    latest_checkpoint,
    load_extra,
    restore,
    save_checkpoint,
)
from feedbackrl.train.context import Run
from feedbackrl.train.monitoring import after_step, live_monitor, roll_back
from feedbackrl.train.optim import adamw
from feedbackrl.train.probe import PROBE_FILE, ProbeSet


@dataclass(frozen=True)
class Capabilities:
    """What an objective runs with besides one process on the CPU; each False is refused before any work."""

    torchrun: bool = False  # data-parallel ranks under torchrun (scale.learner = "ddp")
    sharded: bool = False  # scale.learner = "fsdp"
    ray: bool = False  # scale.rollout_workers / scale.reward_workers (and their stale batches)
    vllm: bool = False  # rollout.backend = "vllm"
    constraint: bool = False  # [constraint]: a Lagrange multiplier on the [cost]
    off_cpu: bool = False  # train.device = cuda
    skip_zero_advantage: bool = False  # train.skip_zero_advantage: the objective's `rows_with_signal`


@dataclass
class LossParts:
    """One micro-batch's loss and what the objective logs from it."""

    loss: Tensor  # the scalar to backpropagate; normalised by the whole minibatch (so micro-batches sum)
    rows: dict[str, Tensor] = field(default_factory=dict)  # detached, one row per completion: concatenated over
    # the minibatch's micro-batches and ranks, then handed to `Objective.stats`
    totals: dict[str, Tensor] = field(default_factory=dict)  # detached scalars summed over micro-batches and ranks
    logged: dict[str, float] = field(default_factory=dict)  # logged as they are, averaged over the step


# (fn over this rank's rows of (prompt_ids, prompt_mask, completion_ids, completion_mask) -> tensors) -> every
# row's tensors: a no-grad pass over the whole batch in the training precision, shared among the ranks
BatchPass = Callable[[Callable[..., Tensor | tuple[Tensor, ...]]], Any]


class Objective(Protocol):
    """An on-policy algorithm as the loop sees it. `prepare` runs once per step without gradients and returns
    per-row tensors (N, ...) the loss reads, indexed by the loop for each micro-batch; `loss` runs once per
    micro-batch with gradients; `stats` turns a minibatch's `LossParts` into its logged statistics."""

    name: str
    capabilities: ClassVar[Capabilities]

    def modules(self) -> list[nn.Module]: ...  # trained beside the policy (in the optimizer, gradients summed)

    def prepare(self, batch: Batch, model: PreTrainedModel, rollout_pass: BatchPass, ref_lp: Tensor | None,
                kl_coef: float) -> dict[str, Tensor]: ...

    def loss(self, model: PreTrainedModel, mb: list[Tensor], rows: dict[str, Tensor], norm: dict[str, float],
             kl_coef: float) -> LossParts: ...

    def stats(self, rows: dict[str, Tensor], totals: dict[str, Tensor], mask: Tensor) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...  # checkpoint file name -> state (value heads, the multiplier)

    def load_state_dict(self, ckpt: Path) -> None: ...  # from a checkpoint dir (resume, a monitor's rollback)


def check_capabilities(cfg: RunConfig, name: str, caps: Capabilities, world: int | None = None) -> None:
    """Refuse, naming the setting, a recipe that asks the objective `name` for something it does not run with.
    `world`: torchrun's WORLD_SIZE (default: from the environment)."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    needs = [
        (world > 1 and cfg.scale.learner == "ddp", caps.torchrun, "torchrun (a data-parallel learner)",
         "launch it without torchrun"),
        (world > 1 and cfg.scale.learner == "fsdp", caps.sharded, "scale.learner = 'fsdp'",
         "use scale.learner = 'ddp' or one process"),
        (cfg.scale.uses_ray, caps.ray, "scale.rollout_workers / scale.reward_workers",
         "set both to 0"),
        (cfg.rollout.backend == "vllm", caps.vllm, "rollout.backend = 'vllm'", "use rollout.backend = 'native'"),
        (cfg.constraint is not None, caps.constraint, "[constraint]", "remove [constraint]"),
        (cfg.train.skip_zero_advantage, caps.skip_zero_advantage, "train.skip_zero_advantage",
         "set it to false"),
        # the ranks' shares of a minibatch would differ in size once rows are skipped
        (cfg.train.skip_zero_advantage and world > 1, False, "train.skip_zero_advantage with torchrun",
         "set it to false or run one process"),
    ]  # off_cpu: the run path's check of train.device (`train/run.py:check_run`)
    for asked, supported, setting, fix in needs:
        if asked and not supported:
            raise ConfigError(f"{setting}: algo.name = {name!r} does not run with it so far; {fix}")


def make_optimizer(model: PreTrainedModel, cfg: RunConfig, modules: list[nn.Module] | None = None
                   ) -> torch.optim.Optimizer:
    # the trainable parameters only: with LoRA the frozen base has no optimizer state to keep
    params = [p for p in model.parameters() if p.requires_grad]
    params += [p for m in modules or [] for p in m.parameters()]
    return adamw(params, lr=cfg.algo.lr, weight_decay=getattr(cfg.algo, "weight_decay", 0.0))


def make_collector(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                   scorer: Scorer, ranks: Ranks | None = None) -> Collector:
    """This process's collect step, the `torchrun` ranks' (each generates a share), vLLM's
    (`rollout.backend = "vllm"`), or Ray workers' when the recipe's `[scale]` section asks for them; what the
    task's kind cannot roll out with is refused first (`episodes/kinds.py:check_task_kind`)."""
    ranked = ranks is not None and ranks.world > 1
    check_task_kind(cfg, task, ranks.world if ranks is not None else 1, ranks is not None and ranks.sharded)
    if ranks is not None and ranked:
        return ranks.collector(model, tokenizer, task, scorer, cfg.rollout)
    if cfg.rollout.backend == "vllm":
        from feedbackrl.scale.vllm_rollout import vllm_collector  # vLLM is an optional extra: imported only when used

        return vllm_collector(cfg, model, tokenizer, task, scorer)
    if not cfg.scale.uses_ray:
        return InProcessCollector(model, tokenizer, task, scorer, cfg.rollout)
    from feedbackrl.scale.collectors import ray_collector  # Ray is an optional extra: imported only when used

    return ray_collector(cfg, model, tokenizer, task, scorer)


def minibatches(n: int, parts: int, generator: torch.Generator) -> list[Tensor]:
    """Row indices of `parts` minibatches: all rows in order when parts = 1, else a seeded shuffle."""
    if parts == 1:
        return [torch.arange(n)]
    return list(torch.randperm(n, generator=generator).chunk(parts))


def stale_metrics(versions: torch.Tensor | None, learner_version: int, bound: int) -> dict[str, float]:
    """scale/staleness_{mean,max} of a batch sampled by workers; an error past the bound."""
    if versions is None:
        return {}
    age = staleness(versions, learner_version)
    if int(age.max()) > bound:
        raise RuntimeError(f"a sample is {int(age.max())} policy versions old, past scale.max_staleness={bound}")
    return {"scale/staleness_mean": age.float().mean().item(), "scale/staleness_max": float(age.max())}


def no_grad_pass(fn: Callable[..., Any], rows: list[Tensor], n: int, ranks: Ranks,
                 precision: Callable[[], contextlib.AbstractContextManager[None]]) -> Any:
    """`fn` over this rank's `rows` without gradients in the training precision -> its tensor(s), all n rows."""
    with torch.no_grad(), precision():
        out = fn(*rows)
    return ranks.gather(out, n) if isinstance(out, Tensor) else tuple(ranks.gather(o, n) for o in out)


def train_on_policy(cfg: RunConfig, objective: Objective, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    task: Task, out_dir: Path, sink: MetricsSink, resume_from: Path | None = None,
                    on_eval: Callable[[int], dict[str, Any]] | None = None,
                    scorer: Scorer | None = None, monitor: Monitor | None = None,
                    collector: Collector | None = None, reference_source: Path | None = None,
                    ranks: Ranks | None = None) -> dict[str, Any]:
    """Train `model` with `objective` from step 0 (or from a checkpoint) to `cfg.algo.steps`. Returns the last
    metrics.

    Completions are scored by the task's verifier, or by `scorer` when given; batches come from
    `collector` when given, else from `make_collector` (this process unless `[scale]` asks for workers).
    `monitor` (default: one built from `[monitors]`) checks every step and may stop, roll back or raise
    the KL coefficient. `reference_source`: a model directory that already holds the starting weights
    (recorded instead of a copy of the KL reference). `ranks`: the data-parallel learner's processes under
    `torchrun` (`scale/ddp.py`); each trains on its share of every minibatch and only rank 0 writes.
    """
    ranks = ranks or OneProcess()
    check_capabilities(cfg, objective.name, objective.capabilities, ranks.world)
    probing = cfg.constraint is not None and cfg.constraint.probe_prompts > 0
    if probing and ranks.world > 1:
        raise ConfigError("constraint.probe_prompts under torchrun: the probe prompts are sampled in one process "
                          "so far; remove probe_prompts or launch it without torchrun")
    scorer = scorer or task_scorer(task)
    collector = collector or make_collector(cfg, model, tokenizer, task, scorer, ranks)
    a, ro_cfg = cfg.algo, cfg.rollout
    B, G = ro_cfg.prompts_per_step, ro_cfg.group_size
    extra = objective.modules()  # a value head, trained with the policy
    optimizer = make_optimizer(model, cfg, extra)
    trainable = [p for p in model.parameters() if p.requires_grad] + [p for m in extra for p in m.parameters()]
    clipped = list(model.parameters()) + [p for m in extra for p in m.parameters()]
    prompt_rng = random.Random(cfg.train.seed)
    sample_rng = torch.Generator().manual_seed(cfg.train.seed)
    # constraint.probe_prompts: drawn from the task in its initial state, before a resume restores its state
    probe = (ProbeSet.draw(task, cfg.constraint, cfg.train.seed, cfg.task.heldout_size)
             if probing and cfg.constraint is not None else None)
    rngs = {"prompt_rng": prompt_rng, "sample_rng": sample_rng}
    start = 0
    if resume_from is not None:
        saved = restore(resume_from, optimizer, rngs,
                        load_optimizer=functools.partial(ranks.load_optimizer_state, model, optimizer))
        start = saved.step
        if saved.loop_state.get("task_state") is not None:
            task.load_state_dict(saved.loop_state["task_state"])
        objective.load_state_dict(resume_from)  # value heads, the multiplier
        if probe is not None:
            probe.load_state_dict(load_extra(resume_from, PROBE_FILE))
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
    micro = cfg.train.micro_batch_size  # 0: each minibatch in one forward/backward
    metrics: dict[str, Any] = {}

    def extras() -> dict[str, Any] | None:  # the objective's state (value heads, the multiplier) and the probes'
        state = {**objective.state_dict(), **({PROBE_FILE: probe.state_dict()} if probe is not None else {})}
        return state or None

    def checkpoint(step: int) -> None:
        if not (ranks.main or ranks.sharded):  # rank 0 writes; the replicas are equal
            return
        whole = ranks.full_model(model)  # a sharded policy's ranks all take part in gathering it to rank 0
        state = ranks.full_optimizer_state(model, optimizer) if cfg.train.save_optimizer else None
        if ranks.main:
            save_checkpoint(out_dir, step, PretrainedFiles(whole, tokenizer), state, rngs,
                            cfg.model_dump_json(indent=2), {"task_state": task.state_dict()}, extras())

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
            batch.metrics.update(stale_metrics(batch.policy_versions, step, cfg.scale.max_staleness))
            if cfg.constraint is not None and "cost" not in batch.signals:
                raise ConfigError(f"[constraint]: the batches of task {task.name!r} carry no cost (its episodes "
                                  "are scored by the environment, not by [cost]); remove [constraint]")
            if probe is not None:  # the costs the multiplier steps on: the probe set's, sampled now
                batch.probe_costs, probe_stats = probe.collect(model, tokenizer, task, scorer, ro_cfg)
                batch.metrics.update(probe_stats)
            if batch.episodes is not None and ranks.main:
                write_transcripts(out_dir / "episodes.jsonl", step + 1, batch.episodes)
            tensors, mask = batch.tensors, batch.completion_mask.float()
            # each rank computes its share of the rows' no-grad passes; every rank gets them all
            mine, n = [t[ranks.share(B * G)] for t in tensors], B * G

            rollout_pass = functools.partial(no_grad_pass, rows=mine, n=n, ranks=ranks, precision=precision)
            ref_lp = None
            if ref is not None:
                ref_lp = rollout_pass(lambda *t: sequence_logprobs(ref, *t, ro_cfg.temperature)[0])
            elif wants_ref:
                with adapters_disabled(model):
                    ref_lp = rollout_pass(lambda *t: sequence_logprobs(model, *t, ro_cfg.temperature)[0])
            # 3. what the objective's loss needs from the batch: advantages (GRPO's group-relative, PPO's GAE over
            # its value head), old log-probs; with [constraint] the multiplier steps on this batch's costs first
            prepared = objective.prepare(batch, model, rollout_pass, ref_lp, kl_coef)
            skip_rows = (objective.rows_with_signal(prepared)  # type: ignore[attr-defined]
                         if cfg.train.skip_zero_advantage and kl_coef == 0 else None)
            # 4. optimise: epochs x minibatches, each minibatch over micro-batches (gradient accumulation)
            stats: dict[str, list[float]] = {}
            model.train()
            for _ in range(a.epochs):
                for idx in minibatches(B * G, a.minibatches, sample_rng):
                    mb_mask = mask[idx]
                    # the loss's normalisers are the whole minibatch's, so summing the micro-batches'
                    # losses (gradient accumulation) and the ranks' gradients gives the minibatch's gradient
                    norm = {"num_tokens": float(mb_mask.sum()), "num_sequences": float(len(idx)),
                            "max_len": ro_cfg.max_new_tokens}
                    rows: dict[str, list[Tensor]] = {}
                    totals: dict[str, list[Tensor]] = {}
                    logged: dict[str, list[float]] = {}
                    own = idx[ranks.share(len(idx))]  # this rank's rows of the minibatch (all of them in one process)
                    if skip_rows is not None:  # the rows with a gradient; at least one micro-batch, for the stats
                        kept = own[skip_rows[own]]
                        own = kept if len(kept) else own[:micro or len(own)]
                        mb_mask = mask[own]
                    for sub in own.split(micro or len(own)):
                        with precision():
                            parts = objective.loss(model, [t[sub] for t in tensors],
                                                   {k: v[sub] for k, v in prepared.items()}, norm, kl_coef)
                        parts.loss.backward()
                        for into, got in ((rows, parts.rows), (totals, parts.totals), (logged, parts.logged)):
                            for k, v in got.items():
                                into.setdefault(k, []).append(v)
                        del parts  # this micro-batch's graph goes now
                    ranks.sum_gradients(trainable)
                    grad_norm = torch.nn.utils.clip_grad_norm_(clipped, a.max_grad_norm)
                    optimizer.step()
                    # free the gradients now, not before the next backward: they would otherwise sit in
                    # memory through the next rollout (a model's worth of floats at peak RSS)
                    optimizer.zero_grad(set_to_none=True)
                    got = objective.stats({k: ranks.gather(torch.cat(v), len(mb_mask)) for k, v in rows.items()},
                                          {k: ranks.sum(sum(v)) for k, v in totals.items()}, mb_mask)
                    for k, v in {**got, "grad_norm": float(grad_norm)}.items():
                        stats.setdefault(k, []).append(v)
                    for k, vs in logged.items():
                        stats.setdefault(k, []).extend(vs)
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
                    ckpt = roll_back(out_dir, PretrainedFiles(model, tokenizer), model, optimizer, monitor, ranks)
                    objective.load_state_dict(ckpt)  # value heads and lambda as they were at that checkpoint
                    if probe is not None:  # the probes' cycle too (not its RNG, as the loop's RNGs)
                        probe.load_state_dict(load_extra(ckpt, PROBE_FILE), generator=False)
                    collector.update(model, done)  # the workers sample from the rolled-back weights
                    continue
            if cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0:
                checkpoint(done)
    if start < a.steps or resume_from is None:
        checkpoint(end)
    return metrics


ObjectiveFactory = Callable[[RunConfig, PreTrainedModel], Objective]


@dataclass(frozen=True)
class OnPolicy:
    """An on-policy algorithm for the run path's registry: the objective a recipe gets (`constrained` when it
    has a [constraint] section and the plain objective does not take one itself)."""

    plain: Any  # an Objective class: `capabilities`, `build(cfg, model)`
    constrained: Any = None

    def objective_class(self, cfg: RunConfig) -> Any:
        return self.constrained if cfg.constraint is not None and self.constrained is not None else self.plain

    def capabilities(self, cfg: RunConfig) -> Capabilities:
        return self.objective_class(cfg).capabilities

    def __call__(self, run: Run) -> dict[str, Any]:
        """The algorithm as the run path calls it: the recipe's reward, resume and periodic eval included."""
        objective = self.objective_class(run.cfg).build(run.cfg, run.model)
        final = train_on_policy(run.cfg, objective, run.model, run.tokenizer, run.task, run.out_dir, run.sink,
                                resume_from=run.resume_from, on_eval=run.on_eval, scorer=run.scorer,
                                reference_source=run.start_dir, ranks=run.ranks)
        return {"steps": run.cfg.algo.steps, "final": final}
