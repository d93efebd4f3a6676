"""The cost signal and the Lagrangian on a control run."""

import json

import numpy as np
import pytest

from feedbackrl.config import build_config
from feedbackrl.control.envs import cart_off_centre

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")


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
