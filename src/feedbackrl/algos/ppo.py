"""PPO for language models with a learned value head (RLHF as in InstructGPT).

The pieces, in the order the loop uses them:

- `kl_penalised_rewards`: per-token rewards -kl_coef * (logp - ref_logp), with the sequence's
  score (reward model or verifier) added at its last real token. This is the KL-shaped reward of
  Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences", eq. 2) and Ouyang et
  al. 2022 (InstructGPT, eq. 2), with kl_coef their beta. The per-token KL is the plain "k1"
  estimate log(pi/pi_ref) of the sampled token, as in both papers.
- `gae`: Generalised Advantage Estimation (Schulman et al. 2016, eq. 16) over the response tokens,
  one episode per sequence that ends at the last real token.
- `whiten`: masked normalisation of advantages (or rewards) across the whole batch.
- `value_loss`: the clipped value loss of OpenAI's baselines PPO2 / Ziegler et al.'s lm-human-
  preferences: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).
- `ppo_policy_loss`: `policy_gradient.clipped_pg_loss` (Schulman et al. 2017, eq. 7) with token
  advantages (N, T), averaged over real tokens.

Departures:
- No bootstrapping at the end: the value after the last real token is taken as 0 whether the
  sequence ended with EOS or was truncated at the length limit, as in lm-human-preferences and
  TRL. A truncated answer is scored as it stands.
- Masks must be right-padded (real tokens first). Every function zeroes padding positions with
  `where`, so garbage (even NaN) in padded rewards or values cannot leak into returns or losses.
- `whiten` uses the population variance (divide by the token count, not count - 1); with
  hundreds of tokens per batch the two are indistinguishable, and it makes the maths exact to
  check by hand.
"""

from __future__ import annotations

import torch
from torch import Tensor

from feedbackrl.algos.aggregate import token_mean
from feedbackrl.algos.policy_gradient import clipped_pg_loss


def _check_right_padded(mask: Tensor, name: str = "mask") -> Tensor:
    m = mask.bool()
    if m.dim() != 2:
        raise ValueError(f"{name} must be (N, T); got shape {tuple(mask.shape)}")
    if (m[:, 1:] & ~m[:, :-1]).any():
        rows = torch.nonzero((m[:, 1:] & ~m[:, :-1]).any(dim=1)).flatten().tolist()
        raise ValueError(f"{name} must be right-padded (real tokens first, then padding); rows {rows[:5]} "
                         "have a real token after padding")
    return m


def _zero_padding(x: Tensor, m: Tensor) -> Tensor:
    return torch.where(m, x, torch.zeros_like(x))


def kl_penalised_rewards(scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
                         kl_coef: float) -> Tensor:
    """scores (N,); logprobs, ref_logprobs, mask (N, T) -> (N, T) per-token rewards.

    rewards_t = -kl_coef * (logprobs_t - ref_logprobs_t) on real tokens, plus scores at each
    row's last real token; 0 on padding.
    """
    m = _check_right_padded(mask)
    lengths = m.sum(dim=1)  # (N,)
    if (lengths == 0).any():
        rows = torch.nonzero(lengths == 0).flatten().tolist()
        raise ValueError(f"rows {rows[:5]} have no real tokens in mask, so their score has nowhere to go")
    if scores.shape != lengths.shape:
        raise ValueError(f"scores must be (N,) = {tuple(lengths.shape)}; got {tuple(scores.shape)}")
    rewards = _zero_padding(-kl_coef * (logprobs.float() - ref_logprobs.float()), m)
    last = (lengths - 1).unsqueeze(1)  # (N, 1)
    return rewards.scatter_add(1, last, scores.float().unsqueeze(1).to(rewards.dtype))


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(N, T) values and mask -> (x - mean) / std over the real tokens of the whole batch; 0 on padding.

    shift_mean=False adds the mean back (scale only), as is done for rewards.
    """
    m = mask.bool()
    xm = _zero_padding(x.float(), m)
    count = m.sum().clamp(min=1)
    mean = xm.sum() / count
    var = _zero_padding((xm - mean) ** 2, m).sum() / count
    out = (xm - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _zero_padding(out, m)


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """rewards, values, mask: (N, T), right-padded -> (advantages, returns), both (N, T), 0 on padding.

    delta_t = r_t + gamma * V_{t+1} - V_t, with V after the last real token = 0;
    A_t = delta_t + gamma * lam * A_{t+1}; returns = A + V (the value targets).
    """
    m = _check_right_padded(mask)
    r, v = _zero_padding(rewards.float(), m), _zero_padding(values.float(), m)
    next_values = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)  # 0 past the end and on padding
    deltas = r + gamma * next_values - v
    advantages = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        # Padding positions have delta 0 and reset the recursion, so nothing flows back from them.
        running = torch.where(m[:, t], deltas[:, t] + gamma * lam * running, torch.zeros_like(running))
        advantages[:, t] = running
    returns = _zero_padding(advantages + v, m)
    return advantages, returns


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float,
               num_tokens: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """values, old_values, returns, mask: (N, T) -> 0.5 * token mean of max(unclipped, clipped) squared error.

    num_tokens: the global real-token count when accumulating over micro-batches (default: this one's).
    Stats: `value/clip_frac` (share of tokens where the clipped error was the larger), `value/mean`.
    """
    m = mask.bool()
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    err = (values - returns) ** 2
    err_clipped = (v_clipped - returns) ** 2
    per_token = _zero_padding(0.5 * torch.maximum(err, err_clipped), m)
    loss = token_mean(per_token, m.float(), num_tokens=num_tokens)
    with torch.no_grad():
        count = m.sum().clamp(min=1)
        stats = {
            "value/clip_frac": _zero_padding((err_clipped > err).float(), m).sum() / count,
            "value/mean": _zero_padding(values.detach().float(), m).sum() / count,
        }
    return loss, stats


def ppo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    clip: float = 0.2, num_tokens: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs, old_logprobs, advantages, mask: (N, T) -> token mean of the PPO-clip loss.

    Stats: `policy/clip_frac` and `policy/approx_kl`, the k1 estimate mean(old_logp - logp) of
    KL(pi_old || pi) that PPO implementations watch to catch too-large updates.
    """
    per_token, pg_stats = clipped_pg_loss(logprobs, old_logprobs, advantages, mask, clip, clip)
    loss = token_mean(per_token, mask.float(), num_tokens=num_tokens)
    with torch.no_grad():
        m = mask.bool()
        approx_kl = _zero_padding((old_logprobs - logprobs).float(), m).sum() / m.sum().clamp(min=1)
    return loss, {"policy/clip_frac": pg_stats["clip_frac"].detach(), "policy/approx_kl": approx_kl}
