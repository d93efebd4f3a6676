"""The cost signal and the Lagrangian on a control run."""

import json

import numpy as np
import pytest

from feedbackrl.config import build_config
from feedbackrl.control.envs import cart_off_centre

gym = pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")


def test_cart_off_centre_counts_either_side_strictly_past_the_limit():
    obs = np.array([[0.0, 9, 9, 9], [0.5, 0, 0, 0], [0.51, 0, 0, 0], [-0.7, 0, 0, 0], [-0.5, 0, 0, 0]],
                   dtype=np.float32)
    assert cart_off_centre(obs).tolist() == [0.0, 0.0, 1.0, 1.0, 0.0]


def test_lagrangian_run_moves_the_multiplier_against_the_violation(tmp_path):
    from feedbackrl.train.run import run

    def go(threshold, out):
        cfg = build_config({"algo": {"name": "control_ppo", "steps": 3, "minibatches": 2},
                            "control": {"num_envs": 2, "rollout_steps": 64, "eval_episodes": 1,
                                        "cost": "cart_off_centre"}, "train": {"threads": 1},
                            "constraint": {"threshold": threshold, "lr": 1.0, "window": 8}})
        run(cfg, out)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r.get("phase") == "rl"]

    # the random start policy's episodes are ~20 steps long: the cart hardly leaves the centre, so a threshold
    # of 0.5 is far above the cost and lambda must fall from 1 at every step
    low = go(0.5, tmp_path / "loose")
    lams = [r["constraint/lambda"] for r in low]
    assert all(r["constraint/violation"] < 0 for r in low)
    assert lams[0] < 1.0 and lams[0] > lams[1] > lams[2], lams
    # a threshold of 0 with any cost seen keeps lambda at least where it was
    tight = go(0.0, tmp_path / "tight")
    assert all(r["constraint/violation"] >= 0 for r in tight)
    assert all(r["constraint/lambda"] >= 1.0 for r in tight)


def test_a_constrained_checkpoint_loads_for_evaluation(tmp_path):
    from feedbackrl.control.loop import eval_checkpoint, load_checkpoint
    from feedbackrl.train.run import run

    out = tmp_path / "run"
    cfg = build_config({"algo": {"name": "control_ppo", "steps": 1, "minibatches": 2},
                        "control": {"num_envs": 2, "rollout_steps": 32, "eval_episodes": 2, "cost": "cart_off_centre"},
                        "train": {"threads": 1}, "constraint": {"threshold": 0.1, "lr": 2.0, "window": 4}})
    report = run(cfg, out)
    ckpt = out / "checkpoints" / "step_000001"
    # the saved config holds every field, the PID multiplier's kp, ki and kd too: they must not read as given
    assert json.loads((ckpt / "run_config.json").read_text())["constraint"]["ki"] == 0.1
    policy, loaded = load_checkpoint(ckpt)
    assert loaded.constraint == cfg.constraint and policy.critic[-1].out_features == 2
    assert eval_checkpoint(ckpt)["eval/cost"] == report["control_eval_after"]["eval/cost"]


