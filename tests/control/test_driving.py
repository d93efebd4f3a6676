"""Driving with highway-env: the closed-loop metrics, the flat observation, the collision cost, resumable envs."""

import pickle

import numpy as np
import pytest

from feedbackrl.config import ConfigError

gym = pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")
highway_env = pytest.importorskip("highway_env", reason="the driving environments need highway-env (control extra)")

from feedbackrl.control.driving import episode_metrics  # noqa: E402
from feedbackrl.control.envs import collision, make_vec_env, step_infos  # noqa: E402

HIGHWAY = "feedbackrl/highway-fast-v0"
# float64 metrics of a handful of terms: a few ulps of the largest value
REL = 1e-12


def test_episode_metrics_by_hand():
    positions = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [6.0, 8.0]])
    velocities = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.0, 0.0]])
    speeds = np.array([2.0, 8**0.5, 0.0])
    # a lane change, a move onto the next road segment (not a change), a lane change on that segment
    lanes = [("a", "b", 0), ("a", "b", 1), ("b", "c", 1), ("b", "c", 0)]
    m = episode_metrics(positions, velocities, speeds, lanes, crashed=True, off_road=False, policy_frequency=1)
    # distance 5 + 5 + 0; accelerations (2, 0), (0, 2), (-2, -2); jerks (-2, 2) and (-2, -4)
    assert m["distance"] == pytest.approx(10.0, rel=REL)
    assert m["jerk"] == pytest.approx((8**0.5 + 20**0.5) / 2, rel=REL)
    assert m["mean_speed"] == pytest.approx((2 + 8**0.5) / 3, rel=REL)
    assert (m["collision"], m["off_road"], m["lane_changes"]) == (1.0, 0.0, 2.0)
    # at 2 Hz the same samples are half a second apart: accelerations double, jerks quadruple
    fast = episode_metrics(positions, velocities, speeds, lanes, crashed=False, off_road=True, policy_frequency=2)
    assert fast["jerk"] == pytest.approx(4 * m["jerk"], rel=REL)
    assert (fast["distance"], fast["collision"], fast["off_road"]) == (m["distance"], 0.0, 1.0)
    # one step: no jerk to measure
    one = episode_metrics(positions[:2], velocities[:2], speeds[:1], lanes[:2], False, False, 1)
    assert one["jerk"] == 0.0 and one["distance"] == pytest.approx(5.0, rel=REL)
    with pytest.raises(ValueError, match="at least one step"):
        episode_metrics(positions[:1], velocities[:1], speeds[:0], lanes[:1], False, False, 1)


def test_scripted_empty_road_cruise_and_one_lane_change():
    env = gym.make(HIGHWAY, config={"vehicles_count": 0, "duration": 5, "initial_lane_id": 1})
    obs, info = env.reset(seed=0)
    assert obs.shape == (25,) and obs.dtype == np.float32 and info["crashed"] is False
    rewards = []
    for _ in range(5):  # IDLE: the ego vehicle starts at 25 m/s and holds it
        obs, r, term, trunc, info = env.step(1)
        rewards.append(r)
    assert (term, trunc) == (False, True)
    assert info["metrics"] == {"collision": 0.0, "off_road": 0.0, "distance": pytest.approx(125.0, rel=REL),
                               "mean_speed": pytest.approx(25.0, rel=REL), "lane_changes": 0.0, "jerk": 0.0}
    # highway-env's reward, normalised: (0.4 * speed share 0.5 + 0.1 * middle of 3 lanes 0.5 + 1) / (0.5 + 1)
    assert rewards == pytest.approx([1.25 / 1.5] * 5, rel=REL)
    env.reset(seed=0)
    for a in (0, 1, 1, 1, 1):  # LANE_LEFT once, then IDLE
        *_, info = env.step(a)
    m = info["metrics"]
    assert m["lane_changes"] == 1.0 and m["collision"] == 0.0 and m["jerk"] > 0
    # 25 m/s throughout; the straight chords between the once-a-second samples cut the lane change's curve
    assert 124.0 < m["distance"] < 125.0


