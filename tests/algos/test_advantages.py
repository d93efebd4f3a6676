import pytest
import torch

from feedbackrl.algos.advantages import group_advantages, rows_with_signal


def test_two_groups_hand_computed_with_unbiased_std():
    # G = 3, eps = 0 so the numbers are exact.
    # Group 0, rewards (1, 2, 3): mean 2, deviations (-1, 0, 1),
    #   unbiased std = sqrt((1 + 0 + 1) / (3 - 1)) = 1  -> advantages (-1, 0, 1).
    #   (the biased std sqrt(2/3) = 0.8165 would give +-1.2247 instead)
    # Group 1, rewards (0, 0, 6): mean 2, deviations (-2, -2, 4),
    #   unbiased std = sqrt((4 + 4 + 16) / 2) = sqrt(12) = 3.464102
    #   -> advantages (-0.577350, -0.577350, 1.154701).
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])
    adv = group_advantages(rewards, group_size=3, eps=0.0)
    assert adv.tolist() == pytest.approx([-1.0, 0.0, 1.0, -0.577350, -0.577350, 1.154701], abs=1e-6)


def test_default_eps_is_added_to_the_std():
    # Group (0, 1): mean 0.5, deviations (-0.5, 0.5), unbiased std sqrt(0.5) = 0.707107;
    # with eps 1e-4: 0.5 / 0.707207 = 0.707007.
    adv = group_advantages(torch.tensor([0.0, 1.0]), group_size=2)
    assert adv.tolist() == pytest.approx([-0.707007, 0.707007], abs=1e-6)


def test_scale_false_is_dr_grpo_mean_centering_only():
    # Same rewards as the hand example: only the group mean (2 and 2) is subtracted.
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])
    adv = group_advantages(rewards, group_size=3, scale=False)
    assert adv.tolist() == [-1.0, 0.0, 1.0, -2.0, -2.0, 4.0]


@pytest.mark.parametrize("scale", [True, False])
def test_all_equal_group_gets_zero_not_nan(scale):
    # Group 0 is all 1s (std 0): advantage 0 everywhere, no NaN; group 1 (0, 1) is unaffected.
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2, scale=scale)
    assert adv[:2].tolist() == [0.0, 0.0]
    assert adv[2] < 0 < adv[3]


def test_group_of_one_gets_zero():
    # G = 1: every reward is its own group mean.
    assert group_advantages(torch.tensor([0.3, 0.9]), group_size=1).tolist() == [0.0, 0.0]


def test_integer_rewards_give_float_advantages():
    adv = group_advantages(torch.tensor([0, 1]), group_size=2, scale=False)
    assert adv.dtype == torch.float32 and adv.tolist() == [-0.5, 0.5]


@pytest.mark.parametrize("rewards, group_size", [
    pytest.param(torch.zeros(5), 2, id="length-not-divisible"),
    pytest.param(torch.zeros(2, 3), 3, id="two-dimensional"),
    pytest.param(torch.zeros(4), 0, id="group-size-zero"),
])
def test_wrong_shape_raises(rewards, group_size):
    with pytest.raises(ValueError, match="rewards must be"):
        group_advantages(rewards, group_size)


@pytest.mark.parametrize("scale", [True, False])
def test_permuting_groups_permutes_advantages(scale):
    gen = torch.Generator().manual_seed(0)
    b, g = 6, 4
    rewards = torch.randint(0, 3, (b * g,), generator=gen).float()
    adv = group_advantages(rewards, g, scale=scale).view(b, g)
    perm = torch.randperm(b, generator=gen)
    permuted = group_advantages(rewards.view(b, g)[perm].reshape(-1), g, scale=scale).view(b, g)
    assert torch.equal(permuted, adv[perm])
    inner = torch.randperm(g, generator=gen)  # shuffling inside a group shuffles its advantages
    within = group_advantages(rewards.view(b, g)[:, inner].reshape(-1), g, scale=scale).view(b, g)
    torch.testing.assert_close(within, adv[:, inner])


def test_rows_with_signal_marks_rows_with_a_nonzero_advantage():
    # two groups of 3: all wrong (advantage 0 exactly) and one right of three
    adv = group_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0]), 3)
    assert rows_with_signal(adv).tolist() == [False, False, False, True, True, True]
    per_token = torch.tensor([[0.0, 0.0], [0.0, -0.5], [0.0, 0.0]])  # (N, T): a row counts if any token does
    assert rows_with_signal(per_token).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="advantages must be"):
        rows_with_signal(torch.zeros(2, 2, 2))
