"""Seeded, vectorised gymnasium environments and the cost signals a control run can constrain.

Every environment is built with `gymnasium.make(id, **options)` inside a `SyncVectorEnv` that resets
finished episodes in the same step (`AutoresetMode.SAME_STEP`): the step's observation is already the
next episode's first one and the finished episode's last observation sits in `info["final_obs"]`, which
the rollout needs to bootstrap the value of a truncated episode. Sub-environment i is seeded with
`seed + i`. Synchronous stepping keeps runs deterministic; classic-control environments step in
microseconds, so processes would only add overhead.

A cost is a function of the vector env's observations after a step (E, obs_dim) and of the step's infos
(`step_infos`: each key an (E,) array, a finished episode's entry from its last step) -> (E,) costs, named in
`COSTS` (one registry, looked up by `control.cost`).

Driving environments (`feedbackrl/highway-fast-v0`, ...) are registered here from `driving.py`, which imports
highway-env only when one is made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from feedbackrl.config import ConfigError
from feedbackrl.control import driving

CostFn = Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]

driving.register()


def step_infos(info: dict[str, Any], done: np.ndarray) -> dict[str, np.ndarray]:
    """A vector env's step infos as {key: (E,) array}: a finished episode's entry is its last step's (under
    `final_info`; the top level holds the next episode's reset info). Keys some environment lacks are dropped."""
    final = info.get("final_info", {})
    out = {}
    for key, value in info.items():
        if key.startswith("_") or key in ("final_obs", "final_info") or not isinstance(value, np.ndarray) \
                or value.ndim != 1 or value.dtype == object or not info[f"_{key}"].all():
            continue
        merged = value.copy()
        if done.any():
            if key not in final or not final[f"_{key}"][done].all():
                continue
            merged[done] = final[key][done]
        out[key] = merged
    return out


def cart_off_centre(obs: np.ndarray, info: dict[str, np.ndarray] | None = None, limit: float = 0.5) -> np.ndarray:
    """CartPole: 1 where the cart is more than `limit` (of the track's 2.4 half-width) from the centre."""
    return (np.abs(obs[:, 0]) > limit).astype(np.float32)


def collision(obs: np.ndarray, info: dict[str, np.ndarray]) -> np.ndarray:
    """Driving (`driving.py`): 1 on a step that ends in a crash or off the road, else 0."""
    if "crashed" not in info or "off_road" not in info:
        raise ConfigError(f"control.cost = 'collision' reads the `crashed` and `off_road` step infos of a driving "
                          f"environment (control.env = 'feedbackrl/highway-fast-v0', ...); this one gives "
                          f"{sorted(info)}")
    return (info["crashed"].astype(bool) | info["off_road"].astype(bool)).astype(np.float32)


COSTS: dict[str, CostFn] = {"cart_off_centre": cart_off_centre, "collision": collision}


def make_vec_env(env_id: str, num_envs: int, options: dict[str, Any] | None = None) -> SyncVectorEnv:
    """`num_envs` copies of `env_id` (gymnasium id), reset in the same step; a clear error for an unknown id."""
    options = dict(options or {})
    module, _, name = env_id.rpartition(":")  # "module:Id" registers Id by importing module, as gymnasium.make does
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except ImportError as e:
        raise ConfigError(f"control.env = {env_id!r}: cannot import {module!r} to register it ({e})") from None
    except gym.error.Error as e:
        known = sorted(k for k in gym.registry if "/" not in k and k.endswith(("-v0", "-v1")))[:12]
        raise ConfigError(f"control.env = {env_id!r} is not a registered gymnasium environment ({e}); "
                          f"e.g. {', '.join(known)}") from None
    return SyncVectorEnv([lambda: gym.make(env_id, **options) for _ in range(num_envs)],
                         autoreset_mode=AutoresetMode.SAME_STEP)


def space_dims(envs: SyncVectorEnv) -> tuple[int, int, bool]:
    """(obs_dim, action_dim, discrete): action_dim is the number of actions when discrete, else the vector size."""
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"control policies take vector observations (a 1-D Box); this environment's are "
                          f"{obs_space}")
    if isinstance(act_space, gym.spaces.Discrete):
        return obs_space.shape[0], int(act_space.n), True
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return obs_space.shape[0], act_space.shape[0], False
    raise ConfigError(f"control policies act in a Discrete or 1-D Box action space; this environment's is {act_space}")


def env_action(envs: SyncVectorEnv, actions: np.ndarray) -> np.ndarray:
    """What the env is given: a continuous action clipped to the space's bounds (the policy's sample is kept)."""
    space = envs.single_action_space
    if isinstance(space, gym.spaces.Box):
        return np.clip(actions, space.low, space.high)
    return actions
