"""Reward-model training: the Bradley-Terry pairwise loss.

A reward model scores a (prompt, response) with a scalar r. Under the Bradley-Terry model
(Bradley & Terry 1952), P(chosen > rejected) = sigmoid(r_chosen - r_rejected); training
minimises the negative log-likelihood of the human choices, -log sigmoid(r_c - r_r), as in
Stiennon et al. 2020 ("Learning to summarize", eq. 1) and Ouyang et al. 2022 (InstructGPT, eq. 1).

`margin` is Llama 2's variant (Touvron et al. 2023, eq. 2): -log sigmoid(r_c - r_r - m(r)) with a
per-pair margin that is larger when annotators said the chosen response is much better.

`tie`: a labeller's "tie" (the app's third answer) is a Bradley-Terry observation with target 1/2,
-(log sigmoid(d) + log sigmoid(-d)) / 2, the soft-label cross-entropy (as for ties in RewardBench-style
data and Rao and Kupper 1967's limit of no tie band). It is smallest at d = 0: it pulls the two
scores together instead of being thrown away.

`safety_cost_loss` is Safe RLHF's cost-model loss (Dai et al. 2023, "Safe RLHF", section 3.2): the same pairwise term
on (costlier, safer) pairs plus a classification term per response, -log sigmoid(s * c) with
s = +1 for a response labelled unsafe and -1 for a safe one, which pins the cost's zero to the
safe/unsafe boundary (a pairwise loss alone fixes only differences).

Departures: InstructGPT puts all C(K, 2) comparisons from one prompt in the same batch and
divides by C(K, 2); here every row is one pair and the loss is the plain mean over rows, so the
caller decides how pairs are batched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def pairwise_accuracy(chosen_rewards: Tensor, rejected_rewards: Tensor) -> Tensor:
    """(N,), (N,) -> scalar fraction of pairs with r_chosen > r_rejected; a tie counts one half.

    Counting ties as one half makes a constant reward model score 0.5 (chance), not 0.
    """
    diff = chosen_rewards.detach().float() - rejected_rewards.detach().float()
    return ((diff > 0).float() + 0.5 * (diff == 0).float()).mean()


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor, margin: Tensor | None = None,
                       tie: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """chosen_rewards, rejected_rewards, margin: (N,) -> mean -log sigmoid(r_c - r_r - margin).

    tie: (N,) bool, rows the labeller called a tie (their order means nothing): those rows cost
    -(log sigmoid(d) + log sigmoid(-d)) / 2 with d = r_c - r_r (no margin), and are left out of
    the accuracy and margin stats.

    Stats: `rm/accuracy` (equal scores count one half), `rm/margin` (mean r_c - r_r), and the mean
    chosen and rejected rewards.
    """
    if chosen_rewards.shape != rejected_rewards.shape or chosen_rewards.dim() != 1:
        raise ValueError("chosen_rewards and rejected_rewards must both be (N,); got "
                         f"{tuple(chosen_rewards.shape)} and {tuple(rejected_rewards.shape)}")
    raw = chosen_rewards.float() - rejected_rewards.float()  # (N,)
    diff = raw
    if margin is not None:
        if margin.shape != diff.shape:
            raise ValueError(f"margin must be (N,) = {tuple(diff.shape)}; got {tuple(margin.shape)}")
        diff = diff - margin.float()
    per_row = -F.logsigmoid(diff)
    pref = torch.ones_like(diff, dtype=torch.bool)
    if tie is not None:
        if tie.shape != diff.shape:
            raise ValueError(f"tie must be (N,) = {tuple(diff.shape)}; got {tuple(tie.shape)}")
        pref = ~tie.bool()
        per_row = torch.where(pref, per_row, -(F.logsigmoid(raw) + F.logsigmoid(-raw)) / 2)
    loss = per_row.mean()
    with torch.no_grad():
        c, r = (chosen_rewards[pref], rejected_rewards[pref]) if pref.any() else (chosen_rewards, rejected_rewards)
        stats = {
            "rm/accuracy": pairwise_accuracy(c, r),
            "rm/margin": (c - r).float().mean(),
            "rm/chosen_mean": chosen_rewards.float().mean(),
            "rm/rejected_mean": rejected_rewards.float().mean(),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def safety_cost_loss(costlier: Tensor, safer: Tensor, costlier_unsafe: Tensor,
                     safer_unsafe: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Safe RLHF's cost-model loss. costlier, safer: (N,) raw costs of the response labelled more
    harmful and the other; costlier_unsafe, safer_unsafe: (N,) bool, the per-response safety labels.

    loss = mean[-log sigmoid(c_w - c_l)] + mean[-log sigmoid(s_w c_w) - log sigmoid(s_l c_l)],
    s = +1 unsafe, -1 safe. Stats: the pairwise ones of `bradley_terry_loss` (`rm/accuracy` is how
    often the costlier response costs more) and `rm/safety_accuracy`, the share of the 2N responses
    on the labelled side of zero (a zero cost counts one half).
    """
    pair_loss, stats = bradley_terry_loss(costlier, safer)
    costs = torch.cat([costlier, safer]).float()  # (2N,)
    signs = torch.cat([costlier_unsafe, safer_unsafe]).float() * 2 - 1  # (2N,) +1 unsafe, -1 safe
    if signs.shape != costs.shape:
        raise ValueError(f"safety labels must be (N,) like the costs {tuple(costlier.shape)}; got "
                         f"{tuple(costlier_unsafe.shape)} and {tuple(safer_unsafe.shape)}")
    class_loss = -F.logsigmoid(signs * costs).sum() / len(costlier)
    with torch.no_grad():
        margin = signs * costs
        stats["rm/safety_accuracy"] = ((margin > 0).float() + 0.5 * (margin == 0).float()).mean()
        stats["loss/rm_pairwise"] = pair_loss.detach()
        stats["loss/rm_safety"] = class_loss.detach()
    return pair_loss + class_loss, stats
