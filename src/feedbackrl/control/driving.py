"""Driving with highway-env: headless environments with flat kinematics observations and closed-loop metrics.

`feedbackrl/highway-fast-v0`, `feedbackrl/merge-v0` and `feedbackrl/roundabout-v0` are gymnasium ids (registered
when `feedbackrl.control.envs` is imported; highway-env itself is imported only when one is made, so it stays an
optional dependency of the `control` extra). Each is the highway-env scenario of the same name with

- its default observation, `Kinematics` (the ego vehicle and the 4 nearest vehicles: presence, x, y, vx, vy,
  normalised to [-1, 1]), flattened to a 25-vector for the MLP policy, and computed with numpy instead of
  highway-env's pandas frames (the same numbers, `tests/control/test_driving.py` checks them; it halves the
  time of a step);
- its discrete meta-actions: 0 LANE_LEFT, 1 IDLE, 2 LANE_RIGHT, 3 FASTER, 4 SLOWER;
- `config` (keyword argument, as highway-env's own `config=`) overriding the scenario's configuration, e.g.
  `duration` (policy steps per episode), `vehicles_count` or the reward's weights (`collision_reward`,
  `high_speed_reward`, ...); a key the scenario does not have is refused (highway-env itself ignores it);
- in every step's info: `crashed` and `off_road` (the ego vehicle is not on a lane), the per-step cost
  `control.cost = "collision"` reads (`envs.collision`);
- in an episode's last step's info, `metrics`, the closed-loop metrics of the episode (`episode_metrics`):
  `collision` (1 if it ended in a crash), `off_road` (1 if it ended off the road), `distance` (metres driven:
  the path length of the ego vehicle, sampled once per policy step), `mean_speed` (m/s, over the policy
  steps), `lane_changes` (steps whose lane differs from the previous step's on the same road segment;
  a merge onto the next segment is not a lane change) and `jerk` (comfort: the mean norm of the finite
  difference of the acceleration vector, m/s^3, with accelerations the finite differences of the velocity
  vectors at the policy frequency; 0 for episodes of fewer than 3 steps). The rollout collects them into its
  episodes, and `feedbackrl train` logs them under `episode/` and `eval/`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from feedbackrl.config import ConfigError

SCENARIOS = ("highway-fast-v0", "highway-v0", "merge-v0", "roundabout-v0")
METRICS = ("collision", "off_road", "distance", "mean_speed", "lane_changes", "jerk")


def register() -> None:
    """Register `feedbackrl/<scenario>` for each scenario (idempotent; no highway-env import)."""
    for scenario in SCENARIOS:
        env_id = f"feedbackrl/{scenario}"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="feedbackrl.control.driving:make_driving",
                         kwargs={"scenario": scenario})


def episode_metrics(positions: np.ndarray, velocities: np.ndarray, speeds: np.ndarray, lanes: list[tuple],
                    crashed: bool, off_road: bool, policy_frequency: float) -> dict[str, float]:
    """One episode's closed-loop metrics from its per-step samples.

    positions, velocities (N + 1, 2): the ego vehicle at the reset and after each of the N policy steps; speeds
    (N,) and lanes (N + 1) likewise (a lane is highway-env's (from, to, index)); crashed / off_road: how the
    episode's last step ended."""
    if len(positions) < 2:
        raise ValueError("an episode has at least one step: need the reset's sample and one after it")
    dt = 1.0 / policy_frequency
    distance = float(np.linalg.norm(np.diff(positions, axis=0), axis=1).sum())
    acc = np.diff(velocities, axis=0) / dt  # (N, 2)
    jerk = np.linalg.norm(np.diff(acc, axis=0), axis=1) / dt if len(acc) > 1 else np.zeros(0)
    changes = sum(1 for a, b in zip(lanes, lanes[1:], strict=False) if a[:2] == b[:2] and a[2] != b[2])
    return {"collision": float(crashed), "off_road": float(off_road), "distance": distance,
            "mean_speed": float(np.mean(speeds)), "lane_changes": float(changes),
            "jerk": float(jerk.mean()) if len(jerk) else 0.0}


class DrivingEnv(gym.Wrapper):
    """A highway-env scenario with flat observations, `crashed` / `off_road` in every info and the episode's
    `metrics` in its last step's info (module docstring)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._numpy_obs = env.unwrapped.config["observation"].get("type") == "Kinematics"
        shape = env.observation_space.shape
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(shape)),), np.float32)
        self._trace: dict[str, list[Any]] = {}

    def _sample(self) -> None:
        v = self.env.unwrapped.vehicle
        self._trace["positions"].append(np.array(v.position, dtype=np.float64))
        self._trace["velocities"].append(np.array(v.velocity, dtype=np.float64))
        self._trace["lanes"].append(tuple(v.lane_index))

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        base = self.env.unwrapped
        if self._numpy_obs:  # reset() rebuilt highway-env's observation type; put ours in its place
            from feedbackrl.control.highway_obs import NumpyKinematics

            base.observation_type = NumpyKinematics(base, **base.config["observation"])
        self._trace = {"positions": [], "velocities": [], "lanes": [], "speeds": []}
        self._sample()
        v = base.vehicle
        info = {**info, "crashed": bool(v.crashed), "off_road": not v.on_road}
        return np.asarray(obs, dtype=np.float32).reshape(-1), info

    def render(self) -> Any:
        """highway-env's frame. Its viewer switches drawing off when SDL's video driver is "dummy" (as headless
        rendering sets it for classic control), which would give black frames; offscreen drawing needs no
        display, so it is switched back on."""
        base = self.env.unwrapped
        if base.render_mode is not None and base.viewer is not None and not base.viewer.enabled:
            base.viewer.enabled = True
        frame = self.env.render()
        if base.render_mode is not None and not base.viewer.enabled:  # the first call made the viewer
            base.viewer.enabled = True
            frame = self.env.render()
        return frame

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        base = self.env.unwrapped
        v = base.vehicle
        self._sample()
        self._trace["speeds"].append(float(v.speed))
        info = {**info, "crashed": bool(v.crashed), "off_road": not v.on_road}
        if terminated or truncated:
            t = self._trace
            info["metrics"] = episode_metrics(np.stack(t["positions"]), np.stack(t["velocities"]),
                                              np.array(t["speeds"]), t["lanes"], v.crashed, not v.on_road,
                                              base.config["policy_frequency"])
        return np.asarray(obs, dtype=np.float32).reshape(-1), float(reward), terminated, truncated, info


def make_driving(scenario: str, config: dict[str, Any] | None = None, render_mode: str | None = None) -> gym.Env:
    """The entry point of `feedbackrl/<scenario>`: highway-env's scenario, headless, wrapped in `DrivingEnv`."""
    try:
        import highway_env
    except ImportError:
        raise ImportError("driving environments need highway-env: pip install 'feedbackrl[control]' "
                          "(or pip install highway-env)") from None
    gym.register_envs(highway_env)
    config = dict(config or {})
    if render_mode is not None:  # draw on a surface only: no window, so no display is needed
        config.setdefault("offscreen_rendering", True)
    env = gym.make(scenario, config=config, render_mode=render_mode)
    # highway-env merges `config` into its defaults without a check, so a misspelt key would be ignored
    unknown = sorted(set(config) - set(env.unwrapped.default_config()))
    if unknown:
        env.close()
        raise ConfigError(f"control.env_options.config: {', '.join(map(repr, unknown))} "
                         f"{'is not a setting' if len(unknown) == 1 else 'are not settings'} of highway-env's "
                         f"{scenario}; its settings: {', '.join(sorted(env.unwrapped.default_config()))}")
    return DrivingEnv(env)
