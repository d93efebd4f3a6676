"""Per-token KL estimators between the policy and a frozen reference.

`kl_k3` is Schulman's unbiased, always non-negative "k3" estimator of KL(pi || pi_ref)
(http://joschu.net/blog/kl-approx.html), the one GRPO uses (Shao et al. 2024, eq. 4):
k3 = exp(ref - logp) - (ref - logp) - 1, evaluated on tokens sampled from pi.
"""

from __future__ import annotations

import torch
from torch import Tensor


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """(N, T) log-probs of the sampled tokens under pi and pi_ref -> (N, T) per-token KL estimates."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0
