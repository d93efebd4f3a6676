"""The MLP actor-critic for vector observations: a categorical head for discrete actions, a diagonal Gaussian
with a state-independent log-std for continuous ones, and one or two value heads (reward, and cost when a
constraint is on).

Architecture and initialisation follow CleanRL's `ppo.py` / `ppo_continuous_action.py` (two tanh hidden
layers of 64, orthogonal weights with gain sqrt(2), 0.01 on the policy output, 1 on the value output), which is
also Stable-Baselines3's default `MlpPolicy` for PPO, so the two train comparable networks.

Sampling takes an explicit `torch.Generator`, so a checkpoint holds every random stream of the run.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    return nn.Sequential(_layer(n_in, hidden, math.sqrt(2)), nn.Tanh(), _layer(hidden, hidden, math.sqrt(2)),
                         nn.Tanh(), _layer(hidden, n_out, out_gain))


class ActorCritic(nn.Module):
    """obs (B, obs_dim) -> action distribution and values; `value_heads` = 2 adds a cost value (index 1)."""

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: int = 64, value_heads: int = 1) -> None:
        super().__init__()
        self.discrete = discrete
        self.actor = _mlp(obs_dim, hidden, action_dim, 0.01)
        self.critic = _mlp(obs_dim, hidden, value_heads, 1.0)
        self.log_std = None if discrete else nn.Parameter(torch.zeros(action_dim))

    def values(self, obs: Tensor) -> Tensor:
        """(B, obs_dim) -> (B, value_heads)."""
        return self.critic(obs)

    def _log_prob_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        log_std = self.log_std.expand_as(out)
        z = (actions - out) * torch.exp(-log_std)
        logp = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return logp, (log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1)

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """obs (B, obs_dim), actions (B,) or (B, A) -> logprobs (B,), entropy (B,), values (B, value_heads)."""
        logp, ent = self._log_prob_entropy(self.actor(obs), actions)
        return logp, ent, self.values(obs)

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator, greedy: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """obs (B, obs_dim) -> sampled (or greedy) actions, their logprobs (B,), values (B, value_heads)."""
        out = self.actor(obs)
        if self.discrete:
            actions = out.argmax(-1) if greedy else torch.multinomial(torch.softmax(out, -1), 1, generator=generator
                                                                      ).squeeze(-1)
        else:
            noise = torch.randn(out.shape, generator=generator)
            actions = out if greedy else out + torch.exp(self.log_std) * noise
        logp, _ = self._log_prob_entropy(out, actions)
        return actions, logp, self.values(obs)