@pytest.mark.parametrize("scenario", ["highway-fast-v0", "merge-v0", "roundabout-v0"])
def test_numpy_kinematics_match_highway_envs_own_observation(scenario):
    config = {"vehicles_count": 10} if scenario.startswith("highway") else {}
    ours = gym.make(f"feedbackrl/{scenario}", config=config)
    theirs = gym.make(scenario, config=config)  # registered by highway-env's import
    a, _ = ours.reset(seed=5)
    b, _ = theirs.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(15):
        np.testing.assert_array_equal(a, b.reshape(-1))
        act = int(rng.integers(5))
        a, ra, ta, tra, _ = ours.step(act)
        b, rb, tb, trb, _ = theirs.step(act)
        assert (ra, ta, tra) == (rb, tb, trb)
        if ta or tra:
            a, _ = ours.reset(seed=6)
            b, _ = theirs.reset(seed=6)


def test_collision_cost_is_one_on_the_crash_step_only():
    # one lane, dense traffic, always FASTER: a rear-end crash within a few steps
    envs = make_vec_env(HIGHWAY, 2, {"config": {"lanes_count": 1, "vehicles_count": 10, "vehicles_density": 2,
                                                "duration": 30}})
    envs.reset(seed=0)
    costs, crashed_at = [], None
    for t in range(10):
        _, _, term, trunc, info = envs.step(np.array([3, 3]))
        done = term | trunc
        c = collision(None, step_infos(info, done))
        costs.append(c)
        if term[0]:
            assert info["final_info"]["metrics"]["collision"][0] == 1.0
            crashed_at = t
            break
    assert crashed_at is not None
    assert [float(c[0]) for c in costs] == [0.0] * crashed_at + [1.0]
    envs.close()


def test_step_infos_take_a_finished_episodes_last_step_and_the_cost_counts_off_road():
    info = {"crashed": np.array([False, False, False]), "_crashed": np.ones(3, bool),
            "off_road": np.array([False, False, False]), "_off_road": np.ones(3, bool),
            "final_info": {"crashed": np.array([False, True, False]), "_crashed": np.array([False, True, False]),
                           "off_road": np.array([False, False, False]), "_off_road": np.array([False, True, False])},
            "final_obs": np.array([None, np.zeros(2), None], dtype=object), "_final_obs": np.array([0, 1, 0], bool)}
    done = np.array([False, True, False])
    merged = step_infos(info, done)
    assert merged["crashed"].tolist() == [False, True, False] and "final_obs" not in merged
    # leaving the road is as costly as a crash: driving off it is no way around the cost
    merged["off_road"] = np.array([True, False, False])
    assert collision(None, merged).tolist() == [1.0, 1.0, 0.0]


def test_collision_cost_on_an_environment_without_crash_infos_is_refused():
    with pytest.raises(ConfigError, match="crashed.*driving environment"):
        collision(np.zeros((2, 4)), {"x": np.zeros(2)})


def test_a_driving_collector_round_trips_through_its_state_dict():
    import torch

    from feedbackrl.control.policy import ActorCritic
    from feedbackrl.control.rollout import Collector

    options = {"config": {"duration": 5, "vehicles_count": 5}}
    col = Collector(make_vec_env(HIGHWAY, 2, options), seed=3, cost=collision)
    policy = ActorCritic(25, 5, True)
    first = col.collect(policy, 6, torch.Generator().manual_seed(0))
    # every finished episode carries the environment's metrics, and its cost is its collision
    assert first.episodes and all(set(e) >= {"collision", "distance", "jerk", "lane_changes"} for e in first.episodes)
    assert all(e["cost"] == e["collision"] for e in first.episodes)
    state = pickle.loads(pickle.dumps(col.state_dict()))
    a = col.collect(policy, 6, torch.Generator().manual_seed(1))
    other = Collector(make_vec_env(HIGHWAY, 2, options), seed=99, cost=collision)
    other.load_state_dict(state)
    b = other.collect(policy, 6, torch.Generator().manual_seed(1))
    assert torch.equal(a.obs, b.obs) and torch.equal(a.rewards, b.rewards) and torch.equal(a.costs, b.costs)
    assert a.episodes == b.episodes


