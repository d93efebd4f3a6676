"""PPO with a value head (RLHF as in Ziegler et al. 2019 and InstructGPT) as an objective of the on-policy
loop (`train/onpolicy.py`): fold the per-token KL penalty into the rewards, GAE over the rollout-time values,
whiten; then per micro-batch the clipped policy loss plus vf_coef times the clipped value loss, both
normalised by the whole minibatch's tokens (so micro-batches sum to the minibatch's loss).

All maths lives in `feedbackrl.algos.ppo`; this file only wires it. The loop gives PPO what it gives GRPO:
`train.precision`, `train.micro_batch_size`, `train.save_optimizer`, resume, the monitors' actions, episode
transcripts; episodes with per-turn credit add their per-token turn advantages to GAE's before whitening.

Departures from InstructGPT: the value head sits on the policy's own last hidden state (one
network, loss = policy + vf_coef * value, as in Ziegler et al.'s shared-trunk variant and TRL's
old `AutoModelForCausalLMWithValueHead`) rather than a separate critic initialised from the
reward model: half the compute on a CPU. The head is zero-initialised, so the first values are 0.
Checkpoints carry the value head (`value_head.pt`) beside the policy, so `--resume` continues a run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.algos.ppo import gae, kl_penalised_rewards, ppo_policy_loss, value_loss, whiten
from feedbackrl.config import RunConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Collector, Scorer
from feedbackrl.log import MetricsSink
from feedbackrl.models.logprobs import positions, token_logprobs
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.train.checkpoint import load_extra
from feedbackrl.train.onpolicy import BatchPass, Capabilities, LossParts, train_on_policy

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
    logprobs, entropy, hidden = logprobs_and_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                                    temperature)
    return logprobs, head_values(value_head, hidden, completion_mask), entropy


def head_values(head: nn.Module, hidden: Tensor, completion_mask: Tensor) -> Tensor:
    """A value head's (N, T) values on the hidden states of `logprobs_and_hidden`, float32, 0 on padding."""
    return head(hidden).squeeze(-1).float() * completion_mask.float()


def logprobs_and_hidden(model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """One forward pass -> per-token log-probs and entropy (N, T), and the (N, T, H) last hidden states at the
    positions that predict each completion token (what value heads read)."""
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
    return logprobs, entropy, hidden


class PPO:
    """PPO (`algo.name = "ppo"`); with `[constraint]` the run path takes `train/ppo_lagrangian.py` instead."""

    name = "ppo"
    capabilities: ClassVar[Capabilities] = Capabilities()  # one process on the CPU; the rest is refused by name

    def __init__(self, cfg: RunConfig, value_head: nn.Module) -> None:
        self.cfg, self.value_head = cfg, value_head

    @classmethod
    def build(cls, cfg: RunConfig, model: PreTrainedModel) -> PPO:
        return cls(cfg, make_value_head(model).to(model.device))

    def modules(self) -> list[nn.Module]:
        return [self.value_head]

    def prepare(self, batch: Batch, model: PreTrainedModel, rollout_pass: BatchPass, ref_lp: Tensor | None,
                kl_coef: float) -> dict[str, Tensor]:
        a, mask = self.cfg.algo, batch.completion_mask
        temp = self.cfg.rollout.temperature
        old_lp, old_values, _ = rollout_pass(lambda *t: logprobs_and_values(model, self.value_head, *t, temp))
        ref_lp = ref_lp if ref_lp is not None else old_lp
        # KL-shaped per-token rewards, GAE over the rollout-time values, whitened advantages
        rewards = kl_penalised_rewards(batch.rewards, old_lp, ref_lp, mask, kl_coef)  # (N, T)
        advantages, returns = gae(rewards, old_values, mask, a.gamma, a.lam)
        if batch.turn_advantages is not None:  # episodes with per-turn credit
            advantages = advantages + batch.turn_advantages
        if a.whiten_advantages:
            advantages = whiten(advantages, mask)
        batch.metrics["kl/mean"] = ((old_lp - ref_lp) * mask).sum().item() / max(int(mask.sum()), 1)
        return {"old_lp": old_lp, "advantages": advantages, "old_values": old_values, "returns": returns}

    def loss(self, model: PreTrainedModel, mb: list[Tensor], rows: dict[str, Tensor], norm: dict[str, float],
             kl_coef: float) -> LossParts:
        a, mask = self.cfg.algo, mb[3]
        logprobs, entropy, hidden = logprobs_and_hidden(model, *mb, self.cfg.rollout.temperature)
        values = head_values(self.value_head, hidden, mask)
        pg, pg_stats = ppo_policy_loss(logprobs, rows["old_lp"], rows["advantages"], mask, a.clip,
                                       num_tokens=norm["num_tokens"])
        vl, v_stats = value_loss(values, rows["old_values"], rows["returns"], mask, a.value_clip,
                                 num_tokens=norm["num_tokens"])
        return LossParts(pg + a.vf_coef * vl, rows={"entropy": entropy.detach()},
                         totals=token_weighted({"loss/policy": pg, "loss/value": vl}, {**pg_stats, **v_stats}, mask))

    def stats(self, rows: dict[str, Tensor], totals: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
        return minibatch_stats(rows, totals, mask)

    def state_dict(self) -> dict[str, Any]:
        return {VALUE_HEAD_FILE: self.value_head.state_dict()}

    def load_state_dict(self, ckpt: Path) -> None:
        self.value_head.load_state_dict(load_extra(ckpt, VALUE_HEAD_FILE))


def token_weighted(losses: dict[str, Tensor], means: dict[str, Tensor], mask: Tensor) -> dict[str, Tensor]:
    """A micro-batch's totals: its losses as they are (already over the minibatch's tokens, so they sum to the
    minibatch's) and its token means times its token count (summed, then divided by the minibatch's tokens)."""
    count = mask.float().sum().clamp(min=1)
    return {**{k: v.detach() for k, v in losses.items()}, **{k: v.detach() * count for k, v in means.items()}}


def minibatch_stats(rows: dict[str, Tensor], totals: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
    n_tok = mask.sum().clamp(min=1)
    out = {k: (v if k.startswith("loss/") else v / n_tok).item() for k, v in totals.items()}
    return {**out, "entropy/mean": ((rows["entropy"] * mask).sum() / n_tok).item()}


def train_ppo(cfg: RunConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
              out_dir: Path, sink: MetricsSink, scorer: Scorer | None = None, resume_from: Path | None = None,
              on_eval: Callable[[int], dict[str, Any]] | None = None, monitor: Monitor | None = None,
              reference_source: Path | None = None, collector: Collector | None = None) -> dict[str, Any]:
    """Run PPO (PPO-Lagrangian with `[constraint]`) with the on-policy loop; the arguments are
    `train_on_policy`'s."""
    from feedbackrl.train.ppo_lagrangian import PPOLagrangian  # it builds on this file

    objective = (PPOLagrangian if cfg.constraint is not None else PPO).build(cfg, model)
    return train_on_policy(cfg, objective, model, tokenizer, task, out_dir, sink, resume_from=resume_from,
                           on_eval=on_eval, scorer=scorer, monitor=monitor, collector=collector,
                           reference_source=reference_source)
