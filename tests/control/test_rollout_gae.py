"""GAE over vectorised rollouts: hand-computed values, and Stable-Baselines3's RolloutBuffer on one rollout."""

import numpy as np
import pytest
import torch
from fp32 import gamma as fp32_gamma

from feedbackrl.control.rollout import episode_pieces, rollout_advantages


def test_rollout_advantages_hand_computed_termination_truncation_and_rollout_end():
    # gamma = lam = 0.5, so gamma * lam = 0.25; T = 3 steps, E = 2 environments.
    # env 0: rewards (1, 2, 3), values (0.5, 1, 1.5), terminated at t=0; V(next obs) after the rollout = 2.
    #   piece t=0:   delta = 1 - 0.5 = 0.5                          -> A = 0.5
    #   piece t=1,2: r'_2 = 3 + 0.5*2 = 4; delta_2 = 4 - 1.5 = 2.5  -> A_2 = 2.5
    #                delta_1 = 2 + 0.5*1.5 - 1 = 1.75             -> A_1 = 1.75 + 0.25*2.5 = 2.375
    # env 1: rewards (1, 1, 1), values (1, 1, 1), truncated at t=1 with V(final obs) = 4, terminated at t=2
    #   piece t=0,1: r'_1 = 1 + 0.5*4 = 3; delta_1 = 2; delta_0 = 1 + 0.5*1 - 1 = 0.5 -> A = (1.0, 2.0)
    #   piece t=2:   delta = 1 - 1 = 0 (terminated: no bootstrap, last_values ignored) -> A = 0
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 1.0], [1.0, 1.0], [1.5, 1.0]])
    terminated = torch.tensor([[True, False], [False, False], [False, True]])
    truncated = torch.tensor([[False, False], [False, True], [False, False]])
    boot = torch.tensor([[0.0, 0.0], [0.0, 4.0], [0.0, 0.0]])
    last = torch.tensor([2.0, 99.0])
    adv, ret = rollout_advantages(rewards, values, terminated, truncated, boot, last, gamma=0.5, lam=0.5)
    expected = torch.tensor([[0.5, 1.0], [2.375, 2.0], [2.5, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6, rtol=0), adv
    assert torch.allclose(ret, expected + values, atol=1e-6, rtol=0)


def test_episode_pieces_cut_each_column_after_every_done():
    dones = torch.tensor([[False, True], [True, False], [False, False]])  # (T=3, E=2)
    piece, pos, n, longest = episode_pieces(dones)
    # env 0: steps 0-1 (piece 0), step 2 (piece 1); env 1: step 0 (piece 2), steps 1-2 (piece 3)
    assert piece.t().tolist() == [[0, 0, 1], [2, 3, 3]]
    assert pos.t().tolist() == [[0, 1, 0], [0, 0, 1]]
    assert (n, longest) == (4, 2)


def test_rollout_advantages_match_stable_baselines3():
    sb3 = pytest.importorskip("stable_baselines3", reason="the test extra installs stable-baselines3")
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    t_len, n_env, g, lam = 64, 4, 0.99, 0.95
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(t_len, n_env)).astype(np.float32)
    values = rng.normal(size=(t_len, n_env)).astype(np.float32)
    done = rng.random((t_len, n_env)) < 0.08
    truncated = done & (rng.random((t_len, n_env)) < 0.5)
    terminated = done & ~truncated
    boot = np.where(truncated, rng.normal(size=(t_len, n_env)), 0).astype(np.float32)
    last = rng.normal(size=n_env).astype(np.float32)

    buf = RolloutBuffer(t_len, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gae_lambda=lam, gamma=g,
                        n_envs=n_env)
    starts = np.vstack([np.ones((1, n_env)), done[:-1]]).astype(np.float32)
    for t in range(t_len):  # SB3's collect_rollouts adds gamma * V(terminal obs) to a truncated step's reward
        buf.add(np.zeros((n_env, 1), np.float32), np.zeros((n_env, 1)), rewards[t] + g * boot[t], starts[t],
                torch.as_tensor(values[t]), torch.zeros(n_env))
    buf.compute_returns_and_advantage(torch.as_tensor(last), done[-1].astype(np.float32))

    adv, ret = rollout_advantages(torch.as_tensor(rewards), torch.as_tensor(values), torch.as_tensor(terminated),
                                  torch.as_tensor(truncated), torch.as_tensor(boot), torch.as_tensor(last), g, lam)
    # both sides run the same recursion in float32 (a few roundings per step over at most T steps): bound the
    # difference by gamma(8T) times the column's total magnitude
    scale = np.abs(rewards).sum(0) + 2 * np.abs(values).sum(0) + np.abs(boot).sum(0) + np.abs(last)
    bound = torch.as_tensor(2 * fp32_gamma(8 * t_len) * scale, dtype=torch.float64).expand(t_len, n_env)
    diff = (adv.double() - torch.as_tensor(buf.advantages, dtype=torch.float64)).abs()
    assert (diff <= bound).all(), f"max diff {diff.max():.3g}, bound {bound.min():.3g}; sb3 {sb3.__version__}"
    assert ((ret.double() - torch.as_tensor(buf.returns, dtype=torch.float64)).abs() <= bound).all()
    assert done.sum() > 10 and truncated.sum() > 3  # the rollout really crosses both kinds of episode end