def test_a_short_driving_run_logs_and_evaluates_the_closed_loop_metrics(tmp_path):
    import json

    from feedbackrl.config import build_config
    from feedbackrl.train.run import run

    cfg = build_config({"algo": {"name": "control_ppo", "steps": 2, "minibatches": 2},
                        "control": {"env": HIGHWAY, "num_envs": 2, "rollout_steps": 12, "eval_episodes": 2,
                                    "cost": "collision", "env_options": {"config": {"duration": 5,
                                                                                    "vehicles_count": 5}}},
                        "train": {"threads": 1}, "constraint": {"threshold": 0.05, "window": 4}})
    report = run(cfg, tmp_path / "run")
    names = ("collision", "off_road", "distance", "mean_speed", "lane_changes", "jerk")
    for when in ("control_eval_before", "control_eval_after"):
        ev = report[when]
        assert all(f"eval/{k}" in ev for k in names) and ev["eval/length"] <= 5
        assert ev["eval/cost"] >= ev["eval/collision"]  # a crash step costs 1 (and ends the episode)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl" and "episode/distance" in r]
    assert rl and all(0 <= r["episode/collision"] <= 1 and r["episode/distance"] > 0 for r in rl)
    assert all("constraint/lambda" in r for r in rows if r.get("phase") == "rl")


@pytest.mark.parametrize("name", ["highway_ppo", "highway_prefs", "highway_safe", "highway_speed_ppo",
                                  "highway_speed_safe"])
def test_the_driving_recipes_read(name):
    from pathlib import Path

    from feedbackrl.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / f"{name}.toml")
    assert cfg.control.env == HIGHWAY and cfg.control.cost == "collision"
    assert (cfg.control.reward == "preferences") == (name == "highway_prefs")
    assert (cfg.constraint is not None) == name.endswith("_safe")
    if name == "highway_prefs":
        assert cfg.control.preferences.labels <= 1000


def test_the_speed_recipes_share_everything_but_the_constraint():
    from pathlib import Path

    from feedbackrl.config import load_config

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    ppo, safe = (load_config(recipes / f"highway_speed_{n}.toml") for n in ("ppo", "safe"))
    assert ppo.constraint is None and safe.constraint is not None
    assert ppo.model_dump(exclude={"constraint"}) == safe.model_dump(exclude={"constraint"})


def test_the_speed_reward_pays_forward_speed_only_and_nothing_is_taken_for_a_crash():
    """recipes/highway_speed_*.toml: highway-env's reward with only its speed term, (v cos(heading) - 20) / 10
    clipped to [0, 1], times 1 on the road; a crash still ends the episode but costs no reward."""
    from pathlib import Path

    from feedbackrl.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "highway_speed_ppo.toml")
    env = gym.make(HIGHWAY, **cfg.control.env_options)
    base = env.unwrapped
    crashed = 0
    for seed in range(6):
        env.reset(seed=seed)
        for _ in range(20):  # FASTER every step: at 10 vehicles the ego car soon runs into one
            _, reward, terminated, truncated, info = env.step(3)
            v = base.vehicle
            expected = float(np.clip((v.speed * np.cos(v.heading) - 20) / 10, 0, 1)) * float(v.on_road)
            assert reward == pytest.approx(expected, abs=1e-12)
            if terminated:
                assert info["crashed"]
                crashed += 1
            if terminated or truncated:
                break
    env.close()
    assert crashed >= 1  # the crash step was among those checked


def test_a_highway_setting_that_does_not_exist_is_refused():
    with pytest.raises(ConfigError, match="'colision_reward' is not a setting of highway-env's highway-fast-v0"):
        gym.make(HIGHWAY, config={"duration": 5, "colision_reward": 0})


def test_a_driving_clip_is_drawn_headless():
    """highway-env stops drawing under SDL's dummy video driver, which headless rendering sets: the frames
    of a clip must still show the road and the vehicles (several colours, changing as the cars move)."""
    from feedbackrl.control.video import render_env

    env = render_env(HIGHWAY, {"config": {"duration": 5, "vehicles_count": 5}})
    env.reset(seed=0)
    first = env.render()
    env.step(1)
    second = env.render()
    env.close()
    assert first.ndim == 3 and first.shape[2] == 3
    assert len(np.unique(first.reshape(-1, 3), axis=0)) >= 3  # road, lane marks, vehicles: not one flat colour
    assert (first != second).any()
