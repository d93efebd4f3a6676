"""Offline preference optimisation: DPO, cDPO, IPO and the listwise PRO loss.

All losses take *summed* sequence log-probs of the policy and of the frozen reference (computed
beforehand with `sequence_logprobs`), so none of them needs a model. With
h = (logp_c - ref_logp_c) - (logp_r - ref_logp_r), the policy's log-ratio margin:

- `dpo_loss` (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7): -log sigmoid(beta*h).
  `label_smoothing` = eps is conservative DPO (cDPO, Mitchell 2023, "A note on DPO with noisy
  preferences"): the label is flipped with probability eps,
  -(1 - eps) log sigmoid(beta*h) - eps log sigmoid(-beta*h).
- `ipo_loss` (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
  Human Preferences", eq. 17): (h - 1/(2*beta))^2, a squared loss that pulls the margin to a
  finite target instead of pushing it to infinity. Here beta is the paper's tau.
- `pro_loss`, listwise, for a ranking of k responses (best first): the Plackett-Luce likelihood
  of Song et al. 2023 ("Preference Ranking Optimization for Human Alignment", eq. 5),
  sum_{j<k} -log softmax_j over the still-unranked candidates j..k, of the scores
  s_i = beta * (logp_i - ref_logp_i). With k = 2 it is exactly DPO.

Departures:
- IPO normalisation: by default we use summed sequence log-probs, as in the paper's definition
  of h. TRL (`DPOTrainer`, loss_type "ipo") and the authors' later advice average the log-probs
  over response tokens instead, which makes the target margin 1/(2*beta) independent of length;
  `mean_token_logprobs` gives those inputs (config: `algo.length_average = true`), and with them a
  beta tuned in TRL carries over unchanged. The two forms need different betas.
- PRO: Song et al. score a candidate by its length-normalised policy log-prob with a dynamic,
  reward-gap-dependent temperature and add an SFT term on the best response. We use DPO's
  implicit reward beta * log(pi/pi_ref) as the score (the Plackett-Luce form of DPO, Rafailov et
  al. 2023, appendix A.3), which needs no reward scores and keeps the reference anchor; add an
  SFT term yourself (`sft.py`) if you want one.
- All losses average over pairs/rankings (mean over N), so gradient accumulation over chunks of
  n rows equals the full batch when each chunk's loss is weighted by n / N.

Pairwise losses are selected by name through `PREFERENCE_LOSSES`; they share the signature
(logprobs_chosen, logprobs_rejected, ref_logprobs_chosen, ref_logprobs_rejected, beta=...).
`pro_loss` takes (N, k) tensors instead and is selected through `RANKING_LOSSES`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def token_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """logits (N, T, V) aligned with labels (N, T) -> (N, T) log p(label_t).

    Negative labels (e.g. the -100 ignore index) give 0 there instead of an indexing error; mask
    them out downstream.
    """
    logits = logits.float()
    safe = labels.clamp(min=0).unsqueeze(-1)  # (N, T, 1)
    picked = logits.gather(-1, safe).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.where(labels >= 0, picked, torch.zeros_like(picked))


def sequence_logprobs(logits: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """logits (N, T, V), labels (N, T), mask (N, T) = 1 on response tokens -> (N,) summed log-probs.

    Uses `where`, not a product, so padding logits never reach the sum whatever their value.
    """
    lp = token_logprobs(logits, labels)
    return torch.where(mask.bool(), lp, torch.zeros_like(lp)).sum(dim=-1)


def mean_token_logprobs(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """token_logprobs (N, T), mask (N, T) = 1 on response tokens -> (N,) mean log-prob per response token.

    TRL's IPO input (`all_logps / size_completion`). Every row needs at least one response token.
    """
    counts = mask.sum(dim=-1)
    if (counts <= 0).any():
        raise ValueError(f"every response needs at least one token to average over; token counts {counts.tolist()}")
    lp = torch.where(mask.bool(), token_logprobs.float(), torch.zeros_like(token_logprobs, dtype=torch.float))
    return lp.sum(dim=-1) / counts


def _check_pair_shapes(*xs: Tensor) -> None:
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) != 1 or xs[0].dim() != 1:
        raise ValueError("policy and reference log-probs of chosen and rejected must all be (N,) summed "
                         f"sequence log-probs; got shapes {[tuple(x.shape) for x in xs]}")


def _pair_stats(chosen_ratio: Tensor, rejected_ratio: Tensor, beta: float) -> dict[str, Tensor]:
    """DPO's implicit rewards beta * log(pi/pi_ref) of chosen and rejected, as TRL logs them."""
    with torch.no_grad():
        r_c, r_r = beta * chosen_ratio.detach(), beta * rejected_ratio.detach()
        return {
            "pref/reward_chosen": r_c.mean(),
            "pref/reward_rejected": r_r.mean(),
            "pref/reward_margin": (r_c - r_r).mean(),
            "pref/accuracy": (r_c > r_r).float().mean(),
        }