class _GreedyCrashes(gym.Env):
    """A stub driving environment where the greedy and the sampled cost differ by construction. The observation is
    always 0, so an ActorCritic's logits are its output biases: all 0 before training (a tie, whose argmax is the
    first action, 0). Action 0 earns a reward of 1 and crashes (the `collision` cost: 1); action 1 earns nothing
    and never crashes. Episodes are cut after 8 steps; a crash does not end one."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {"crashed": False, "off_road": False}

    def step(self, action):
        self.t += 1
        crash = int(action) == 0
        return np.zeros(4, np.float32), float(crash), False, self.t >= 8, {"crashed": crash, "off_road": False}


@pytest.fixture
def greedy_crashes():
    name = "FeedbackrlTestGreedyCrashes-v0"
    gym.register(id=name, entry_point=_GreedyCrashes)
    yield name
    del gym.registry[name]


def test_the_multiplier_steps_on_the_greedy_probe_cost_not_the_sampled_one(tmp_path, greedy_crashes):
    import math

    import torch

    from feedbackrl.control.loop import load_checkpoint
    from feedbackrl.train.run import run

    def go(out, **probe):
        cfg = build_config({"algo": {"name": "control_ppo", "steps": 3, "minibatches": 2},
                            "control": {"env": greedy_crashes, "num_envs": 2, "rollout_steps": 16,
                                        "eval_episodes": 1, "cost": "collision"},
                            "train": {"threads": 1, "checkpoint_every": 1},
                            "constraint": {"threshold": 1.0, "init": 0.1, "lr": 1.0, "window": 6, **probe}})
        run(cfg, out)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r.get("phase") == "rl"]

    probed = go(tmp_path / "probed", probe_envs=2, probe_steps=5)
    # the greedy cost computed by hand: 1 per step while the policy that made the rollout prefers action 0 (the
    # untrained policy by its tie; after that, the checkpoint of the step before)
    greedy = [1.0]
    for step in (1, 2):
        policy, _ = load_checkpoint(tmp_path / "probed" / "checkpoints" / f"step_{step:06d}")
        greedy.append(float(int(policy.actor(torch.zeros(1, 4)).argmax(-1)) == 0))
    assert greedy == [1.0, 1.0, 1.0]  # the reward (weighted 1 against lambda 0.1) keeps action 0 the greedy one
    # J_C: the mean of the window's probe entries (2 environments per update, window 6: all three updates), each
    # the environment's greedy cost per step over its 5 steps
    want = [sum(greedy[:i + 1]) / (i + 1) for i in range(3)]
    assert [r["constraint/probe_cost"] for r in probed] == [1.0, 1.0, 1.0]
    assert [r["constraint/cost_window_mean"] for r in probed] == want == [1.0, 1.0, 1.0]
    # J_C = d: log lambda moves by lr * lambda * 0, lambda stays where it started
    assert [r["constraint/lambda"] for r in probed] == [math.exp(math.log(0.1))] * 3
    # the sampled rollout took action 1 too (cost per step under 1), which the multiplier did not see ...
    assert all(0.0 < r["cost/mean"] < 1.0 for r in probed)
    # ... and without probes it steps on exactly that: J_C is the window's mean of the rollout's per-environment
    # costs, under d, so lambda falls
    sampled = go(tmp_path / "sampled")
    assert sampled[0]["constraint/cost_window_mean"] == pytest.approx(sampled[0]["cost/mean"], abs=1e-7)
    assert sampled[0]["constraint/cost_window_mean"] < 1.0 and sampled[0]["constraint/lambda"] < 0.1
    assert "constraint/probe_cost" not in sampled[0]


def test_probe_environments_are_seeded_apart_from_the_held_out_ones():
    from feedbackrl.control.loop import HELDOUT_SEED_OFFSET, READING_SEED_OFFSET, probe_seeds

    assert probe_seeds(7, 3) == [30_007, 30_008, 30_009]
    for seed in (0, 10, 22):
        probes = set(probe_seeds(seed, 10_000))  # constraint.probe_envs is at most 10,000
        readings = {seed + READING_SEED_OFFSET + i for i in range(10_000)}  # benchmarks/policy_cost.py
        heldout = {seed + HELDOUT_SEED_OFFSET + i for i in range(10_000)}  # report.json, `feedbackrl eval`
        training = {seed + i for i in range(10_000)}
        assert len(probes) == 10_000 and not probes & readings and not probes & heldout and not probes & training
    assert READING_SEED_OFFSET == 50_000 and HELDOUT_SEED_OFFSET == 10_000


def test_a_pid_multiplier_steps_on_the_greedy_probe_cost(tmp_path, greedy_crashes):
    import torch

    from feedbackrl.control.loop import load_checkpoint
    from feedbackrl.train.checkpoint import load_extra
    from feedbackrl.train.constraint import CONSTRAINT_FILE
    from feedbackrl.train.run import run

    out = tmp_path / "pid"
    cfg = build_config({"algo": {"name": "control_ppo", "steps": 3, "minibatches": 2},
                        "control": {"env": greedy_crashes, "num_envs": 2, "rollout_steps": 16,
                                    "eval_episodes": 1, "cost": "collision"},
                        "train": {"threads": 1, "checkpoint_every": 1},
                        "constraint": {"threshold": 0.5, "multiplier": "pid", "kp": 0.25, "ki": 0.125, "init": 0.1,
                                       "window": 6, "probe_envs": 2, "probe_steps": 5}})
    run(cfg, out)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    # the greedy action is 0 (reward 1, crash 1) at every update: the untrained policy by its tie, then the
    # checkpoints of the steps before, lambda staying under 1 (the reward outweighs the cost in the combined
    # advantage); so each probe environment's greedy cost per step is 1 and J_C, their window's mean, is 1
    for step in (1, 2):
        policy, loaded = load_checkpoint(out / "checkpoints" / f"step_{step:06d}")
        assert int(policy.actor(torch.zeros(1, 4)).argmax(-1)) == 0
    assert loaded.constraint == cfg.constraint
    assert [r["constraint/probe_cost"] for r in rl] == [1.0, 1.0, 1.0]
    assert [r["constraint/cost_window_mean"] for r in rl] == [1.0, 1.0, 1.0]
    # by hand (Stooke et al.'s PID, kd = 0): violation 1 - 0.5 = 0.5 each update, integral 0.5, 1.0, 1.5,
    # lambda = 0.25 x 0.5 + 0.125 x integral (all exact in binary floating point)
    assert [r["constraint/violation"] for r in rl] == [0.5, 0.5, 0.5]
    assert [r["constraint/integral"] for r in rl] == [0.5, 1.0, 1.5]
    assert [r["constraint/lambda"] for r in rl] == [0.1875, 0.25, 0.3125]
    saved = load_extra(out / "checkpoints" / "step_000003", CONSTRAINT_FILE)
    assert saved["multiplier"] == "pid" and saved["state"]["lam"] == 0.3125
