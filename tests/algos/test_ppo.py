import math

import pytest
import torch

from feedbackrl.algos.ppo import gae, kl_penalised_rewards, ppo_policy_loss, value_loss, whiten

NAN = float("nan")


def test_gae_three_tokens_hand_computed_with_padding():
    # gamma = 0.9, lam = 0.5 -> gamma*lam = 0.45. Row 0: three real tokens.
    #   delta_2 = 1 + 0.9*0 - 0.4 = 0.6            (no value after the last token)
    #   delta_1 = 0 + 0.9*0.4 - 0.2 = 0.16
    #   delta_0 = 0 + 0.9*0.2 - 0.5 = -0.32
    #   A_2 = 0.6; A_1 = 0.16 + 0.45*0.6 = 0.43; A_0 = -0.32 + 0.45*0.43 = -0.1265
    #   returns = A + V = (0.3735, 0.63, 1.0)
    # Row 1: two real tokens then a padded one holding NaN garbage.
    #   delta_1 = 1 - 0.2 = 0.8; delta_0 = 0.9*0.2 - 0.5 = -0.32
    #   A_1 = 0.8; A_0 = -0.32 + 0.45*0.8 = 0.04; returns = (0.54, 1.0, 0)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, NAN]])
    values = torch.tensor([[0.5, 0.2, 0.4], [0.5, 0.2, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.1265, 0.43, 0.6], [0.04, 0.8, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.3735, 0.63, 1.0], [0.54, 1.0, 0.0]]))


def test_gae_lambda_one_gamma_one_is_monte_carlo_return_minus_value():
    # gamma = lam = 1: A_t = sum of rewards from t on - V_t. Rewards (1, 2, 3), values (1, 1, 1):
    # A = (6 - 1, 5 - 1, 3 - 1) = (5, 4, 2); returns = (6, 5, 3).
    adv, ret = gae(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3), torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert adv.tolist() == [[5.0, 4.0, 2.0]]
    assert ret.tolist() == [[6.0, 5.0, 3.0]]


def test_gae_extra_padding_does_not_change_results():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = (torch.arange(5) < torch.tensor([[5], [2], [4]])).long()
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    pad = 1e6 * torch.randn(3, 4, generator=g)
    adv_p, ret_p = gae(torch.cat([rewards, pad], 1), torch.cat([values, -pad], 1),
                       torch.cat([mask, torch.zeros(3, 4, dtype=mask.dtype)], 1), gamma=0.95, lam=0.9)
    torch.testing.assert_close(adv_p[:, :5], adv)
    torch.testing.assert_close(ret_p[:, :5], ret)
    assert adv_p[:, 5:].abs().max() == 0 and ret_p[:, 5:].abs().max() == 0


def test_gae_rejects_left_padding():
    with pytest.raises(ValueError, match=r"right-padded.*rows \[1\]"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[1, 1, 1], [0, 1, 1]]), 1.0, 1.0)


def test_kl_penalised_rewards_hand_computed():
    # kl_coef = 0.1. Row 0 (3 real tokens): log(pi/ref) = (-1+1.5, -2+2, -1+0.5) = (0.5, 0, -0.5)
    #   -> -0.1 * (0.5, 0, -0.5) = (-0.05, 0, 0.05), score 1.0 added at token 2 -> (-0.05, 0, 1.05)
    # Row 1 (2 real tokens): log-ratio (1, 0, garbage) -> (-0.1, 0) and score 2.0 at token 1;
    #   padding stays 0 -> (-0.1, 2.0, 0)
    scores = torch.tensor([1.0, 2.0])
    logprobs = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, 99.0]])
    ref_logprobs = torch.tensor([[-1.5, -2.0, -0.5], [-2.0, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards = kl_penalised_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.05], [-0.1, 2.0, 0.0]]))


def test_kl_penalised_rewards_rejects_empty_rows():
    with pytest.raises(ValueError, match=r"rows \[1\] have no real tokens"):
        kl_penalised_rewards(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, 2),
                             torch.tensor([[1, 0], [0, 0]]), kl_coef=0.1)


