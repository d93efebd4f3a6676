"""The fixed-horizon CartPole (seals' CartPole-v0, rebuilt on the installed gymnasium)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from feedbackrl.config import ConfigError
from feedbackrl.control.envs import make_vec_env

ENV = "feedbackrl.control.fixed_horizon:CartPoleFixedHorizon-v0"


def test_same_dynamics_as_cartpole_until_the_fall_then_reward_zero_and_no_termination() -> None:
    fixed, v1 = gym.make(ENV), gym.make("CartPole-v1")
    o_f, _ = fixed.reset(seed=7)
    o_v, _ = v1.reset(seed=7)
    np.testing.assert_array_equal(o_f, o_v)
    rewards, fell_at = [], None
    for t in range(600):
        o_f, r, term, trunc, _ = fixed.step(0)  # always push left: the pole falls within a few dozen steps
        assert not term
        rewards.append(r)
        if fell_at is None:
            o_v, r_v, term_v, _, _ = v1.step(0)
            np.testing.assert_allclose(o_f, o_v, rtol=0, atol=0)
            if term_v:
                fell_at = t
        if trunc:
            break
    assert len(rewards) == 500 and trunc
    assert fell_at is not None and 5 < fell_at < 100
    # CartPole-v1 pays 1 on the step that terminates it; here the step that leaves the upright region pays 0
    assert rewards[:fell_at] == [1.0] * fell_at and rewards[fell_at] == 0.0
    assert sum(rewards) < 500
    assert fixed.observation_space.contains(o_f) and -np.pi <= o_f[2] < np.pi


def test_module_prefix_registers_and_a_missing_module_is_named() -> None:
    envs = make_vec_env(ENV, 2)
    assert envs.num_envs == 2 and envs.single_observation_space.shape == (4,)
    envs.close()
    with pytest.raises(ConfigError, match="cannot import 'feedbackrl.no_such_module'"):
        make_vec_env("feedbackrl.no_such_module:Nope-v0", 1)