def dpo_loss(logprobs_chosen: Tensor, logprobs_rejected: Tensor, ref_logprobs_chosen: Tensor,
             ref_logprobs_rejected: Tensor, beta: float = 0.1,
             label_smoothing: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """All inputs (N,) summed sequence log-probs. beta is DPO's beta; label_smoothing is cDPO's eps.

    Returns mean over pairs of -(1-eps) log sigmoid(beta*h) - eps log sigmoid(-beta*h), and stats.
    """
    _check_pair_shapes(logprobs_chosen, logprobs_rejected, ref_logprobs_chosen, ref_logprobs_rejected)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5) (cDPO's label-flip probability); "
                         f"got {label_smoothing}")
    chosen_ratio = logprobs_chosen.float() - ref_logprobs_chosen.float()
    rejected_ratio = logprobs_rejected.float() - ref_logprobs_rejected.float()
    logits = beta * (chosen_ratio - rejected_ratio)  # (N,)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return losses.mean(), _pair_stats(chosen_ratio, rejected_ratio, beta)


def ipo_loss(logprobs_chosen: Tensor, logprobs_rejected: Tensor, ref_logprobs_chosen: Tensor,
             ref_logprobs_rejected: Tensor, beta: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """All inputs (N,) sequence log-probs: summed (the paper) or per-token means from
    `mean_token_logprobs` (TRL). beta is IPO's tau. Returns mean over pairs of (h - 1/(2*beta))^2, and stats."""
    _check_pair_shapes(logprobs_chosen, logprobs_rejected, ref_logprobs_chosen, ref_logprobs_rejected)
    if beta <= 0:
        raise ValueError(f"beta (IPO's tau) must be > 0; got {beta}")
    chosen_ratio = logprobs_chosen.float() - ref_logprobs_chosen.float()
    rejected_ratio = logprobs_rejected.float() - ref_logprobs_rejected.float()
    h = chosen_ratio - rejected_ratio  # (N,)
    losses = (h - 1.0 / (2.0 * beta)) ** 2
    return losses.mean(), _pair_stats(chosen_ratio, rejected_ratio, beta)


def pro_loss(logprobs: Tensor, ref_logprobs: Tensor, beta: float = 0.1,
             mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """logprobs, ref_logprobs: (N, k) summed log-probs of k responses per prompt, best first.

    mask (N, k) = 1 on real responses, 0 on right-padding for prompts with fewer than k (each
    row needs at least 2). Returns the mean over rankings of
    sum_j [logsumexp(s_j..s_last) - s_j], s = beta * (logprobs - ref_logprobs), and stats.
    """
    if logprobs.shape != ref_logprobs.shape or logprobs.dim() != 2 or logprobs.shape[1] < 2:
        raise ValueError("logprobs and ref_logprobs must both be (N, k) with k >= 2, best response first; "
                         f"got {tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)}")
    valid = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask.bool()
    if (valid[:, 1:] & ~valid[:, :-1]).any() or (valid.sum(dim=1) < 2).any():
        raise ValueError("mask must keep the real responses first (right padding) with at least 2 per row")
    scores = beta * (logprobs.float() - ref_logprobs.float())  # (N, k)
    # A very negative finite fill (not -inf) keeps logsumexp and its gradient free of NaN.
    filled = scores.masked_fill(~valid, torch.finfo(scores.dtype).min / 4)
    # logsumexp over the suffix j..k for every j: reversed cumulative logsumexp.
    suffix_lse = torch.logcumsumexp(filled.flip(-1), dim=-1).flip(-1)  # (N, k)
    per_position = torch.where(valid, suffix_lse - filled, torch.zeros_like(scores))
    loss = per_position.sum(dim=1).mean()
    with torch.no_grad():
        s = filled.detach()
        last = valid.sum(dim=1) - 1
        stats = {
            "pref/top1_accuracy": (s.argmax(dim=1) == 0).float().mean(),
            "pref/reward_best": s[:, 0].mean(),
            "pref/reward_worst": s.gather(1, last.unsqueeze(1)).mean(),
        }
    return loss, stats


PreferenceLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]

PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {
    "dpo": dpo_loss,
    "ipo": ipo_loss,
}

RANKING_LOSSES: dict[str, PreferenceLoss] = {
    "pro": pro_loss,
}
