"""PPO-Lagrangian (Safe RLHF, Dai et al. 2023) as an objective of the on-policy loop: PPO with a cost value head
beside the reward value head, GAE on the reward and on the cost separately, the per-token advantages combined as
(A_r - lambda A_c) / (1 + lambda) under the recipe's multiplier (`[constraint]`: Safe RLHF's gradient ascent on
log lambda, or the PID-Lagrangian), which steps once per batch on its costs before the advantages are computed.

The maths is `algos.ppo` (GAE, the clipped losses) and `algos.constrained` (`kl_shaped_costs`,
`ppo_lagrangian_advantages`, the multiplier updates); the departures from Safe RLHF are listed there. Both heads
sit on the policy's last hidden state, like PPO's value head (`train/ppo.py`), and are zero-initialised; the
value loss is vf_coef * (reward value loss + cost value loss). Checkpoints carry both heads and the multiplier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import PreTrainedModel

from feedbackrl.algos.constrained import kl_shaped_costs, ppo_lagrangian_advantages
from feedbackrl.algos.ppo import gae, kl_penalised_rewards, ppo_policy_loss, value_loss
from feedbackrl.config import RunConfig
from feedbackrl.episodes.contracts import Batch
from feedbackrl.train.checkpoint import load_extra
from feedbackrl.train.constraint import CONSTRAINT_FILE, Multiplier, multiplier_costs
from feedbackrl.train.onpolicy import BatchPass, Capabilities, LossParts
from feedbackrl.train.ppo import (
    PPO,
    VALUE_HEAD_FILE,
    head_values,
    logprobs_and_hidden,
    make_value_head,
    minibatch_stats,
    token_weighted,
)

COST_VALUE_HEAD_FILE = "cost_value_head.pt"


class PPOLagrangian(PPO):
    """PPO (`algo.name = "ppo"`) with `[constraint]`."""

    capabilities: ClassVar[Capabilities] = Capabilities(constraint=True)

    def __init__(self, cfg: RunConfig, value_head: nn.Module, cost_head: nn.Module) -> None:
        super().__init__(cfg, value_head)
        assert cfg.constraint is not None
        self.cost_head, self.multiplier = cost_head, Multiplier.from_config(cfg.constraint, cfg.rollout.group_size)

    @classmethod
    def build(cls, cfg: RunConfig, model: PreTrainedModel) -> PPOLagrangian:
        return cls(cfg, make_value_head(model).to(model.device), make_value_head(model).to(model.device))

    def modules(self) -> list[nn.Module]:
        return [self.value_head, self.cost_head]

    def prepare(self, batch: Batch, model: PreTrainedModel, rollout_pass: BatchPass, ref_lp: Tensor | None,
                kl_coef: float) -> dict[str, Tensor]:
        a, mask, temp = self.cfg.algo, batch.completion_mask, self.cfg.rollout.temperature

        def both_heads(*t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            logprobs, _, hidden = logprobs_and_hidden(model, *t, temp)
            return logprobs, head_values(self.value_head, hidden, t[3]), head_values(self.cost_head, hidden, t[3])

        old_lp, values, cost_values = rollout_pass(both_heads)
        ref_lp = ref_lp if ref_lp is not None else old_lp
        batch.metrics.update(self.multiplier.update(multiplier_costs(batch)))  # first the multiplier, then the policy
        rewards = kl_penalised_rewards(batch.rewards, old_lp, ref_lp, mask, kl_coef)  # (N, T)
        costs = kl_shaped_costs(batch.signals["cost"], old_lp, ref_lp, mask, kl_coef)
        reward_adv, returns = gae(rewards, values, mask, a.gamma, a.lam)
        cost_adv, cost_returns = gae(costs, cost_values, mask, a.gamma, a.lam)
        if batch.turn_advantages is not None:  # episodes with per-turn credit: the reward's
            reward_adv = reward_adv + batch.turn_advantages
        advantages, stats = ppo_lagrangian_advantages(reward_adv, cost_adv, mask, self.multiplier.lam,
                                                      a.whiten_advantages)
        batch.metrics.update({k: v.item() for k, v in stats.items()})
        batch.metrics["kl/mean"] = ((old_lp - ref_lp) * mask).sum().item() / max(int(mask.sum()), 1)
        return {"old_lp": old_lp, "advantages": advantages, "old_values": values, "returns": returns,
                "old_cost_values": cost_values, "cost_returns": cost_returns}

    def loss(self, model: PreTrainedModel, mb: list[Tensor], rows: dict[str, Tensor], norm: dict[str, float],
             kl_coef: float) -> LossParts:
        a, mask = self.cfg.algo, mb[3]
        logprobs, entropy, hidden = logprobs_and_hidden(model, *mb, self.cfg.rollout.temperature)
        n_tok = norm["num_tokens"]
        pg, pg_stats = ppo_policy_loss(logprobs, rows["old_lp"], rows["advantages"], mask, a.clip, num_tokens=n_tok)
        vl, v_stats = value_loss(head_values(self.value_head, hidden, mask), rows["old_values"], rows["returns"],
                                 mask, a.value_clip, num_tokens=n_tok)
        cl, c_stats = value_loss(head_values(self.cost_head, hidden, mask), rows["old_cost_values"],
                                 rows["cost_returns"], mask, a.value_clip, num_tokens=n_tok)
        c_stats = {f"cost_{k}": v for k, v in c_stats.items()}  # cost_value/clip_frac, cost_value/mean
        return LossParts(pg + a.vf_coef * (vl + cl), rows={"entropy": entropy.detach()},
                         totals=token_weighted({"loss/policy": pg, "loss/value": vl, "loss/cost_value": cl},
                                               {**pg_stats, **v_stats, **c_stats}, mask))

    def stats(self, rows: dict[str, Tensor], totals: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
        return minibatch_stats(rows, totals, mask)

    def state_dict(self) -> dict[str, Any]:
        return {VALUE_HEAD_FILE: self.value_head.state_dict(), COST_VALUE_HEAD_FILE: self.cost_head.state_dict(),
                CONSTRAINT_FILE: self.multiplier.state_dict()}

    def load_state_dict(self, ckpt: Path) -> None:
        super().load_state_dict(ckpt)
        self.cost_head.load_state_dict(load_extra(ckpt, COST_VALUE_HEAD_FILE))
        self.multiplier.load_state_dict(load_extra(ckpt, CONSTRAINT_FILE))
