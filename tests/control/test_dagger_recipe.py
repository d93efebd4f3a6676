"""`feedbackrl train` with `[control.assist] mode = "dagger"`: the recipe's settings, what it refuses, and short
runs that learn, count their labels exactly and are `assist.dagger` itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, build_config, load_config

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cartpole_dagger.toml"


def _raw(rounds: int = 3, algo: dict | None = None, **assist):
    return {"algo": {"name": "control_ppo", "steps": rounds, **(algo or {})},
            "control": {"num_envs": 4, "rollout_steps": 64, "eval_episodes": 4,
                        "assist": {"mode": "dagger", **assist}},
            "train": {"seed": 0, "threads": 1}}


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_recipe_parses_with_the_benchmarks_settings():
    from feedbackrl.control.assist import AssistConfig, assist_config

    cfg = load_config(RECIPE)
    s = cfg.control.assist
    assert (s.mode, s.demo_steps, s.demo_noise, s.bc_steps, s.bc_lr, s.dagger_steps) == ("dagger", 80, 0.3, 300,
                                                                                          1e-3, 50)
    # the benchmark's bc_dagger arm: AssistConfig(updates=20) with its defaults
    assert assist_config(cfg) == AssistConfig(updates=20, ppo=cfg.algo)
    assert build_config({"algo": {"name": "control_ppo"}, "control": {"assist": {}}}).control.assist.mode == "takeover"


@pytest.mark.parametrize(("assist", "algo", "control", "match"), [
    ({"takeover_penalty": 0.5}, {}, {}, r"control.assist.takeover_penalty is a setting of the takeover mode; mode = "
                                        r"'dagger' has no takeovers .*remove control.assist.takeover_penalty"),
    ({"takeover": False, "takeover_bc_steps": 5}, {}, {},
     r"remove control.assist.takeover, control.assist.takeover_bc_steps"),
    ({"mode": "takeover", "dagger_steps": 10}, {}, {}, r"dagger_steps is a setting of DAgger rounds: set "
                                                       r"control.assist.mode = 'dagger', or remove it"),
    ({"dagger_steps": 0}, {}, {}, r"control.assist.dagger_steps.*greater than or equal to 1"),
    ({"mode": "daggr"}, {}, {}, r"control.assist.mode.*'takeover' or 'dagger'"),
    ({}, {"lr": 1e-3, "epochs": 2}, {}, r"algo.epochs is a PPO setting; control.assist.mode = 'dagger' trains by "
                                        r"behaviour cloning only .*remove algo.epochs, algo.lr"),
    ({}, {"lr_final": 0.5}, {}, r"algo.lr_final is a PPO setting"),
    ({}, {}, {"env_options": {"max_episode_steps": 100}}, r"remove control.env_options"),
])
def test_malformed_dagger_sections_are_refused(assist, algo, control, match):
    raw = _raw(algo=algo, **assist)
    raw["control"].update(control)
    with pytest.raises(ConfigError, match=match):
        build_config(raw)


def test_dagger_needs_no_minibatch_split_of_the_rollout():
    # 3 x 10 steps do not split into PPO's 4 minibatches, which a DAgger round never forms
    raw = _raw()
    raw["control"].update(num_envs=3, rollout_steps=10)
    assert build_config(raw).control.assist.mode == "dagger"
    raw["control"]["assist"] = {}
    with pytest.raises(ConfigError, match="must divide control.num_envs"):
        build_config(raw)


@pytest.mark.parametrize(("demo_steps", "before_max", "after_min"), [(80, None, 300.0), (0, 50.0, 100.0)],
                         ids=["from_bc", "from_untrained"])
def test_a_short_run_learns_counts_its_labels_and_saves_an_evaluable_checkpoint(tmp_path, demo_steps, before_max,
                                                                                  after_min):
    from feedbackrl.control.loop import eval_checkpoint
    from feedbackrl.train.run import run

    out = tmp_path / "run"
    report = run(build_config(_raw(demo_steps=demo_steps)), out)
    rows = _rows(out)
    rl = [r for r in rows if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3] and [r["env_steps"] for r in rl] == [256, 512, 768]
    # every visited state is labelled: the demonstrations, then 4 x 64 states a round
    assert [r["dagger/labels"] for r in rl] == [demo_steps + 256 * u for u in (1, 2, 3)]
    assert report["assist"] == {"mode": "dagger", "demo_steps": demo_steps, "rounds": 3, "dagger_labels": 768,
                                "labels": demo_steps + 768}
    assert [r["phase"] for r in rows[:2]] == (["eval", "bc"] if demo_steps else ["eval", "rl"])
    start = report["control_eval_bc"]["eval/return"]  # the BC warm start, or the untrained net without demos
    after = report["control_eval_after"]["eval/return"]
    if before_max is not None:  # an untrained network's greedy policy drops the pole within ~10 steps
        assert report["control_eval_before"]["eval/return"] < before_max and start < before_max
    # three rounds of 256 labelled states raise the greedy return far past its start
    assert after >= after_min and after >= start + 100, (start, after)
    ev = eval_checkpoint(out / "checkpoints" / "step_000003")
    assert ev["eval/return"] == pytest.approx(after)


def test_the_recipe_path_is_assist_dagger_itself(tmp_path):
    # the same functions with the same settings and random streams: the same labels and evaluations to every digit
    from feedbackrl.control.assist import assist_config, behaviour_clone, dagger, demonstrations, new_policy
    from feedbackrl.train.run import run

    cfg = build_config(_raw(rounds=2))
    run(cfg, tmp_path / "run")
    rl = [r for r in _rows(tmp_path / "run") if r.get("phase") == "rl"]
    a = assist_config(cfg)
    obs, actions = demonstrations(a, 0)
    warm = new_policy(a, 0)
    behaviour_clone(warm, obs, actions, a.bc_steps, a.bc_lr)
    direct = dagger(copy.deepcopy(warm), a, 0, obs, actions)[1:]
    keys = ("dagger/labels", "dagger/disagreement", "bc/nll", "eval/return", "eval/success")
    assert [[r[k] for k in keys] for r in rl] == [[r[k] for k in keys] for r in direct]


def test_feedbackrl_eval_writes_a_clip_of_a_dagger_run(tmp_path):
    from typer.testing import CliRunner

    from feedbackrl.cli import app
    from feedbackrl.train.run import run

    pytest.importorskip("imageio.v3", reason="the control extra installs imageio")
    out = tmp_path / "run"
    report = run(build_config(_raw(rounds=1)), out)
    result = CliRunner().invoke(app, ["eval", str(out), "--video", str(tmp_path / "clip.gif"), "--max-steps", "30"])
    assert result.exit_code == 0, result.output
    ev = json.loads(result.stdout[result.stdout.index("{"):])
    assert ev["eval/return"] == pytest.approx(report["control_eval_after"]["eval/return"])
    assert ev["video"]["frames"] == ev["video"]["episode/length"] + 1 <= 31 and (tmp_path / "clip.gif").stat().st_size
