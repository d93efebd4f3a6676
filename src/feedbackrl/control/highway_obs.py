"""highway-env's `Kinematics` observation computed with numpy (imported only once highway-env is needed)."""

from __future__ import annotations

import numpy as np
from highway_env import utils
from highway_env.envs.common.observation import KinematicObservation
from highway_env.road.lane import AbstractLane
from highway_env.vehicle.kinematics import Vehicle


class NumpyKinematics(KinematicObservation):
    """highway-env's `KinematicObservation.observe` without pandas (same rows, order, ranges and clipping)."""

    def observe(self) -> np.ndarray:
        if not self.env.road:
            return np.zeros(self.space().shape, dtype=np.float32)
        ego = self.observer_vehicle
        rows = [ego.to_dict()]
        close = self.env.road.close_objects_to(ego, self.env.PERCEPTION_DISTANCE, count=self.vehicles_count - 1,
                                               see_behind=self.see_behind, sort=self.order == "sorted",
                                               vehicles_only=not self.include_obstacles)
        if close:
            origin = ego if not self.absolute else None
            rows += [v.to_dict(origin, observe_intentions=self.observe_intentions)
                     for v in close[-self.vehicles_count + 1:]]
        obs = np.array([[float(r[f]) for f in self.features] for r in rows], dtype=np.float64)
        if self.normalize:
            if not self.features_range:
                side = len(self.env.road.network.all_side_lanes(ego.lane_index))
                self.features_range = {"x": [-5.0 * Vehicle.MAX_SPEED, 5.0 * Vehicle.MAX_SPEED],
                                       "y": [-AbstractLane.DEFAULT_WIDTH * side, AbstractLane.DEFAULT_WIDTH * side],
                                       "vx": [-2 * Vehicle.MAX_SPEED, 2 * Vehicle.MAX_SPEED],
                                       "vy": [-2 * Vehicle.MAX_SPEED, 2 * Vehicle.MAX_SPEED]}
            for j, f in enumerate(self.features):
                if f in self.features_range:
                    lo, hi = self.features_range[f]
                    obs[:, j] = utils.lmap(obs[:, j], [lo, hi], [-1, 1])
                    if self.clip:
                        obs[:, j] = np.clip(obs[:, j], -1, 1)
        if len(obs) < self.vehicles_count:
            obs = np.concatenate([obs, np.zeros((self.vehicles_count - len(obs), len(self.features)))])
        if self.order == "shuffled":
            self.env.np_random.shuffle(obs[1:])
        return obs.astype(self.space().dtype)
