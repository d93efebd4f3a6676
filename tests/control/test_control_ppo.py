"""PPO on CartPole through the run path: it learns, resumes bit for bit, and refuses malformed recipes."""

import json

import pytest
import torch

from feedbackrl.config import ConfigError, build_config
from feedbackrl.train.run import run

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")


def _cfg(steps: int = 20, **control):
    return build_config({"algo": {"name": "control_ppo", "steps": steps},
                         "control": {"env": "CartPole-v1", "num_envs": 4, "rollout_steps": 128, **control},
                         "train": {"threads": 1}})


def test_short_cartpole_run_raises_the_true_return(tmp_path):
    # 20 updates of 4 x 128 steps (10,240 environment steps), seed 0: the greedy held-out return of the random
    # initial policy is about 9 (the pole falls at once); PPO must at least triple it
    report = run(_cfg(), tmp_path)
    before, after = report["control_eval_before"]["eval/return"], report["control_eval_after"]["eval/return"]
    assert after >= 3 * before and after - before >= 50, f"greedy return {before:.1f} -> {after:.1f}"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    assert [r["env_steps"] for r in rl] == [512 * i for i in range(1, 21)]
    assert (tmp_path / "curves.png").is_file() and json.loads((tmp_path / "report.json").read_text())["algo"] == \
        "control_ppo"


def _final_state(run_dir):
    return torch.load(sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "trainer_state.pt", weights_only=False)


def test_resume_is_bit_exact(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run(_cfg(steps=4), full)
    run(build_config({**_cfg(steps=4).model_dump(), "train": {"threads": 1, "checkpoint_every": 2}}), part)
    # continue from step 2 (not the last checkpoint) into a fresh dir
    resumed = tmp_path / "resumed"
    run(_cfg(steps=4), resumed, resume=part / "checkpoints" / "step_000002")
    a, b = _final_state(full), _final_state(resumed)
    assert a["step"] == b["step"] == 4
    for name, tensor in a["policy"].items():
        assert torch.equal(tensor, b["policy"][name]), name
    assert torch.equal(a["generator"], b["generator"])
    assert (a["collector"]["obs"] == b["collector"]["obs"]).all()
    for key, state in a["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg_sq"], b["optimizer"]["state"][key]["exp_avg_sq"])


def test_continuous_actions_run_on_pendulum(tmp_path):
    cfg = build_config({"algo": {"name": "control_ppo", "steps": 2, "minibatches": 2},
                        "control": {"env": "Pendulum-v1", "num_envs": 2, "rollout_steps": 64, "eval_episodes": 2},
                        "train": {"threads": 1}})
    report = run(cfg, tmp_path)
    # Pendulum's episodes are 200 steps, every reward in [-16.3, 0]
    assert report["control_eval_after"]["eval/length"] == 200
    assert -16.3 * 200 <= report["control_eval_after"]["eval/return"] < 0


@pytest.mark.parametrize(("data", "message"), [
    ({"algo": {"name": "control_ppo"}}, "give both or neither"),
    ({"control": {"env": "CartPole-v1"}}, "give both or neither"),
    ({"algo": {"name": "control_ppo", "minibatches": 3}, "control": {"num_envs": 2, "rollout_steps": 8}},
     "must divide control.num_envs"),
    ({"algo": {"name": "control_ppo"}, "control": {}, "constraint": {"threshold": 0.1}}, "set control.cost"),
    ({"algo": {"name": "control_ppo"}, "control": {"num_envs": 0}}, "control.num_envs"),
    ({"algo": {"name": "control_ppo"}, "control": {"reward": "preferences", "rollout_steps": 16,
                                                   "preferences": {"segment_len": 32}}}, "longer than a rollout"),
])
def test_malformed_control_recipes_are_refused(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data)


def test_unknown_env_and_cost_are_named(tmp_path):
    with pytest.raises(ConfigError, match="'NoSuchEnv-v0' is not a registered gymnasium environment"):
        run(build_config({"algo": {"name": "control_ppo", "steps": 1}, "control": {"env": "NoSuchEnv-v0"},
                          "train": {"threads": 1}}), tmp_path)
    with pytest.raises(ConfigError, match="control.cost = 'wobble' is not a known cost"):
        run(build_config({"algo": {"name": "control_ppo", "steps": 1}, "control": {"cost": "wobble"},
                          "train": {"threads": 1}}), tmp_path)
