from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, RunConfig, apply_overrides, build_config, load_config, parse_override


def test_defaults_are_a_valid_run():
    assert load_config() == RunConfig()


def test_shipped_demo_recipe_loads():
    from feedbackrl.cli import demo_recipe_path

    cfg = load_config(demo_recipe_path())
    assert cfg.task.name == "reverse" and cfg.task.options["demo_noise"] == 0.6
    assert cfg.sft.steps > 0 and cfg.algo.steps > 0  # the demo warm-starts, then runs RL


@pytest.mark.parametrize("data, dotted", [
    pytest.param({"algo": {"lrr": 1e-3}}, "algo.lrr", id="typo-in-section"),
    pytest.param({"modle": {"path": "x"}}, "modle", id="typo-section"),
    pytest.param({"task": {"name": "addition", "heldout": 5}}, "task.heldout", id="near-miss"),
])
def test_unknown_key_is_rejected_naming_the_dotted_field(data, dotted):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert f"{dotted}: unknown key" in str(err.value)


@pytest.mark.parametrize("data, field, value, limit", [
    pytest.param({"rollout": {"temperature": 0}}, "rollout.temperature", "0", "greater than 0", id="gt"),
    pytest.param({"rollout": {"max_new_tokens": 5000}}, "rollout.max_new_tokens", "5000",
                 "less than or equal to 4096", id="le"),
    pytest.param({"algo": {"epochs": 0}}, "algo.epochs", "0", "greater than or equal to 1", id="ge"),
    pytest.param({"algo": {"aggregation": "mean"}}, "algo.aggregation", "'mean'", "'token_mean'", id="literal"),
    pytest.param({"rollout": {"group_size": "abc"}}, "rollout.group_size", "'abc'", "valid integer", id="type"),
])
def test_bad_value_names_field_value_and_limit(data, field, value, limit):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    line = next(x for x in str(err.value).splitlines() if x.strip().startswith(field))
    assert f"(got {value})" in line and limit in line


def test_every_bad_field_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        build_config({"algo": {"lr": -1, "lrr": 2}, "rollout": {"top_p": 2}})
    text = str(err.value)
    assert "algo.lr:" in text and "algo.lrr:" in text and "rollout.top_p:" in text


def test_minibatches_must_divide_the_batch():
    # B*G = 3*2 = 6: 4 minibatches do not divide it, 3 do.
    with pytest.raises(ConfigError) as err:
        build_config({"rollout": {"prompts_per_step": 3, "group_size": 2}, "algo": {"minibatches": 4}})
    assert "algo.minibatches=4 must divide prompts_per_step*group_size=6" in str(err.value)
    assert "{" not in str(err.value)  # names the fields, does not dump the whole recipe
    ok = build_config({"rollout": {"prompts_per_step": 3, "group_size": 2}, "algo": {"minibatches": 3}})
    assert ok.algo.minibatches == 3


def test_group_of_one_needs_unscaled_advantages():
    with pytest.raises(ConfigError, match="rollout.group_size must be >= 2"):
        build_config({"rollout": {"group_size": 1}, "algo": {"minibatches": 1}})
    assert build_config({"rollout": {"group_size": 1}, "algo": {"scale_advantages": False}}).rollout.group_size == 1


def test_assignment_is_validated_too():
    cfg = RunConfig()
    with pytest.raises(ValueError, match="temperature"):
        cfg.rollout.temperature = -1.0


@pytest.mark.parametrize("item, keys, value", [
    pytest.param("algo.lr=3e-4", ["algo", "lr"], 3e-4, id="float"),
    pytest.param("algo.steps=5", ["algo", "steps"], 5, id="int"),
    pytest.param("train.seed=-3", ["train", "seed"], -3, id="negative-int"),
    pytest.param("algo.scale_advantages=false", ["algo", "scale_advantages"], False, id="bool"),
    pytest.param("task.name=addition", ["task", "name"], "addition", id="bare-string"),
    pytest.param('task.name="dataset"', ["task", "name"], "dataset", id="quoted-string"),
    pytest.param("model.path=runs/x/base_model", ["model", "path"], "runs/x/base_model", id="path"),
    pytest.param("model.path=a=b", ["model", "path"], "a=b", id="equals-in-value"),
    pytest.param("task.options.digits=3", ["task", "options", "digits"], 3, id="nested"),
    pytest.param("task.options={digits = 3, reverse = true}", ["task", "options"], {"digits": 3, "reverse": True},
                 id="inline-table"),
])
def test_parse_override(item, keys, value):
    got_keys, got = parse_override(item)
    assert got_keys == keys
    assert got == value and type(got) is type(value)


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("algo.lr")


def test_overrides_beat_the_recipe_and_create_nested_sections(tmp_path: Path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[algo]\nlr = 1e-3\nsteps = 7\n[task]\nname = "addition"\n')
    cfg = load_config(recipe, ["algo.lr=5e-4", "task.options.digits=3", "rollout.temperature=0.5"])
    assert cfg.algo.lr == 5e-4 and cfg.algo.steps == 7
    assert cfg.task.options == {"digits": 3}
    assert cfg.rollout.temperature == 0.5


def test_override_through_a_value_is_an_error():
    with pytest.raises(ConfigError, match="'lr' is a value, not a section"):
        apply_overrides({"algo": {"lr": 1e-3}}, ["algo.lr.x=1"])


def test_override_errors_name_the_field(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.group_size=many"])
    assert "rollout.group_size" in str(err.value) and "'many'" in str(err.value)


def test_bad_toml_names_the_file(tmp_path: Path):
    recipe = tmp_path / "broken.toml"
    recipe.write_text("[algo\nlr = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(recipe)
    assert str(recipe) in str(err.value) and "not valid TOML" in str(err.value)


def test_missing_recipe_names_the_path(tmp_path: Path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as err:
        load_config(missing)
    assert str(missing) in str(err.value) and "does not exist" in str(err.value)


def test_errors_name_the_recipe_they_came_from(tmp_path: Path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[algo]\nlrr = 1\n")
    with pytest.raises(ConfigError, match=f"invalid configuration \\({recipe}\\)"):
        load_config(recipe)


def test_min_new_tokens_cannot_exceed_max_new_tokens():
    with pytest.raises(ConfigError) as err:
        build_config({"rollout": {"min_new_tokens": 9, "max_new_tokens": 8}})
    assert "min_new_tokens=9 must be <= max_new_tokens=8" in str(err.value)
    assert build_config({"rollout": {"min_new_tokens": 8, "max_new_tokens": 8}}).rollout.min_new_tokens == 8


def test_a_rollback_needs_the_optimizer_state_in_checkpoints():
    # the rollback restores the last checkpoint's optimizer state: without it the run would fail at its first one
    rollback = {"monitors": {"detectors": ["zero_variance"], "actions": {"zero_variance": "rollback"}}}
    with pytest.raises(ConfigError, match=r"monitors\.actions: zero_variance = 'rollback' restores the optimizer state "
                                          r".* set train\.save_optimizer = true"):
        build_config({**rollback, "train": {"save_optimizer": False}})
    assert build_config(rollback).train.save_optimizer  # with it, or with another action, or the monitors off
    build_config({"monitors": {"actions": {"zero_variance": "stop"}}, "train": {"save_optimizer": False}})
    build_config({"monitors": {**rollback["monitors"], "enabled": False}, "train": {"save_optimizer": False}})
