"""The algorithm section is a union on `algo.name`; errors still name the field the user wrote,
and the run path dispatches on the name through one registry."""

from pathlib import Path

import pytest

from feedbackrl.config import (
    ConfigError,
    DPOConfig,
    GRPOConfig,
    PPOConfig,
    RewardModelConfig,
    RLOOConfig,
    build_config,
    load_config,
)

RECIPES = Path(__file__).parent.parent / "recipes"


@pytest.mark.parametrize("name, cls", [("grpo", GRPOConfig), ("rloo", RLOOConfig), ("ppo", PPOConfig),
                                       ("dpo", DPOConfig), ("reward_model", RewardModelConfig)])
def test_name_picks_the_section_class(name, cls):
    cfg = build_config({"algo": {"name": name}})
    assert type(cfg.algo) is cls and cfg.algo.name == name


def test_an_algo_section_without_a_name_is_grpo_with_unchanged_defaults():
    cfg = build_config({"algo": {"steps": 7}})
    assert type(cfg.algo) is GRPOConfig
    assert cfg.algo.model_dump() == {
        "name": "grpo", "steps": 7, "lr": 2e-4, "weight_decay": 0.0, "max_grad_norm": 1.0, "epochs": 1,
        "minibatches": 1, "clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0, "scale_advantages": True,
        "aggregation": "token_mean"}
    assert build_config({}).algo == GRPOConfig()


def test_rloo_is_the_grpo_loop_without_std_scaling_by_default():
    cfg = build_config({"algo": {"name": "rloo"}})
    assert cfg.algo.scale_advantages is False and cfg.algo.clip_low == GRPOConfig().clip_low


@pytest.mark.parametrize("data, line", [
    pytest.param({"algo": {"name": "dpo", "beta": 0}}, "algo.beta: Input should be greater than 0 (got 0)",
                 id="range-inside-the-union"),
    pytest.param({"algo": {"name": "ppo", "clip_low": 0.1}}, "algo.clip_low: unknown key", id="grpo-key-under-ppo"),
    pytest.param({"algo": {"name": "dpo", "loss": "kto"}}, "algo.loss: Input should be 'dpo', 'ipo' or 'pro'",
                 id="literal"),
    pytest.param({"algo": {"name": "sac"}}, "algo.name: unknown algorithm 'sac'; choose one of ('grpo', 'rloo', "
                 "'ppo', 'dpo', 'reward_model', 'online_reward_model', 'sft', 'control_ppo')", id="unknown-name"),
    pytest.param({"reward": {"modle": "x"}}, "reward.modle: unknown key", id="reward-typo"),
    pytest.param({"prefs": {"temperature": -1}}, "prefs.temperature: Input should be greater than or equal to 0",
                 id="prefs-range"),
])
def test_errors_name_the_field(data, line):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert line in str(err.value)


@pytest.mark.parametrize("data, message", [
    pytest.param({"algo": {"name": "dpo", "batch_size": 10, "grad_accum": 4}},
                 "algo.grad_accum=4 must divide algo.batch_size=10", id="accumulation"),
    pytest.param({"algo": {"name": "dpo", "loss": "pro"}}, "algo.loss='pro' needs prefs.responses > 2", id="pro-pairs"),
    pytest.param({"algo": {"name": "dpo"}, "prefs": {"responses": 3}}, "algo.loss='dpo' needs prefs.responses = 2",
                 id="dpo-rankings"),
    pytest.param({"algo": {"name": "reward_model"}, "prefs": {"responses": 4}}, "prefs.responses must be 2",
                 id="rm-pairs"),
    pytest.param({"algo": {"name": "dpo"}, "reward": {"model": "runs/rm/reward_model"}},
                 "[reward] is the reward of online RL", id="reward-unused"),
    pytest.param({"algo": {"name": "rloo"}, "rollout": {"group_size": 1}}, "group_size must be >= 2 for rloo",
                 id="rloo-group"),
    pytest.param({"algo": {"name": "ppo", "minibatches": 3}, "rollout": {"prompts_per_step": 2, "group_size": 2}},
                 "algo.minibatches=3 must divide prompts_per_step*group_size=4", id="ppo-minibatches"),
])
def test_cross_field_errors(data, message):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert message in str(err.value) and "{" not in str(err.value)


def test_dotted_override_switches_the_algorithm():
    cfg = load_config(RECIPES / "dpo.toml", ["algo.loss=ipo", "algo.beta=0.5"])
    assert cfg.algo.name == "dpo" and cfg.algo.loss == "ipo" and cfg.algo.beta == 0.5


@pytest.mark.parametrize("recipe, name", [("reward_model.toml", "reward_model"), ("dpo.toml", "dpo"),
                                          ("ppo.toml", "ppo"), ("rloo.toml", "rloo")])
def test_preference_recipes_load(recipe, name):
    cfg = load_config(RECIPES / recipe)
    assert cfg.algo.name == name and cfg.task.name == "reverse"
    if name in ("ppo", "rloo"):
        assert cfg.reward.model and cfg.model.path != "tiny" and cfg.sft.steps == 0  # from a reward_model run


def test_every_algorithm_in_the_config_has_one_registry_entry():
    from feedbackrl.config import ALGO_NAMES
    from feedbackrl.train.run import ALGORITHMS

    assert sorted(ALGORITHMS) == sorted(ALGO_NAMES)


@pytest.mark.parametrize("data, name", [
    ({"algo": {"name": "grpo"}}, "grpo"),
    ({"algo": {"name": "rloo"}, "reward": {"model": "rm"}}, "rloo"),
    ({"algo": {"name": "ppo"}}, "ppo"),
    ({"algo": {"name": "dpo"}}, "dpo"),
    ({"algo": {"name": "reward_model"}}, "reward_model"),
    ({"algo": {"name": "online_reward_model"}}, "online_reward_model"),
    ({"algo": {"name": "sft"}, "sft": {"steps": 1}}, "sft"),
])
def test_the_run_path_dispatches_on_the_algorithm(monkeypatch, tmp_path, data, name):
    """One path for every algorithm: the registry entry named by algo.name is what runs."""
    from dataclasses import replace

    from feedbackrl.train import run as run_path

    class Stop(Exception):
        pass

    def called(run):
        raise Stop(run.cfg.algo.name)

    for key, entry in run_path.ALGORITHMS.items():
        monkeypatch.setitem(run_path.ALGORITHMS, key, replace(entry, train=called))
    monkeypatch.setattr(run_path, "training_reward", lambda cfg, task: task.verify_batch)  # no reward model on disk
    cfg = build_config({"task": {"name": "reverse", "heldout_size": 2}, "train": {"threads": 1}, **data})
    with pytest.raises(Stop) as e:
        run_path.run(cfg, tmp_path)
    assert str(e.value) == name


def test_the_final_eval_is_logged_at_the_algorithms_last_step(tmp_path):
    """An SFT warm start longer than the RL run must not move the final eval to its own last step."""
    from feedbackrl.data.rows import read_jsonl
    from feedbackrl.train.run import run

    cfg = build_config({"task": {"name": "reverse", "heldout_size": 2}, "sft": {"steps": 5, "batch_size": 4},
                        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
                        "algo": {"steps": 2}, "eval": {"pass_k": 1}, "train": {"threads": 1}})
    run(cfg, tmp_path)
    evals = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("phase") == "eval"]
    assert evals == [0, 2]
