import math

import pytest
import torch

from feedbackrl.algos.policy_gradient import clipped_pg_loss
from feedbackrl.algos.staleness import decoupled_pg_loss, staleness, truncated_importance_weights, within_staleness


def test_staleness_and_bound_hand_computed():
    # learner at version 5; samples from versions 5, 4, 3 -> ages 0, 1, 2; bound 1 keeps the first two
    versions = torch.tensor([5, 4, 3])
    assert staleness(versions, 5).tolist() == [0, 1, 2]
    assert within_staleness(versions, 5, max_staleness=1).tolist() == [True, True, False]
    assert within_staleness(versions, 5, max_staleness=0).tolist() == [True, False, False]


def test_a_sample_from_the_future_is_an_error():
    with pytest.raises(ValueError, match="newer than the learner's 2"):
        staleness(torch.tensor([1, 3]), 2)


def test_truncated_importance_weights_hand_computed():
    # prox - behav = log 0.5, log 1.5, log 4 -> ratios 0.5, 1.5, 4; cap 2 truncates the last to 2;
    # the padding token (mask 0) weighs 0 whatever its ratio
    behaviour = torch.zeros(1, 4)
    proximal = torch.tensor([[math.log(0.5), math.log(1.5), math.log(4.0), math.log(3.0)]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = truncated_importance_weights(proximal, behaviour, mask, cap=2.0)
    assert w.tolist()[0] == pytest.approx([0.5, 1.5, 2.0, 0.0], abs=1e-6)


def test_weights_carry_no_gradient():
    proximal = torch.zeros(1, 2, requires_grad=True)
    w = truncated_importance_weights(proximal, torch.zeros(1, 2), torch.ones(1, 2), cap=2.0)
    assert not w.requires_grad


def test_decoupled_loss_hand_computed():
    # r = pi / pi_prox = 1.5 (clipped at 1.2 for A = +1), w = pi_prox / pi_behav:
    # token 0: w = 0.5 -> loss = -0.5 * min(1.5, 1.2) = -0.6
    # token 1: w = 3 truncated to 2 -> loss = -2 * 1.2 = -2.4
    # is_weight/mean = (0.5 + 2) / 2 = 1.25; truncated_frac = 1/2; clip_frac = 2/2
    logprobs = torch.full((1, 2), math.log(1.5))
    proximal = torch.zeros(1, 2)
    behaviour = torch.tensor([[math.log(2.0), -math.log(3.0)]])
    loss, stats = decoupled_pg_loss(logprobs, proximal, behaviour, torch.tensor([1.0]), torch.ones(1, 2),
                                    clip_low=0.2, clip_high=0.2, cap=2.0)
    assert loss.tolist()[0] == pytest.approx([-0.6, -2.4], abs=1e-6)
    assert stats["is_weight/mean"].item() == pytest.approx(1.25)
    assert stats["is_weight/truncated_frac"].item() == pytest.approx(0.5)
    assert stats["clip_frac"].item() == pytest.approx(1.0)


def test_fresh_samples_reduce_to_the_clipped_loss():
    # staleness 0: the behaviour policy is the proximal one, every weight is 1
    g = torch.Generator().manual_seed(0)
    logprobs, old = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    adv, mask = torch.randn(3, generator=g), (torch.rand(3, 5, generator=g) > 0.3).float()
    loss, _ = decoupled_pg_loss(logprobs, old, old, adv, mask, 0.2, 0.28, cap=2.0)
    expected, _ = clipped_pg_loss(logprobs, old, adv, mask, 0.2, 0.28)
    assert torch.equal(loss, expected)


def test_the_gradient_is_weighted():
    # with r = 1 (pi = pi_prox) the gradient of -w*r*A w.r.t. logprobs is -w*A per token: w = 0.5, A = 2 -> -1
    logprobs = torch.zeros(1, 1, requires_grad=True)
    loss, _ = decoupled_pg_loss(logprobs, torch.zeros(1, 1), torch.tensor([[math.log(2.0)]]), torch.tensor([2.0]),
                                torch.ones(1, 1))
    loss.sum().backward()
    assert logprobs.grad.item() == pytest.approx(-1.0)


def test_a_non_positive_cap_is_an_error():
    with pytest.raises(ValueError, match="cap must be > 0, got 0"):
        truncated_importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0)
