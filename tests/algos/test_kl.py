import math

import pytest
import torch

from feedbackrl.algos.kl import kl_k3


def test_k3_hand_computed():
    # k3 = exp(ref - logp) - (ref - logp) - 1
    # pi = 0.5, ref = 0.25: ref - logp = log 0.5 = -0.693147 -> 0.5 + 0.693147 - 1 = 0.193147
    # pi = 0.25, ref = 0.5: ref - logp = log 2 = 0.693147    -> 2 - 0.693147 - 1 = 0.306853
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    assert kl_k3(logp, ref).tolist()[0] == pytest.approx([0.193147, 0.306853], abs=1e-6)


def test_k3_is_zero_when_policies_agree():
    logp = torch.log(torch.tensor([[0.1, 0.7, 0.2]]))
    assert kl_k3(logp, logp).tolist() == [[0.0, 0.0, 0.0]]


def test_k3_is_non_negative():
    gen = torch.Generator().manual_seed(0)
    logp = -10 * torch.rand(64, 32, generator=gen)
    ref = -10 * torch.rand(64, 32, generator=gen)
    assert (kl_k3(logp, ref) >= 0).all()


def test_k3_expectation_under_pi_is_the_exact_kl():
    # Weighting k3 by pi gives sum pi*(ref/pi) - sum pi*log(ref/pi) - 1 = KL(pi || ref).
    # pi = (0.5, 0.5), ref = (0.25, 0.75):
    # KL = 0.5*log(0.5/0.25) + 0.5*log(0.5/0.75) = 0.5*0.693147 - 0.5*0.405465 = 0.143841
    pi, ref = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    expected = (pi * kl_k3(pi.log(), ref.log())).sum().item()
    assert expected == pytest.approx(0.143841, abs=1e-6)


def test_k3_gradient_vanishes_at_the_reference():
    # d k3 / d logp = exp(ref - logp) - 1 = 0 when logp == ref: the KL term starts with no pull.
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl_k3(logp, logp.detach()).sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0]]
