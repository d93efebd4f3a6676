"""Which pair of candidate responses to send to a labeller.

Each prompt has up to K candidate responses with reward-model scores. Under the Bradley-Terry model
the reward model predicts P(i > j) = sigmoid(r_i - r_j). The rules, as pure functions over (P, K)
score tensors (the online labelling loop, `train/online_labels.py`, composes them):

- `uncertain_pairs` + `least_certain` (rule `active`): per prompt the pair with the smallest
  |r_i - r_j|, where |P(i > j) - 0.5| is smallest, then the prompts whose pair is least certain:
  uncertainty sampling (Lewis and Gale 1994), where the active-preference literature starts
  (Sadigh et al. 2017, Biyik and Sadigh 2018).
- `contrast_pairs` (rule `contrast`): per prompt the pair the model scores furthest apart, its best
  and worst candidate. The loop takes it for random prompts. Measured on the toy domain
  (docs/human_feedback.md), labels teach most where the two responses really differ and least (or
  harm) where they nearly tie, which is where uncertainty sampling looks; this is the "ask easy
  questions" lesson of Biyik et al. 2019 for noisy labellers.
- `runner_up_pairs` (rule `runner_up`): per prompt the model's best candidate and its runner-up,
  the two it is least sure which is best. The loop takes it for random prompts. This is the pair
  whose answer decides what best-of-n or a policy trained on the reward model would pick: the
  "top two" of dueling bandits (Russo 2016's top-two sampling; Dwaracherla et al. 2024 ask a
  labeller about two responses that are each likely the best). With a labeller who answers "tie"
  when both are wrong, the model's top two are also the pair most likely to hold a right answer,
  against the wrong answer the model finds hardest to tell from it (docs/human_feedback.md measures
  it: more preferences per label, and harder ones).
- `committee_pairs` (rule `committee`): query by committee scored by BALD over reward models
  trained on bootstrap resamples of the labels.
- `informative_pairs` with `laplace_factor` / `score_covariance` (rule `bald`): BALD under a
  last-layer Laplace posterior of the reward head.
- `random_pairs`: per prompt, a uniformly random pair of distinct valid candidates.

Departure: every rule takes at most one pair per prompt, so one prompt's many near-identical
candidates cannot take the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _pair_index(k: int) -> tuple[Tensor, Tensor]:
    """All i < j among k candidates: two (k(k-1)/2,) index tensors."""
    i, j = torch.triu_indices(k, k, offset=1)
    return i, j


def _best_pair(values: Tensor, mask: Tensor, largest: bool) -> tuple[Tensor, Tensor]:
    """values: (B, pairs) over `_pair_index` order; mask: (B, K). -> per row the (i, j) of the largest
    (or smallest) value among pairs of real candidates, and that value (-inf / +inf if none).
    Ties go to the first pair in (i, j) order."""
    i, j = _pair_index(mask.shape[1])
    valid = mask[:, i].bool() & mask[:, j].bool()
    values = values.masked_fill(~valid, float("-inf") if largest else float("inf"))
    best = values.argmax(dim=1) if largest else values.argmin(dim=1)
    return torch.stack([i[best], j[best]], dim=1), values.gather(1, best[:, None]).squeeze(1)


def uncertain_pairs(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """scores, mask: (B, K) raw reward-model scores, 1 = a real candidate.

    -> pairs (B, 2) candidate indices (i < j) of the least certain pair per prompt, and certainty
    (B,) = |sigmoid(r_i - r_j) - 0.5| of that pair; +inf for a prompt with fewer than 2 candidates.
    Ties in certainty go to the first pair in (i, j) order.
    """
    i, j = _pair_index(scores.shape[1])
    certainty = (torch.sigmoid(scores[:, i] - scores[:, j]) - 0.5).abs()  # (B, P)
    return _best_pair(certainty, mask, largest=False)


def random_pairs(mask: Tensor, generator: torch.Generator) -> Tensor:
    """mask: (B, K) -> (B, 2) a uniformly random pair (i < j) of valid candidates per prompt.

    A prompt with fewer than 2 valid candidates gets (0, 1); callers drop such prompts."""
    i, j = _pair_index(mask.shape[1])
    valid = (mask[:, i].bool() & mask[:, j].bool()).float()  # (B, P)
    weights = valid + (valid.sum(1, keepdim=True) == 0).float()  # all-invalid rows: any pair
    choice = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    return torch.stack([i[choice], j[choice]], dim=1)


def contrast_pairs(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """scores, mask: (B, K) -> pairs (B, 2) (i < j) the reward model scores furthest apart (its best
    and worst candidate), and that gap |r_i - r_j| (B,); -inf for a prompt with fewer than 2 candidates."""
    i, j = _pair_index(scores.shape[1])
    gap = (scores[:, i] - scores[:, j]).abs()
    return _best_pair(gap, mask, largest=True)


def runner_up_pairs(scores: Tensor, mask: Tensor) -> Tensor:
    """scores, mask: (B, K) -> pairs (B, 2) (i < j): per prompt its best-scored candidate and the
    runner-up. Equal scores go to the lower index (a stable sort). A prompt with fewer than 2 real
    candidates gets an arbitrary pair; callers drop such prompts."""
    order = torch.sort(scores.masked_fill(~mask.bool(), float("-inf")), dim=1, descending=True, stable=True).indices
    return order[:, :2].sort(dim=1).values


def least_certain(certainty: Tensor, n: int) -> Tensor:
    """certainty: (B,) -> indices of the n smallest finite values, least certain first (stable)."""
    order = torch.sort(certainty, stable=True).indices
    return order[torch.isfinite(certainty[order])][:n]


# --- information gain under a Laplace posterior of the reward head ----------------------------------
#
# Uncertainty sampling above asks where the model's *prediction* is closest to a coin flip. With a
# noisy labeller that is mostly where the labeller flips a coin too: two near-identical responses
# score alike because they are alike, and their label teaches nothing (docs/human_feedback.md
# measures it). BALD (Houlsby et al. 2011) asks instead where the *model* is unsure, and the label
# would settle it: the mutual information between the label y and the model's parameters,
# I(y; theta) = H(E_theta[p]) - E_theta[H(p)]. A pair the model is sure is a coin flip scores ~0
# (both entropies are log 2); a pair whose score difference the data have not pinned down scores high.
#
# The posterior over parameters is a last-layer Laplace approximation (MacKay 1992; Daxberger et
# al. 2021): the backbone is taken as trained and only the head theta is uncertain. The score is
# linear in theta (r = phi . theta, `models.reward.head_features`), so after Bradley-Terry training
# on pairs with feature differences d_n and margins m_n = d_n . theta_hat the posterior precision is
# lambda I + sum_n w_n d_n d_n^T with w_n = sigmoid(m_n) (1 - sigmoid(m_n)), the logistic loss's
# Hessian plus a Gaussian prior of precision lambda. D (= V x (H + 1)) is larger than the number of
# labels, so everything goes through the N x N Woodbury form and nothing D x D is ever built.


def laplace_factor(diffs: Tensor, margins: Tensor, prior_precision: float) -> tuple[Tensor, Tensor]:
    """diffs: (N, D) phi(chosen) - phi(rejected) of the labelled pairs; margins: (N,) the trained
    model's r_chosen - r_rejected. -> (B, L): B = sqrt(w) * diffs (N, D) and L (N, N) the Cholesky
    factor of lambda I + B B^T, which `score_covariance` needs."""
    w = torch.sigmoid(margins) * torch.sigmoid(-margins)
    b = diffs * w.sqrt()[:, None]
    gram = b @ b.T
    gram.diagonal().add_(prior_precision)
    return b, torch.linalg.cholesky(gram)


def score_covariance(features: Tensor, factor: tuple[Tensor, Tensor], prior_precision: float) -> Tensor:
    """features: (P, K, D) head features of each prompt's K candidates. -> (P, K, K) posterior
    covariance of their scores: Cov(r_i, r_j) = phi_i^T Sigma phi_j with
    Sigma = (lambda I + B^T B)^-1 = (I - B^T (lambda I + B B^T)^-1 B) / lambda (Woodbury)."""
    b, chol = factor
    p, k, d = features.shape
    flat = features.reshape(p * k, d)
    u = torch.linalg.solve_triangular(chol, b @ flat.T, upper=False).T.reshape(p, k, -1)  # (P, K, N)
    return (features @ features.transpose(1, 2) - u @ u.transpose(1, 2)) / prior_precision


# standard-normal quantiles at the midpoints of 256 equal-probability bins: expectations over a normal
# as plain means. Unlike Gauss-Hermite nodes this stays accurate when the variance is large and the
# sigmoid a near-step (32 Hermite nodes are off by 0.03 nats at variance 100).
_QUANTILES = 2**0.5 * torch.erfinv(2 * (torch.arange(256, dtype=torch.float64) + 0.5) / 256 - 1)


def _entropy(p: Tensor) -> Tensor:
    """Binary entropy in nats, 0 at p = 0 or 1."""
    return -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))


def bald(mean: Tensor, var: Tensor) -> Tensor:
    """Mutual information (nats) between a Bradley-Terry label y ~ Bernoulli(sigmoid(z)) and z, for
    z ~ N(mean, var): H(E[sigmoid(z)]) - E[H(sigmoid(z))], expectations over 256 normal quantiles
    (within 2e-3 nats of Monte Carlo at any variance). In [0, log 2]; 0 when var = 0."""
    z = mean.double()[..., None] + var.double().clamp(min=0)[..., None].sqrt() * _QUANTILES  # (..., 256)
    p = torch.sigmoid(z)
    return (_entropy(p.mean(-1)) - _entropy(p).mean(-1)).clamp(min=0).to(mean.dtype)


def pair_variance(cov: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """cov: (P, K, K) score covariance; i, j: (pairs,) candidate indices ->
    (P, pairs) Var(r_i - r_j) = cov_ii + cov_jj - 2 cov_ij."""
    return cov[:, i, i] + cov[:, j, j] - 2 * cov[:, i, j]


def informative_pairs(scores: Tensor, cov: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """scores, mask: (P, K) raw scores (posterior means) and 1 = a real candidate; cov: (P, K, K).

    -> pairs (P, 2) (i < j) with the largest BALD per prompt, and that BALD (P,); -inf for a prompt
    with fewer than 2 candidates. The score difference r_i - r_j has mean scores_i - scores_j and
    variance cov_ii + cov_jj - 2 cov_ij."""
    i, j = _pair_index(scores.shape[1])
    var = pair_variance(cov, i, j)  # (P, pairs)
    info = bald(scores[:, i] - scores[:, j], var)
    return _best_pair(info, mask, largest=True)


def committee_pairs(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Query by committee (Seung et al. 1992) scored by BALD: scores (E, P, K) raw scores of each
    prompt's K candidates under E reward models trained on resamples of the labels; mask (P, K).

    Each member e predicts p_e = sigmoid(r_i - r_j); the committee's BALD is
    H(mean_e p_e) - mean_e H(p_e): high where members disagree, 0 where they agree, whether they
    agree on a clear winner or on a coin flip. -> pairs (P, 2) (i < j) with the largest BALD per
    prompt, and that BALD (P,); -inf for a prompt with fewer than 2 candidates."""
    i, j = _pair_index(scores.shape[-1])
    p = torch.sigmoid(scores[:, :, i] - scores[:, :, j]).double()  # (E, P, pairs)
    info = (_entropy(p.mean(0)) - _entropy(p).mean(0)).clamp(min=0).to(scores.dtype)
    return _best_pair(info, mask, largest=True)
