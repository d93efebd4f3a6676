"""Learning from an expert's actions: behaviour cloning, DAgger's relabelled states, and takeovers preferred to
the agent's own actions.

- `bc_loss`: behaviour cloning (Pomerleau 1991; Ross, Gordon and Bagnell 2011, "A Reduction of Imitation
  Learning and Structured Prediction to No-Regret Online Learning", for DAgger). The mean negative
  log-likelihood of the expert's action in each state. DAgger uses the same loss on the states the *agent*
  visits, labelled with the action the expert would have taken there.
- `takeover_preference_loss`: when an expert takes over, the action it took is preferred to the one the agent
  was about to take in the same state. PVP (Peng, Mo, Duan, Liu and Zhou 2023, "Learning from Active Human
  Involvement through Proxy Value Propagation") writes this as Q-value targets, +1 for the expert's action and
  -1 for the agent's; for a policy without a Q-function we write it as a Bradley-Terry preference between the
  two actions' log-probabilities in that state: -log sigmoid(beta (log pi(a_expert|s) - log pi(a_agent|s))),
  which DPO without a reference model also is. Departure: no Q-function and no reward-free TD term; the policy
  is trained by PPO on the environment's reward beside this loss.

Both are means over the steps where `mask` is 1 (a step where expert and agent chose the same action carries no
preference: the caller masks it out, its gradient would be 0 anyway).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = mask.float()
    return (x * m).sum() / m.sum().clamp(min=1.0)


def bc_loss(logprobs: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs (N,) of the expert's actions under the policy, mask (N,) -> mean negative log-likelihood.

    Stats: `bc/nll` (the loss) and `bc/likelihood`, the mean probability given to the expert's action."""
    loss = _masked_mean(-logprobs, mask)
    with torch.no_grad():
        return loss, {"bc/nll": loss.detach(), "bc/likelihood": _masked_mean(logprobs.exp(), mask)}


def takeover_preference_loss(expert_logprobs: Tensor, agent_logprobs: Tensor, mask: Tensor,
                             beta: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """expert_logprobs, agent_logprobs (N,): log pi of the expert's and of the agent's action in the same state;
    mask (N,) = 1 on takeover steps where the two differ -> mean of -log sigmoid(beta * margin).

    Stats: `takeover/accuracy` (share of masked steps where the policy already puts more mass on the expert's
    action) and `takeover/margin` (mean log-probability margin)."""
    if beta <= 0:
        raise ValueError(f"takeover_preference_loss: beta must be > 0; got {beta}")
    margin = expert_logprobs - agent_logprobs
    loss = _masked_mean(-torch.nn.functional.logsigmoid(beta * margin), mask)
    with torch.no_grad():
        return loss, {"takeover/accuracy": _masked_mean((margin > 0).float(), mask),
                      "takeover/margin": _masked_mean(margin, mask)}