def test_whiten_hand_computed():
    # Real tokens 1, 2, 3 (the 100 is padding): mean 2, population variance (1 + 0 + 1) / 3 = 2/3,
    # std = 0.816497 -> (x - 2) / 0.816497 = (-1.224745, 0, 1.224745); padding 0.
    # shift_mean=False adds the mean back: (0.775255, 2, 3.224745).
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    s = 1 / math.sqrt(2 / 3)
    torch.testing.assert_close(whiten(x, mask), torch.tensor([[-s, 0.0], [s, 0.0]]))
    torch.testing.assert_close(whiten(x, mask, shift_mean=False), torch.tensor([[2 - s, 2.0], [2 + s, 0.0]]))


def test_value_loss_clipping_hand_computed():
    # clip = 0.2.
    #   token 0: V=1.0, V_old=0.8 (inside clip) -> both errors (1.0 - 1.5)^2 = 0.25
    #   token 1: V=2.0, V_old=1.0 -> V_clip = 1.2; R=1.0: unclipped 1.0, clipped 0.04 -> max 1.0
    #   token 2: V=2.0, V_old=1.0 -> V_clip = 1.2; R=3.0: unclipped 1.0, clipped 3.24 -> max 3.24 (clip wins)
    #   token 3: padding with garbage.
    #   loss = 0.5 * (0.25 + 1.0 + 3.24) / 3 = 0.5 * 1.496667 = 0.748333; clip_frac = 1/3
    values = torch.tensor([[1.0, 2.0, 2.0, 1e30]], requires_grad=True)
    old_values = torch.tensor([[0.8, 1.0, 1.0, 0.0]])
    returns = torch.tensor([[1.5, 1.0, 3.0, -1e30]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old_values, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.748333, abs=1e-6)
    assert stats["value/clip_frac"].item() == pytest.approx(1 / 3)
    assert stats["value/mean"].item() == pytest.approx(5.0 / 3)
    # Gradients: 0.5 * 2 (V - R) / 3: token 0 -> -0.5/3 = -0.166667; token 1 -> 1/3 = 0.333333;
    # token 2 follows the clipped branch, flat in V -> 0; padding -> 0.
    loss.backward()
    assert values.grad.tolist()[0] == pytest.approx([-1 / 6, 1 / 3, 0.0, 0.0], abs=1e-6)


def test_value_loss_global_token_count_for_accumulation():
    values = torch.tensor([[1.0, 2.0]])
    half, _ = value_loss(values, values, torch.zeros(1, 2), torch.ones(1, 2), clip=0.2, num_tokens=4)
    # 0.5 * (1 + 4) / 4 = 0.625 (divided by the global count 4, not the local 2)
    assert half.item() == pytest.approx(0.625)


def test_ppo_policy_loss_hand_computed():
    # clip = 0.2, advantages per token:
    #   token 0: ratio 1.5, A = 1  -> -min(1.5, 1.2) = -1.2   (clipped)
    #   token 1: ratio 1.0, A = -2 -> -min(-2, -2) = 2
    #   token 2: ratio 0.5, A = -1 -> -min(-0.5, -0.8) = 0.8  (clipped)
    #   token 3: padding
    #   loss = (-1.2 + 2 + 0.8) / 3 = 0.533333; clip_frac = 2/3
    #   approx_kl = mean(old - new) = (-log 1.5 + 0 - log 0.5) / 3 = 0.287682 / 3 = 0.095894
    old = torch.zeros(1, 4)
    logprobs = torch.tensor([[math.log(1.5), 0.0, math.log(0.5), 0.0]])
    advantages = torch.tensor([[1.0, -2.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = ppo_policy_loss(logprobs, old, advantages, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.533333, abs=1e-6)
    assert stats["policy/clip_frac"].item() == pytest.approx(2 / 3)
    assert stats["policy/approx_kl"].item() == pytest.approx(0.095894, abs=1e-6)
