import pytest
import torch

from feedbackrl.algos.rloo import rloo_advantages


def test_rloo_hand_computed():
    # G = 4. Group 0, rewards (1, 2, 3, 6): baselines are the means of the other three:
    #   i=0: (2+3+6)/3 = 11/3 -> 1 - 11/3 = -8/3      i=1: (1+3+6)/3 = 10/3 -> 2 - 10/3 = -4/3
    #   i=2: (1+2+6)/3 = 3    -> 3 - 3 = 0            i=3: (1+2+3)/3 = 2    -> 6 - 2 = 4
    # Group 1, rewards (0, 0, 0, 1): the three zeros see baseline 1/3 -> -1/3; the one sees 0 -> 1.
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 0.0, 1.0])
    expected = [-8 / 3, -4 / 3, 0.0, 4.0, -1 / 3, -1 / 3, -1 / 3, 1.0]
    assert rloo_advantages(rewards, group_size=4).tolist() == pytest.approx(expected, abs=1e-6)


def test_rloo_all_equal_group_gets_zero():
    # (5, 5): each baseline is the other 5 -> 0, 0.
    assert rloo_advantages(torch.tensor([5.0, 5.0]), group_size=2).tolist() == [0.0, 0.0]


def test_permuting_groups_permutes_advantages():
    g = torch.Generator().manual_seed(0)
    b, gs = 5, 3
    rewards = torch.randn(b * gs, generator=g)
    adv = rloo_advantages(rewards, gs).view(b, gs)
    perm = torch.randperm(b, generator=g)
    permuted = rloo_advantages(rewards.view(b, gs)[perm].reshape(-1), gs).view(b, gs)
    torch.testing.assert_close(permuted, adv[perm])
    # ... and permuting samples inside a group permutes their advantages the same way.
    inner = torch.randperm(gs, generator=g)
    within = rloo_advantages(rewards.view(b, gs)[:, inner].reshape(-1), gs).view(b, gs)
    torch.testing.assert_close(within, adv[:, inner])


def test_rloo_rejects_bad_group_size():
    with pytest.raises(ValueError, match="G >= 2"):
        rloo_advantages(torch.zeros(4), group_size=1)
    with pytest.raises(ValueError, match="dividing its length"):
        rloo_advantages(torch.zeros(5), group_size=2)


def test_rloo_scaled_by_group_std_hand_computed():
    # Group (1, 2, 3, 6): leave-one-out advantages (-8/3, -4/3, 0, 4) as above; mean 3,
    # unbiased variance ((-2)^2 + (-1)^2 + 0^2 + 3^2) / 3 = 14/3, std = 2.160247; eps = 0.
    adv = rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), group_size=4, scale=True, eps=0.0)
    std = (14 / 3) ** 0.5
    assert adv.tolist() == pytest.approx([-8 / 3 / std, -4 / 3 / std, 0.0, 4 / std], abs=1e-6)
    # an all-equal group has std 0: eps keeps it at 0, not NaN
    assert rloo_advantages(torch.tensor([2.0, 2.0]), group_size=2, scale=True).tolist() == [0.0, 0.0]
