"""`feedbackrl train` with `[control.assist]`: the recipe's config, what it refuses, and a tiny run that learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, build_config, load_config

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cartpole_assist.toml"


def _cfg(**assist):
    return {"algo": {"name": "control_ppo", "steps": 2}, "control": {"num_envs": 2, "rollout_steps": 64,
                                                                      "eval_episodes": 2, "assist": assist}}


def test_the_recipe_parses_with_its_settings():
    cfg = load_config(RECIPE)
    a = cfg.control.assist
    assert cfg.algo.name == "control_ppo" and cfg.algo.steps == 20 and cfg.control.env == "CartPole-v1"
    assert (a.demo_steps, a.demo_noise, a.bc_steps, a.takeover, a.takeover_bc_steps, a.takeover_penalty) == (
        80, 0.3, 300, True, 50, 1.0)
    # a PPO run without the section has none
    assert build_config({"algo": {"name": "control_ppo"}, "control": {}}).control.assist is None


@pytest.mark.parametrize(("extra", "match"), [
    ({"assist": {"demo_noise": 1.5}}, "demo_noise"),
    ({"assist": {"takeover_bc_stepz": 5}}, "takeover_bc_stepz"),
    ({"assist": {"demo_steps": -1}}, "demo_steps"),
    ({"assist": {}, "reward": "preferences"}, r"control.reward = 'preferences' is not supported"),
    ({"assist": {}, "cost": "cart_off_centre"}, "no cost value head"),
    ({"assist": {}, "env_options": {"max_episode_steps": 100}}, r"makes its environments without options.*remove "
                                                                r"control.env_options"),
    ({"assist": {"dagger_steps": 10}}, "dagger_steps is a setting of DAgger rounds"),
])
def test_malformed_assist_sections_are_refused(extra, match):
    raw = _cfg()
    raw["control"].update(extra)
    with pytest.raises(ConfigError, match=match):
        build_config(raw)


def test_a_constraint_or_eval_every_beside_it_is_refused():
    raw = _cfg()
    raw["control"]["cost"] = "cart_off_centre"
    with pytest.raises(ConfigError, match="no cost value head"):
        build_config({**raw, "constraint": {"threshold": 0.1}})
    with pytest.raises(ConfigError, match="remove eval.every"):
        build_config({**_cfg(), "eval": {"every": 1}})


def test_an_environment_without_an_expert_is_refused_before_any_work(tmp_path):
    from feedbackrl.train.run import run

    raw = _cfg()
    raw["control"]["env"] = "Acrobot-v1"
    with pytest.raises(ConfigError, match=r"needs a simulated expert for control.env = 'Acrobot-v1'; experts exist "
                                          r"for \['CartPole-v1'\]"):
        run(build_config(raw), tmp_path / "out")
    metrics = tmp_path / "out" / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text()  # nothing trained, nothing logged


def test_a_tiny_run_learns_logs_the_takeover_rate_and_saves_an_evaluable_checkpoint(tmp_path):
    from feedbackrl.control.loop import eval_checkpoint
    from feedbackrl.train.run import run

    out = tmp_path / "run"
    cfg = build_config({"algo": {"name": "control_ppo", "steps": 3},
                        "control": {"num_envs": 4, "rollout_steps": 64, "eval_episodes": 4, "assist": {}},
                        "train": {"seed": 0, "threads": 1}})
    report = run(cfg, out)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3]
    assert all(0 <= r["assist/takeover_rate"] <= 1 for r in rl)
    # the takeover labels are the running count of taken-over steps (4 x 64 steps per update)
    counts = [round(r["assist/takeover_rate"] * 256) for r in rl]
    assert [r["assist/takeover_labels"] for r in rl] == [float(sum(counts[:i + 1])) for i in range(3)]
    # an untrained network's greedy policy drops the pole within ~10 steps; 80 noisy demonstration steps and three
    # updates with takeovers keep it up for far longer
    before, after = report["control_eval_before"]["eval/return"], report["control_eval_after"]["eval/return"]
    assert before < 50 and after > 3 * before + 50, (before, after)
    assert report["assist"]["demo_steps"] == 80
    # `feedbackrl eval` reads the checkpoint: the same greedy held-out return as the run's last evaluation
    ev = eval_checkpoint(out / "checkpoints" / "step_000003")
    assert ev["eval/return"] == pytest.approx(after)


def test_resume_is_refused(tmp_path):
    from feedbackrl.train.run import run

    cfg = build_config({"algo": {"name": "control_ppo", "steps": 1},
                        "control": {"num_envs": 2, "rollout_steps": 32, "eval_episodes": 1,
                                    "assist": {"demo_steps": 16, "bc_steps": 5}}, "train": {"threads": 1}})
    run(cfg, tmp_path / "a")
    with pytest.raises(ConfigError, match="cannot continue from a checkpoint"):
        run(cfg, tmp_path / "b", resume=tmp_path / "a")
