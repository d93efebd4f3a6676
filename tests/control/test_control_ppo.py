"""PPO on CartPole through the run path: it learns, resumes bit for bit, and refuses malformed recipes."""

import json
import pickle

import pytest
import torch

from feedbackrl.config import ConfigError, build_config
from feedbackrl.train.checkpoint import MODULE_FILE, latest_checkpoint, load_extra, load_trainer_state
from feedbackrl.train.constraint import CONSTRAINT_FILE
from feedbackrl.train.run import run

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")


def _data(steps: int = 20, **control):
    return {"algo": {"name": "control_ppo", "steps": steps},
            "control": {"env": "CartPole-v1", "num_envs": 4, "rollout_steps": 128, **control},
            "train": {"threads": 1}}


def _cfg(steps: int = 20, **control):
    return build_config(_data(steps, **control))


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


def _final(run_dir):
    """The last checkpoint of a run: (its dir, its trainer state with the control loop's RNG streams)."""
    ckpt = latest_checkpoint(run_dir)
    loop_state = load_trainer_state(ckpt).loop_state
    names = ["generator"] + (["learner_generator"] if "learner" in loop_state else []) + \
        (["probe_generator"] if "probe_collector" in loop_state else [])
    return ckpt, load_trainer_state(ckpt, names)


RESUMABLE = {
    "env_reward": {},
    "preferences": {"control": {"reward": "preferences",
                                "preferences": {"segment_len": 16, "labels": 24, "rounds": 3, "epochs": 5}}},
    "lagrangian": {"control": {"cost": "cart_off_centre"}, "constraint": {"threshold": 0.01, "window": 8}},
    # the multiplier on the greedy cost of probe environments of its own, whose episodes go on across updates
    "lagrangian_greedy_probe": {"control": {"cost": "cart_off_centre"},
                                "constraint": {"threshold": 0.01, "window": 8, "probe_envs": 2, "probe_steps": 48}},
}


@pytest.mark.parametrize("extra", RESUMABLE.values(), ids=RESUMABLE.keys())
def test_resume_is_bit_exact(tmp_path, extra):
    def cfg(**train):
        data = _data(steps=4)
        data["control"].update(extra.get("control", {}))
        data["train"].update(train)
        return build_config({**data, **{k: v for k, v in extra.items() if k != "control"}})

    full, part = tmp_path / "full", tmp_path / "part"
    run(cfg(), full)
    run(cfg(checkpoint_every=2), part)
    # continue from step 2 (not the last checkpoint) into a fresh dir
    resumed = tmp_path / "resumed"
    run(cfg(), resumed, resume=part / "checkpoints" / "step_000002")
    (ckpt_a, a), (ckpt_b, b) = _final(full), _final(resumed)
    assert a.step == b.step == 4
    # the policy's file, the checkpoint writer's files and streams: as the text loop's (train/checkpoint.py)
    want, got = (torch.load(c / MODULE_FILE, weights_only=True) for c in (ckpt_a, ckpt_b))
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name
    assert torch.equal(a.torch_rng, b.torch_rng) and a.rngs.keys() == b.rngs.keys()
    for name in a.rngs:
        assert torch.equal(a.rngs[name], b.rngs[name]), name
    assert (a.loop_state["collector"]["obs"] == b.loop_state["collector"]["obs"]).all()
    for key, state in a.optimizer["state"].items():
        assert torch.equal(state["exp_avg_sq"], b.optimizer["state"][key]["exp_avg_sq"])
    if "learner" in a.loop_state:
        la, lb = a.loop_state["learner"], b.loop_state["learner"]
        assert la["asked"] == lb["asked"] == 24
        assert torch.equal(la["labels"], lb["labels"])
        for name, tensor in la["model"].items():
            assert torch.equal(tensor, lb["model"][name]), name
    if "probe_envs" in extra.get("constraint", {}):  # the probe environments mid-episode, and their stream
        pa, pb = a.loop_state["probe_collector"], b.loop_state["probe_collector"]
        ea, eb = pickle.loads(pa["envs"]), pickle.loads(pb["envs"])
        for x, y in zip(ea, eb, strict=True):  # each CartPole's physical state and its random stream
            assert x.unwrapped.state.tolist() == y.unwrapped.state.tolist()
            assert x.unwrapped.np_random.bit_generator.state == y.unwrapped.np_random.bit_generator.state
        assert (pa["obs"] == pb["obs"]).all()
        assert all((pa[k] == pb[k]).all() for k in ("ep_return", "ep_len", "ep_cost"))
        assert torch.equal(a.rngs["probe_generator"], b.rngs["probe_generator"])
    else:
        assert "probe_collector" not in a.loop_state and "probe_generator" not in a.rngs
    if "constraint" in extra:
        assert load_extra(ckpt_a, CONSTRAINT_FILE) == load_extra(ckpt_b, CONSTRAINT_FILE)
    else:
        assert not (ckpt_a / CONSTRAINT_FILE).exists()
    # every logged value of the resumed steps (timings aside), the last training episodes' means included
    metrics = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (full, resumed)]
    for step in (3, 4):
        rows = [{k: v for k, v in r.items() if not k.startswith("perf/")} for m in metrics for r in m
                if r.get("phase") == "rl" and r["step"] == step]
        assert rows[0] == rows[1], step


