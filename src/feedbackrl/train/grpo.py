"""GRPO and RLOO as objectives of the on-policy loop (`train/onpolicy.py`): group-relative advantages of the
completions' rewards (GRPO: group-normalised; RLOO: leave-one-out), and the clipped policy-gradient loss with
the k3 KL to the frozen reference, aggregated as `algo.aggregation` says.

With `[constraint]` (GRPO-Lagrangian) the multiplier steps on the batch's costs first, then the reward's and
the cost's advantages are combined as (A_r - lambda A_c) / (1 + lambda) (`train/constraint.py`). Episodes with
per-turn credit add their per-token turn advantages to the trajectory's. A stale batch (asynchronous Ray
workers) is clipped around the policy before this update and weighted by its gap to the sampler
(`algos.staleness.decoupled_pg_loss`).

All maths lives in `feedbackrl.algos`; this file only wires it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.advantages import group_advantages, rows_with_signal
from feedbackrl.algos.aggregate import AGGREGATIONS
from feedbackrl.algos.kl import kl_k3
from feedbackrl.algos.policy_gradient import clipped_pg_loss
from feedbackrl.algos.rloo import rloo_advantages
from feedbackrl.algos.staleness import decoupled_pg_loss
from feedbackrl.config import RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Collector, Scorer
from feedbackrl.log import MetricsSink
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.scale.ranks import Ranks
from feedbackrl.train.checkpoint import load_extra
from feedbackrl.train.constraint import CONSTRAINT_FILE, Multiplier, constrained_advantages, multiplier_costs
from feedbackrl.train.onpolicy import (  # noqa: F401 (make_collector, make_optimizer, stale_metrics: their old home)
    BatchPass,
    Capabilities,
    LossParts,
    make_collector,
    make_optimizer,
    stale_metrics,
    train_on_policy,
)

# the algorithm's name picks its advantage function (GRPO: group-normalised; RLOO: leave-one-out)
ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {"grpo": group_advantages, "rloo": rloo_advantages}


class GroupRelative:
    """GRPO (`algo.name = "grpo"`) or RLOO (`"rloo"`), with or without `[constraint]`."""

    capabilities: ClassVar[Capabilities] = Capabilities(torchrun=True, sharded=True, ray=True, vllm=True,
                                                        constraint=True, off_cpu=True, skip_zero_advantage=True)

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.name = cfg, cfg.algo.name
        # [constraint]: the Lagrange multiplier that keeps the mean cost under the threshold (train/constraint.py)
        self.multiplier = (Multiplier.from_config(cfg.constraint, cfg.rollout.group_size)
                           if cfg.constraint is not None else None)
        self.aggregate = AGGREGATIONS[cfg.algo.aggregation]

    @classmethod
    def build(cls, cfg: RunConfig, model: PreTrainedModel) -> GroupRelative:
        return cls(cfg)

    def modules(self) -> list[nn.Module]:
        return []

    def prepare(self, batch: Batch, model: PreTrainedModel, rollout_pass: BatchPass, ref_lp: Tensor | None,
                kl_coef: float) -> dict[str, Tensor]:
        a, G = self.cfg.algo, self.cfg.rollout.group_size
        if self.multiplier is None:
            advantages = ADVANTAGES[a.name](batch.rewards, G, scale=a.scale_advantages)
        else:
            batch.metrics.update(self.multiplier.update(multiplier_costs(batch)))
            advantages, adv_stats = constrained_advantages(ADVANTAGES[a.name], batch.rewards, batch.signals["cost"],
                                                           G, self.multiplier.lam, a.scale_advantages)
            batch.metrics.update(adv_stats)
        if batch.turn_advantages is not None:  # episodes with per-turn credit: (N,) -> (N, T)
            advantages = advantages[:, None] + batch.turn_advantages
        out = {"advantages": advantages}
        # old log-probs only matter when the policy moves within a batch; with one update the
        # ratio is exactly 1 and the detached current log-probs serve
        if a.epochs * a.minibatches > 1:
            out["old_lp"] = rollout_pass(lambda *t: sequence_logprobs(model, *t, self.cfg.rollout.temperature)[0])
        if ref_lp is not None:
            out["ref_lp"] = ref_lp
        if batch.logprobs is not None:  # a stale batch's sampling log-probs (N, T)
            out["behaviour"] = batch.logprobs
        return out

    def rows_with_signal(self, prepared: dict[str, Tensor]) -> Tensor:
        """(N,) bool: the rows whose loss has a gradient when the KL coefficient is 0 (a nonzero advantage)."""
        return rows_with_signal(prepared["advantages"])

    def loss(self, model: PreTrainedModel, mb: list[Tensor], rows: dict[str, Tensor], norm: dict[str, float],
             kl_coef: float) -> LossParts:
        a, mask = self.cfg.algo, mb[3].float()
        logprobs, entropy = sequence_logprobs(model, *mb, self.cfg.rollout.temperature, with_entropy=True)
        old = rows["old_lp"] if "old_lp" in rows else logprobs.detach()
        logged = {}
        if "behaviour" not in rows:
            pg, pg_stats = clipped_pg_loss(logprobs, old, rows["advantages"], mask, a.clip_low, a.clip_high)
        else:  # clip around the policy before this update, weight by its gap to the sampler
            pg, pg_stats = decoupled_pg_loss(logprobs, old, rows["behaviour"], rows["advantages"], mask, a.clip_low,
                                             a.clip_high, self.cfg.scale.importance_cap)
            logged = {k: pg_stats[k].item() for k in ("is_weight/mean", "is_weight/truncated_frac")}
        per_token = pg
        kl = torch.zeros_like(pg)
        if "ref_lp" in rows:
            kl = kl_k3(logprobs, rows["ref_lp"])
            per_token = pg + kl_coef * kl
        return LossParts(self.aggregate(per_token, mask, **norm),
                         rows={"pg": pg.detach(), "kl": kl.detach(), "entropy": entropy},
                         totals={"clipped": pg_stats["clip_frac"] * mask.sum().clamp(min=1.0)}, logged=logged)

    def stats(self, rows: dict[str, Tensor], totals: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
        max_len, n_tok = self.cfg.rollout.max_new_tokens, mask.sum().clamp(min=1)
        return {"loss/policy": self.aggregate(rows["pg"], mask, max_len=max_len).item(),
                "loss/kl": self.aggregate(rows["kl"], mask, max_len=max_len).item(),
                "kl/mean": ((rows["kl"] * mask).sum() / n_tok).item(),
                "entropy/mean": ((rows["entropy"] * mask).sum() / n_tok).item(),
                "clip_frac": (totals["clipped"] / n_tok).item()}

    def state_dict(self) -> dict[str, Any]:
        return {CONSTRAINT_FILE: self.multiplier.state_dict()} if self.multiplier is not None else {}

    def load_state_dict(self, ckpt: Path) -> None:
        if self.multiplier is not None:  # lambda as it was at that checkpoint
            self.multiplier.load_state_dict(load_extra(ckpt, CONSTRAINT_FILE))


def train_grpo(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
               out_dir: Path, sink: MetricsSink, resume_from: Path | None = None,
               on_eval: Callable[[int], dict[str, Any]] | None = None,
               scorer: Scorer | None = None, monitor: Monitor | None = None,
               collector: Collector | None = None, reference_source: Path | None = None,
               ranks: Ranks | None = None) -> dict[str, Any]:
    """Run GRPO or RLOO (`cfg.algo.name`) with the on-policy loop; the arguments are `train_on_policy`'s."""
    return train_on_policy(cfg, GroupRelative(cfg), model, tokenizer, task, out_dir, sink, resume_from=resume_from,
                           on_eval=on_eval, scorer=scorer, monitor=monitor, collector=collector,
                           reference_source=reference_source, ranks=ranks)
