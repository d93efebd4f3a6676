"""[cost], [constraint] and [release]: every field acts or is refused, with the field and the fix named."""

import pytest

from feedbackrl.config import ConfigError, build_config

COST = {"source": "regex", "pattern": "a", "mode": "search"}


def run(**sections):
    return build_config({"algo": {"name": "grpo"}, **sections})


def refused(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        run(**sections)
    return str(err.value)


def test_a_constrained_recipe_loads_with_the_reference_trainers_defaults():
    cfg = run(cost=COST, constraint={"threshold": 0.2}, release={"delta": 0.1})
    c = cfg.constraint
    assert (c.threshold, c.multiplier, c.lr, c.init, c.cap, c.window, c.delay) == (0.2, "lagrangian", 0.1, 1.0, 5.0,
                                                                                   128, 0)
    assert cfg.cost.source == "regex" and cfg.cost.model_extra == {"pattern": "a", "mode": "search"}
    assert cfg.release.delta == 0.1
    assert run().cost is None and run().constraint is None and run().release is None


@pytest.mark.parametrize("threshold", [-0.1, float("nan"), float("inf"), "high"])
def test_a_bad_threshold_is_refused_naming_it(threshold):
    msg = refused(cost=COST, constraint={"threshold": threshold})
    assert "constraint.threshold" in msg and repr(threshold) in msg


def test_the_threshold_is_required():
    assert "constraint.threshold: Field required" in refused(cost=COST, constraint={})


def test_ppo_takes_a_constraint_as_ppo_lagrangian():
    from feedbackrl.train.ppo_lagrangian import PPOLagrangian
    from feedbackrl.train.run import ALGORITHMS, check_run

    cfg = build_config({"algo": {"name": "ppo"}, "cost": COST, "constraint": {"threshold": 0.2}})
    assert cfg.constraint.threshold == 0.2
    check_run(cfg, None)  # its objective runs with [constraint]
    assert ALGORITHMS["ppo"].train.objective_class(cfg) is PPOLagrangian


def test_rloo_takes_a_constraint():
    cfg = build_config({"algo": {"name": "rloo"}, "cost": COST, "constraint": {"threshold": 0.2}})
    assert cfg.constraint.threshold == 0.2


def test_an_unknown_cost_source_is_refused_like_a_reward_source():
    msg = refused(cost={"source": "regexx", "pattern": "a"})
    assert "cost.source: unknown reward source 'regexx'" in msg and "'regex'" in msg


def test_a_cost_sources_bad_option_names_its_path():
    msg = refused(cost={"source": "weighted_sum", "parts": {"bad": {"source": "regex", "pattern": "a", "mod": "x"}}})
    assert "cost.parts.bad.mod: unknown option for source 'regex'" in msg


def test_a_cost_source_option_without_a_source_names_the_cost_section():
    assert "cost.pattern: unknown key" in refused(cost={"pattern": "a"})


def test_an_empty_cost_section_is_refused():
    assert "an empty [cost] section measures nothing" in refused(cost={})


def test_the_cost_model_to_reward_source_is_refused_in_cost():
    msg = refused(cost={"source": "cost", "path": "runs/cost_model/reward_model"})
    assert "cost.model = DIR" in msg


def test_a_constraint_needs_a_cost_and_a_release_needs_a_constraint():
    assert "add a [cost] section" in refused(constraint={"threshold": 0.2})
    assert "add a [constraint] section" in refused(cost=COST, release={"delta": 0.1})


def test_cost_is_for_online_rl_only():
    msg = refused(algo={"name": "dpo"}, cost=COST)
    assert "[cost] is a signal of online RL" in msg and "'dpo'" in msg


@pytest.mark.parametrize(("multiplier", "stray"), [("lagrangian", "kp"), ("lagrangian", "ki"), ("pid", "lr")])
def test_a_setting_of_the_other_multiplier_is_refused(multiplier, stray):
    msg = refused(cost=COST, constraint={"threshold": 0.2, "multiplier": multiplier, stray: 0.5})
    assert f"constraint.{stray} is a setting of the other multiplier" in msg


def test_pid_may_start_at_zero_but_the_lagrangian_may_not():
    assert run(cost=COST, constraint={"threshold": 0.2, "multiplier": "pid", "init": 0.0}).constraint.init == 0.0
    assert "constraint.init must be > 0" in refused(cost=COST, constraint={"threshold": 0.2, "init": 0.0})
    assert "above constraint.cap" in refused(cost=COST, constraint={"threshold": 0.2, "init": 6.0, "cap": 5.0})


@pytest.mark.parametrize("delta", [0.0, 0.6, -1])
def test_a_bad_release_delta_is_refused(delta):
    assert "release.delta" in refused(cost=COST, constraint={"threshold": 0.2}, release={"delta": delta})


@pytest.mark.parametrize("scale", [{"rollout_workers": 1}, {"reward_workers": 1}])
def test_workers_with_a_constraint_are_refused(scale):
    assert "not yet supported" in refused(cost=COST, constraint={"threshold": 0.2}, scale=scale)


def test_an_unknown_constraint_key_is_refused():
    assert "constraint.lamda_max: unknown key" in refused(cost=COST, constraint={"threshold": 0.2, "lamda_max": 3})


def test_a_margin_above_the_threshold_is_refused():
    assert run(cost=COST, constraint={"threshold": 0.4, "margin": 0.4}).constraint.margin == 0.4
    assert "constraint.margin = 0.5 is above constraint.threshold = 0.4" in refused(
        cost=COST, constraint={"threshold": 0.4, "margin": 0.5})


def test_the_pessimistic_bound_needs_a_window_and_a_level():
    cfg = build_config({"cost": COST, "constraint": {"threshold": 0.2, "bound_delta": 0.1}})
    assert cfg.constraint.bound_delta == 0.1
    assert "constraint.window must be >= 2" in refused(cost=COST, constraint={"threshold": 0.2, "bound_delta": 0.1,
                                                                               "window": 1})
    assert "constraint.bound_delta" in refused(cost=COST, constraint={"threshold": 0.2, "bound_delta": 0.6})


def test_the_bound_per_prompt_needs_a_bound_and_whole_groups():
    ok = run(cost=COST, rollout={"group_size": 8},
             constraint={"threshold": 0.4, "bound_delta": 0.1, "window": 1000, "bound_per_prompt": True})
    assert ok.constraint.bound_per_prompt is True
    assert "constraint.bound_delta = 0 uses no bound" in refused(
        cost=COST, constraint={"threshold": 0.4, "bound_per_prompt": True})
    assert "constraint.window = 1001 must be a multiple of rollout.group_size = 8" in refused(
        cost=COST, rollout={"group_size": 8},
        constraint={"threshold": 0.4, "bound_delta": 0.1, "window": 1001, "bound_per_prompt": True})
    assert "holding at least 2 prompts" in refused(
        cost=COST, rollout={"group_size": 8},
        constraint={"threshold": 0.4, "bound_delta": 0.1, "window": 8, "bound_per_prompt": True})


def test_probe_prompts_need_a_window_of_whole_sets_and_a_count_that_fits():
    ok = run(cost=COST, constraint={"threshold": 0.4, "window": 1000, "probe_prompts": 1000, "probe_per_step": 125})
    assert (ok.constraint.probe_prompts, ok.constraint.probe_per_step) == (1000, 125)
    assert run(cost=COST, constraint={"threshold": 0.4}).constraint.probe_prompts == 0  # off by default
    assert "constraint.probe_prompts: Input should be greater than or equal to 0" in refused(
        cost=COST, constraint={"threshold": 0.4, "probe_prompts": -1})
    assert "constraint.probe_per_step: Input should be greater than or equal to 0" in refused(
        cost=COST, constraint={"threshold": 0.4, "window": 8, "probe_prompts": 8, "probe_per_step": -2})
    assert "constraint.probe_prompts = 0 draws none" in refused(
        cost=COST, constraint={"threshold": 0.4, "probe_per_step": 4})
    assert "probe_per_step = 9 is more than the constraint.probe_prompts = 8" in refused(
        cost=COST, constraint={"threshold": 0.4, "window": 8, "probe_prompts": 8, "probe_per_step": 9})
    assert "constraint.window = 128 must be a multiple of constraint.probe_prompts = 100" in refused(
        cost=COST, constraint={"threshold": 0.4, "probe_prompts": 100})
    assert "constraint.bound_per_prompt groups the training batch's costs" in refused(
        cost=COST, rollout={"group_size": 8}, constraint={"threshold": 0.4, "bound_delta": 0.1, "window": 1000,
                                                          "probe_prompts": 500, "bound_per_prompt": True})


def test_probe_prompts_are_refused_where_they_cannot_run():
    control = build_config  # a control run's costs come from environment steps, not prompts
    with pytest.raises(ConfigError, match="a control run's costs come from environment steps"):
        control({"algo": {"name": "control_ppo"}, "control": {"cost": "cart_off_centre"},
                 "constraint": {"threshold": 0.1, "window": 8, "probe_prompts": 8}})
    assert "constraint.probe_prompts with scale.learner = 'fsdp'" in refused(
        cost=COST, scale={"learner": "fsdp"}, constraint={"threshold": 0.4, "window": 8, "probe_prompts": 8})


def test_heldout_probes_need_probe_prompts_and_a_task_with_a_heldout_split():
    probes = {"threshold": 0.4, "window": 8, "probe_prompts": 8}
    assert run(cost=COST, constraint=probes).constraint.probe_from == "train"  # the default: training prompts
    ok = run(cost=COST, task={"name": "reverse"}, constraint={**probes, "probe_from": "heldout"})
    assert ok.constraint.probe_from == "heldout"
    assert "constraint.probe_from: Input should be 'train' or 'heldout'" in refused(
        cost=COST, constraint={**probes, "probe_from": "eval"})
    assert "constraint.probe_from = 'heldout' says where the probe prompts come from, and constraint.probe_prompts " \
           "= 0 draws none" in refused(cost=COST, constraint={"threshold": 0.4, "probe_from": "heldout"})
    heldout = {**probes, "probe_from": "heldout"}
    msg = refused(cost=COST, task={"name": "guess_number"}, constraint=heldout)
    assert "task 'guess_number' has none: its held-out games replay the training secrets" in msg
    assert "use probe_from = 'train'" in msg
    assert "task.options.heldout_fraction = 0 holds no rows out" in refused(
        cost=COST, task={"name": "dataset", "options": {"path": "rows.jsonl", "heldout_fraction": 0.0}},
        constraint=heldout)
    assert "task.options.heldout_tasks = 0 holds no tasks out" in refused(
        cost=COST, task={"name": "verifiers", "options": {"env": "x"}}, constraint=heldout)
    # the same tasks with a split of their own load
    assert run(cost=COST, task={"name": "dataset", "options": {"path": "rows.jsonl"}}, constraint=heldout)
    assert run(cost=COST, task={"name": "verifiers", "options": {"env": "x", "heldout_tasks": 50}},
               constraint=heldout)


def test_probe_envs_are_a_control_runs_and_refused_on_a_text_run():
    # a text run's probe is probe_prompts; probe_envs would be accepted and never used there
    msg = refused(cost=COST, constraint={"threshold": 0.4, "window": 8, "probe_envs": 8, "probe_steps": 32})
    assert "constraint.probe_envs steps greedy probe environments of a control run" in msg
    assert "a text run's probe is constraint.probe_prompts" in msg
    both = refused(cost=COST, constraint={"threshold": 0.4, "window": 8, "probe_prompts": 8, "probe_envs": 8,
                                          "probe_steps": 1})
    assert "a run uses at most one of them" in both
    assert run(cost=COST, constraint={"threshold": 0.4}).constraint.probe_envs == 0  # off by default