def test_a_checkpoint_with_the_policy_in_the_trainer_state_still_evaluates(tmp_path):
    # control checkpoints written before policy.pt kept the weights in trainer_state.pt: `feedbackrl eval` and
    # benchmarks/policy_cost.py read them still
    from feedbackrl.control.loop import load_checkpoint

    run(_cfg(steps=1), tmp_path)
    ckpt = latest_checkpoint(tmp_path)
    want = torch.load(ckpt / MODULE_FILE, weights_only=True)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    torch.save({**state, "policy": want}, ckpt / "trainer_state.pt")
    (ckpt / MODULE_FILE).unlink()
    policy, _ = load_checkpoint(ckpt)
    assert all(torch.equal(t, want[k]) for k, t in policy.state_dict().items())


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
    ({"algo": {"name": "control_ppo"}, "control": {"cost": "collision"},
      "constraint": {"threshold": 0.1, "window": 8, "probe_envs": 3, "probe_steps": 4}},
     "constraint.window = 8 must be a multiple of constraint.probe_envs = 3"),
    ({"algo": {"name": "control_ppo"}, "control": {"cost": "collision"},
      "constraint": {"threshold": 0.1, "probe_envs": 4}}, "probe_envs = 4 needs constraint.probe_steps >= 1"),
    ({"algo": {"name": "control_ppo"}, "control": {"cost": "collision"},
      "constraint": {"threshold": 0.1, "probe_steps": 32}}, "constraint.probe_envs = 0 makes none"),
    ({"algo": {"name": "control_ppo"}, "control": {"cost": "collision"},
      "constraint": {"threshold": 0.1, "probe_envs": 10_001, "probe_steps": 1}},
     "constraint.probe_envs: Input should be less than or equal to 10000"),
    ({"algo": {"name": "control_ppo"}, "control": {}, "cost": {"source": "regex", "pattern": "a"}},
     "a control run's cost is control.cost"),
    ({"algo": {"name": "control_ppo"}, "control": {}, "eval": {"every": 5, "pass_k": 2}}, "eval.pass_k is a setting"),
    ({"algo": {"name": "control_ppo"}, "control": {}, "sft": {"steps": 3}, "online": {"labels": 5}},
     r"\[sft\] is a section of language-model runs.*remove \[sft\], \[online\]"),
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


def test_without_gymnasium_the_run_names_the_extra(monkeypatch, tmp_path):
    import sys

    for name in [m for m in sys.modules if m.startswith("feedbackrl.control")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium -> ModuleNotFoundError
    with pytest.raises(ConfigError, match=r"needs gymnasium: pip install 'feedbackrl\[control\]'"):
        run(_cfg(steps=1), tmp_path)


def test_the_learning_rate_anneals_towards_lr_final_with_hand_computed_values():
    from feedbackrl.control.rollout import annealed_lr

    # lr 0.5 over 4 updates: to 0 (the default), halfway (0.5 x lr at update 5), constant
    assert [annealed_lr(0.5, u, 4) for u in (1, 2, 3, 4)] == [0.5, 0.375, 0.25, 0.125]
    assert [annealed_lr(0.5, u, 4, 0.5) for u in (1, 2, 3, 4)] == [0.5, 0.4375, 0.375, 0.3125]
    assert [annealed_lr(0.5, u, 4, 1.0) for u in (1, 2, 3, 4)] == [0.5] * 4
    # lr_final = 0 is CleanRL's expression bit for bit, so runs without the field are unchanged
    for lr, steps in ((2.5e-4, 50), (5e-4, 80), (3e-4, 7)):
        assert [annealed_lr(lr, u, steps, 0.0) for u in range(1, steps + 1)] == \
            [lr * (1.0 - (u - 1) / steps) for u in range(1, steps + 1)]


@pytest.mark.parametrize("final", [0.0, 0.25])
def test_the_loop_trains_each_update_at_the_annealed_rate(monkeypatch, tmp_path, final):
    import feedbackrl.control.loop as loop

    seen, update = [], loop.ppo_update

    def spy(policy, optimizer, *args):
        seen.append([g["lr"] for g in optimizer.param_groups])
        return update(policy, optimizer, *args)

    monkeypatch.setattr(loop, "ppo_update", spy)
    data = _data(steps=4, num_envs=2, rollout_steps=16, eval_episodes=1)
    data["algo"].update(lr=0.001, **({"lr_final": final} if final else {}))
    run(build_config(data), tmp_path)
    # lr x (1 - (1 - final) (u - 1) / 4) for u = 1..4, computed by hand
    want = {0.0: [0.001, 0.00075, 0.0005, 0.00025], 0.25: [0.001, 0.0008125, 0.000625, 0.0004375]}[final]
    assert [lrs[0] for lrs in seen] == pytest.approx(want, rel=1e-12, abs=0)


@pytest.mark.parametrize(("value", "message"), [(-0.1, "greater than or equal to 0"), (1.5, "less than or equal to 1"),
                                                (float("nan"), "finite number")])
def test_lr_final_out_of_range_is_refused(value, message):
    with pytest.raises(ConfigError, match=f"algo.lr_final.*{message}"):
        build_config({"algo": {"name": "control_ppo", "lr_final": value}, "control": {}})
