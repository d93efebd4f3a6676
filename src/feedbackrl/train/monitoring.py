"""What the on-policy loops need to act on the monitors: the default monitor, the step's check and the rollback.

Both loops, the text loop (`train/onpolicy.py`) and the control loop (`control/loop.py`), call `after_step` once
per step (the periodic eval, then `Monitor.after_step`, see `feedbackrl.monitors.monitor`) and act on its
`Decision` the same way: `stop` ends the run there (its last checkpoint is that step's), `rollback` is
`roll_back` to the run's latest checkpoint (that step is not checkpointed), and the text loop's `raise_kl`
raises its KL coefficient (a control policy has no KL term, so a control recipe cannot ask for it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from feedbackrl.config import RewardConfig, RunConfig
from feedbackrl.data.labeller import gold_score_for
from feedbackrl.envs.base import Task
from feedbackrl.log import console
from feedbackrl.monitors.audit import AuditChannel, SourceAudit
from feedbackrl.monitors.monitor import Decision, Monitor
from feedbackrl.rewards.registry import build_reward
from feedbackrl.scale.ranks import OneProcess, Ranks
from feedbackrl.train.checkpoint import CheckpointError, PolicyFiles, latest_checkpoint, load_trainer_state


def live_monitor(cfg: RunConfig, out_dir: Path, monitor: Monitor | None, task: Task) -> Monitor | None:
    """The monitor a caller passed in, else one built from the recipe's `[monitors]` (None when disabled).

    With `monitors.gold_every`, the built monitor's gold check is the task's hidden gold score
    (`data.labeller.gold_score_for`; the verifier for tasks without one).
    """
    if monitor is not None:
        return monitor
    if not cfg.monitors.enabled:
        return None
    return Monitor(cfg.monitors, out_dir, gold_score_for(task) if cfg.monitors.gold_every else None,
                   audits=build_audits(cfg, out_dir, task))


def build_audits(cfg: RunConfig, out_dir: Path, task: Task) -> list[AuditChannel]:
    """The audit channels of `[monitors.audit]`: each reward source (a stricter verifier, a judge), then people
    in the labelling app. The monitor's `close()` ends the app and its labellers (a daemon thread otherwise)."""
    audit = cfg.monitors.audit
    channels: list[AuditChannel] = [
        SourceAudit(name, build_reward(RewardConfig(**node), task.verify_batch, f"monitors.audit.sources.{name}"))
        for name, node in audit.sources.items()]
    if audit.people.enabled:
        from feedbackrl.train.audit_people import start_people_audit

        gold = gold_score_for(task) if audit.people.simulated else None
        channels.append(start_people_audit(audit.people, out_dir, gold, cfg.train.seed))
    return channels


def after_step(cfg: RunConfig, done: int, batch: Any, metrics: dict[str, Any], monitor: Monitor | None,
               on_eval: Callable[[int], dict[str, Any]] | None, kl_coef: float | None) -> Decision | None:
    """What every on-policy loop does once a step's metrics are in: the periodic held-out eval, then the
    monitors; both add to `metrics` (and `algo/kl_coef` unless None: a loop without a KL term). Each alert is
    printed. -> the monitors' decision (None when they are off)."""
    if on_eval is not None and cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.algo.steps:
        metrics.update(on_eval(done))
    decision = monitor.after_step(done, batch, metrics) if monitor is not None else None
    if decision is not None:
        metrics.update(decision.metrics)
        if kl_coef is not None:
            metrics["algo/kl_coef"] = kl_coef
        for alert in decision.alerts:
            console.print(f"[yellow]monitor alert[/yellow] {alert.detector} at step {done}: {alert.message} "
                          f"(action: {alert.action})")
        if decision.stop or done >= cfg.algo.steps:  # the run ends here: stop the audit channels' app and labellers
            monitor.close()  # type: ignore[union-attr]
    return decision


def roll_back(out_dir: Path, policy: PolicyFiles, model: Any, optimizer: torch.optim.Optimizer, monitor: Monitor,
              ranks: Ranks | None = None) -> Path:
    """A monitor's rollback: load the policy weights (read by `policy`, the loop's `PolicyFiles`) and the
    optimizer state of the run's latest checkpoint into `model` and `optimizer`, and tell `monitor` (it forgets
    the rows after that step and arms its detectors again). -> the checkpoint dir, from which the loop reloads
    the algorithm's own state (value heads, the multiplier). Under `torchrun` every rank reads it (a sharded
    learner's ranks keep their shards: `ranks`).

    The RNGs are not restored: replaying the same samples would walk into the same hack.
    """
    ranks = ranks or OneProcess()
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        raise CheckpointError(f"monitor asked for a rollback but {out_dir}/checkpoints holds no checkpoint")
    ranks.load_model_state(model, policy.load_weights(ckpt))
    state = load_trainer_state(ckpt)
    ranks.load_optimizer_state(model, optimizer, state.optimizer)
    monitor.rolled_back(state.step)
    return ckpt
