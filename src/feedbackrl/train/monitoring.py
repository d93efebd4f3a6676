"""What the on-policy loops need to act on the monitors: the default monitor and the rollback.

The loops call `Monitor.after_step` once per step (see `feedbackrl.monitors.monitor`); these two
helpers keep the loops' own edits to a few lines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from feedbackrl.config import RunConfig
from feedbackrl.data.labeller import gold_score_for
from feedbackrl.envs.base import Task
from feedbackrl.models.load import load_policy
from feedbackrl.monitors.monitor import Decision, Monitor
from feedbackrl.train.checkpoint import CheckpointError, latest_checkpoint, load_trainer_state
from feedbackrl.train.context import OneProcess, Ranks


def live_monitor(cfg: RunConfig, out_dir: Path, monitor: Monitor | None, task: Task) -> Monitor | None:
    """The monitor a caller passed in, else one built from the recipe's `[monitors]` (None when disabled).

    With `monitors.gold_every`, the built monitor's gold check is the task's hidden gold score
    (`data.labeller.gold_score_for`; the verifier for tasks without one).
    """
    if monitor is not None:
        return monitor
    if not cfg.monitors.enabled:
        return None
    return Monitor(cfg.monitors, out_dir, gold_score_for(task) if cfg.monitors.gold_every else None)


def after_step(cfg: RunConfig, done: int, batch: Any, metrics: dict[str, Any], monitor: Monitor | None,
               on_eval: Callable[[int], dict[str, Any]] | None, kl_coef: float) -> Decision | None:
    """What every on-policy loop does once a step's metrics are in: the periodic held-out eval, then the
    monitors; both add to `metrics`. -> the monitors' decision (None when they are off)."""
    if on_eval is not None and cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.algo.steps:
        metrics.update(on_eval(done))
    decision = monitor.after_step(done, batch, metrics) if monitor is not None else None
    if decision is not None:
        metrics.update({**decision.metrics, "algo/kl_coef": kl_coef})
    return decision


def roll_back(out_dir: Path, model: Any, optimizer: torch.optim.Optimizer,
              ranks: Ranks | None = None) -> tuple[int, Path]:
    """Load the policy weights and optimizer state of the run's latest checkpoint; returns its step and dir.
    Under `torchrun` every rank reads it (a sharded learner's ranks keep their shards: `ranks`).

    The RNGs are not restored: replaying the same samples would walk into the same hack.
    """
    ranks = ranks or OneProcess()
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        raise CheckpointError(f"monitor asked for a rollback but {out_dir}/checkpoints holds no checkpoint")
    ranks.load_model_state(model, load_policy(str(ckpt)).state_dict())
    state = load_trainer_state(ckpt)
    ranks.load_optimizer_state(model, optimizer, state.optimizer)
    return state.step, ckpt
