"""Behaviour cloning and the takeover preference loss, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from feedbackrl.algos.imitation import bc_loss, takeover_preference_loss


def test_bc_loss_is_the_masked_mean_nll() -> None:
    logp = torch.log(torch.tensor([0.5, 0.25, 0.125, 1.0]))
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])  # the third step is not the expert's
    loss, stats = bc_loss(logp, mask)
    # (log 2 + log 4 + 0) / 3 = 3 log 2 / 3 = log 2
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert stats["bc/likelihood"].item() == pytest.approx((0.5 + 0.25 + 1.0) / 3, rel=1e-6)


def test_bc_loss_gradient_raises_the_expert_action() -> None:
    logits = torch.zeros(1, 2, requires_grad=True)
    loss, _ = bc_loss(torch.log_softmax(logits, -1)[:, 1], torch.ones(1))
    loss.backward()
    # d(-log softmax_1)/d logits = softmax - onehot(1) = (0.5, -0.5)
    assert logits.grad[0].tolist() == pytest.approx([0.5, -0.5])


def test_takeover_loss_hand_computed() -> None:
    expert = torch.log(torch.tensor([0.8, 0.3, 0.5]))
    agent = torch.log(torch.tensor([0.2, 0.7, 0.5]))
    mask = torch.tensor([1.0, 1.0, 0.0])  # the third step: the same action, no preference
    loss, stats = takeover_preference_loss(expert, agent, mask, beta=1.0)
    # sigmoid(log(p/q)) = p / (p + q): -log(0.8) and -log(0.3) for the two masked steps
    assert loss.item() == pytest.approx(-(math.log(0.8) + math.log(0.3)) / 2, rel=1e-6)
    assert stats["takeover/accuracy"].item() == 0.5
    assert stats["takeover/margin"].item() == pytest.approx((math.log(4) + math.log(3 / 7)) / 2, rel=1e-6)
    # beta = 2: sigmoid(2 log(p/q)) = p^2 / (p^2 + q^2)
    loss2, _ = takeover_preference_loss(expert, agent, mask, beta=2.0)
    assert loss2.item() == pytest.approx(-(math.log(0.64 / 0.68) + math.log(0.09 / 0.58)) / 2, rel=1e-6)


def test_takeover_loss_with_nothing_masked_in_is_zero_and_beta_checked() -> None:
    loss, _ = takeover_preference_loss(torch.zeros(3), torch.ones(3), torch.zeros(3))
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match="beta must be > 0"):
        takeover_preference_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), beta=0.0)
