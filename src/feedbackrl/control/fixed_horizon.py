"""A fixed-horizon CartPole: the `seals/CartPole-v0` of the `seals` package (the environments `imitation`
trains its preference comparisons on), rebuilt on the installed gymnasium.

CartPole-v1 ends the episode when the pole falls, so the episode's length is its return: a reward learned
from preferences can be right about nothing and still win by its sign alone (a positive reward makes the
policy want its episode to go on). Here the episode always lasts 500 steps; a step is worth 1 while the
pole is upright and the cart on the track (CartPole-v1's termination test) and 0 otherwise, and the pole
may swing freely after falling (its angle wrapped to [-pi, pi)). Observations are float32 and unbounded
but for the angle, as in `seals.classic_control.FixedHorizonCartPole`.

Built with `gymnasium.make("feedbackrl.control.fixed_horizon:CartPoleFixedHorizon-v0")` (the module part
registers the id on import), or `control.env` set to the same string.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv

ENV_ID = "CartPoleFixedHorizon-v0"


class FixedHorizonCartPole(CartPoleEnv):
    """CartPole without termination: reward 1 in an upright, on-track state, else 0; 500 steps (TimeLimit)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        big = np.finfo(np.float32).max
        high = np.array([big, big, np.pi, big], dtype=np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs.astype(np.float32), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        with warnings.catch_warnings():  # CartPoleEnv warns about stepping past its own termination
            warnings.filterwarnings("ignore", ".*You are calling.*")
            super().step(action)
        x, x_dot, theta, theta_dot = (float(v) for v in self.state)
        theta = (theta + np.pi) % (2 * np.pi) - np.pi
        self.state = np.array([x, x_dot, theta, theta_dot], dtype=np.float64)
        ok = abs(x) < self.x_threshold and abs(theta) < self.theta_threshold_radians
        return self.state.astype(np.float32), 1.0 if ok else 0.0, False, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=FixedHorizonCartPole, max_episode_steps=500)
