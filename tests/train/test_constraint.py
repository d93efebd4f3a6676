"""[constraint] in the GRPO loop: lambda follows the pure multiplier step on the batches' costs, the advantages
combine reward and cost, and a run with [cost] writes its held-out costs and the release decision."""

import json
import math
from pathlib import Path

import pytest

from feedbackrl.algos.constrained import LagrangeState, PIDLagrangeState, lagrange_update, pid_lagrange_update
from feedbackrl.config import ConfigError, build_config
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.episodes.contracts import Batch
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.prefs import gold_scorer, training_cost
from feedbackrl.train.run import run

N = 16  # completions per step: 4 prompts x 4


class DigitAddition(AdditionTask):
    """Rewards the fraction of digits among the 4 generated characters, so rewards differ within a group."""

    def verify(self, problem: Problem, completion: str) -> Verdict:
        score = min(sum(c.isdigit() for c in completion), 4) / 4
        return Verdict(score, score == 1.0, f"{score:.2f} digits")


def config(constraint: dict, steps: int = 3):
    return build_config({
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algo": {"steps": steps, "lr": 1e-2},
        "train": {"seed": 1},
        "monitors": {"enabled": False},
        # the cost: a completion with any digit 0-4 (the reward asks for digits, so they conflict)
        "cost": {"source": "regex", "pattern": "[0-4]", "mode": "search"},
        "constraint": constraint,
    })


def train(tiny_model_dir: Path, out: Path, cfg) -> dict[int, dict]:
    model, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    task, sink = DigitAddition(), MemorySink()
    scorer = gold_scorer(task.verify_batch, None, training_cost(cfg, task))
    train_grpo(cfg, model, tokenizer, task, out, sink, scorer=scorer)
    return sink.by_step


def replay_lagrange(rows: dict[int, dict], steps=(1, 2, 3)) -> list[dict[str, float]]:
    """Replay the pure log-lambda update (init 0.5, lr 0.5, window 1000, no delay, cap 5, target 0) on each step's
    logged costs and check the logged lambda and violation against it; the stats of each step, in order.

    The costs are 0/1, so each step's count of costly completions is exact."""
    state, out = LagrangeState.initial(0.5), []
    for step in steps:
        costly = round(rows[step]["cost/mean"] * N)
        assert rows[step]["cost/mean"] == costly / N
        state, stats = lagrange_update(state, [1.0] * costly + [0.0] * (N - costly), 0.0, 0.5, 1000, 0, 5.0)
        assert rows[step]["constraint/lambda"] == stats["constraint/lambda"] == state.lam
        assert rows[step]["constraint/violation"] == stats["constraint/violation"]
        out.append(stats)
    return out


def test_lambda_rises_over_the_threshold_as_the_pure_update_says(tiny_model_dir: Path, tmp_path: Path):
    # the multiplier aims at threshold - margin = 0
    rows = train(tiny_model_dir, tmp_path, config({"threshold": 0.25, "margin": 0.25, "lr": 0.5, "init": 0.5,
                                                   "window": 1000}))
    for step, stats in zip((1, 2, 3), replay_lagrange(rows), strict=True):
        assert rows[step]["constraint/cost_window_mean"] == stats["constraint/cost_window_mean"]
        assert rows[step]["constraint/threshold"] == 0.25
    assert all(rows[s]["cost/mean"] > 0 for s in (1, 2, 3)), rows  # over the threshold 0: lambda must rise
    lams = [0.5] + [rows[s]["constraint/lambda"] for s in (1, 2, 3)]
    assert lams == sorted(lams) and lams[-1] > 0.5
    assert rows[3]["advantages/cost_abs_mean"] > 0


def test_pid_lambda_follows_the_pure_pid_update(tiny_model_dir: Path, tmp_path: Path):
    rows = train(tiny_model_dir, tmp_path, config({"threshold": 0.1, "multiplier": "pid", "init": 0.0, "kp": 1.0,
                                                   "ki": 0.5, "kd": 2.0, "window": 1000, "delay": 1}))
    state = PIDLagrangeState(lam=0.0)
    for step in (1, 2, 3):
        costly = round(rows[step]["cost/mean"] * N)
        state, stats = pid_lagrange_update(state, [1.0] * costly + [0.0] * (N - costly), 0.1, 1.0, 0.5, 2.0, 1000, 1,
                                           5.0)
        assert rows[step]["constraint/lambda"] == stats["constraint/lambda"]
        assert rows[step]["constraint/updated"] == float(step > 1)
    assert rows[1]["constraint/lambda"] == 0.0 and rows[3]["constraint/lambda"] > 0


def test_the_constraint_combines_the_advantages_it_is_given(tiny_model_dir: Path, tmp_path: Path):
    # lambda capped at its start: the combined advantage is (A_r - lam A_c) / (1 + lam) with lam = 2 every step
    rows = train(tiny_model_dir, tmp_path, config({"threshold": 0.0, "init": 2.0, "cap": 2.0}, steps=1))
    assert rows[1]["constraint/lambda"] == 2.0
    assert math.isfinite(rows[1]["loss/policy"])


def test_a_batch_without_costs_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path):
    model, tokenizer = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    task = DigitAddition()  # scored by its verifier alone: no cost signal reaches the loop
    with pytest.raises(ConfigError, match=r"\[constraint\]: the batches of task 'addition' carry no cost"):
        train_grpo(config({"threshold": 0.1}, steps=1), model, tokenizer, task, tmp_path, MemorySink())


def test_batch_signals_always_hold_the_reward():
    import torch

    r = torch.tensor([0.5, 1.0])
    b = Batch([], r, r, r, r, [], [], r, r, signals={"cost": torch.tensor([1.0, 0.0])})
    assert b.signals["reward"] is r and sorted(b.signals) == ["cost", "reward"]


def test_a_run_with_cost_and_release_writes_the_safety_eval_and_the_decision(tmp_path: Path):
    cfg = build_config({
        "task": {"name": "reverse", "heldout_size": 12, "options": {"min_len": 3, "max_len": 4}},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
        "algo": {"steps": 2},
        "eval": {"pass_k": 0},
        "cost": {"source": "regex", "pattern": "a", "mode": "search"},
        "constraint": {"threshold": 0.5},
        "release": {"delta": 0.1},
    })
    report = run(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "safety_eval.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["cost"] == float("a" in r["completion"]) for r in rows)
    assert report["safety_eval"]["cost_mean"] == sum(r["cost"] for r in rows) / 12
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["release"]["n"] == 12 and saved["release"]["threshold"] == 0.5
    assert saved["release"]["released"] == report["release"]["released"]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in metrics if m.get("phase") == "rl"]
    assert {"cost/mean", "constraint/lambda", "constraint/cost_window_mean"} <= set(rl[0])
    assert (tmp_path / "checkpoints" / "step_000002" / "constraint.pt").is_file()


def test_cost_with_an_episodic_task_is_refused(tmp_path: Path):
    cfg = build_config({"task": {"name": "guess_number"}, "cost": {"source": "regex", "pattern": "a"}})
    with pytest.raises(ConfigError, match=r"\[cost\] with task.name = 'guess_number'"):
        run(cfg, tmp_path)


def test_constrained_advantages_are_grpo_lagrangians_and_rloos_under_one_multiplier():
    import torch

    from feedbackrl.algos.advantages import group_advantages
    from feedbackrl.algos.constrained import grpo_lagrangian_advantages
    from feedbackrl.algos.rloo import rloo_advantages
    from feedbackrl.train.constraint import constrained_advantages

    r, c = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])
    got, _ = constrained_advantages(group_advantages, r, c, 4, 0.5, True)
    assert torch.equal(got, grpo_lagrangian_advantages(r, c, 4, 0.5)[0])
    # RLOO by hand: r_i - mean of the other three; rewards (1, 0, 1, 0) -> (2/3, -2/3, 2/3, -2/3), costs alike
    got, _ = constrained_advantages(rloo_advantages, r, c, 4, 0.5, False)
    want = (torch.tensor([2, -2, 2, -2]) / 3 - 0.5 * torch.tensor([2, 2, -2, -2]) / 3) / 1.5
    assert torch.allclose(got, want, rtol=0, atol=4 * torch.finfo(torch.float32).eps)


def test_a_reward_model_is_refused_as_the_cost_model(reward_model_dir: Path):
    cfg = build_config({"cost": {"model": str(reward_model_dir)}})
    with pytest.raises(ConfigError, match="holds a reward model; \\[cost\\] needs a cost model"):
        training_cost(cfg, DigitAddition())


def test_the_multiplier_takes_the_pessimistic_bound_from_the_recipe():
    import torch

    from feedbackrl.config import ConstraintConfig
    from feedbackrl.train.constraint import Multiplier

    costs = [0.0, 1.0, 0.0, 1.0]
    for delta in (0.0, 0.1):
        m = Multiplier.from_config(ConstraintConfig(threshold=0.5, lr=0.1, bound_delta=delta))
        stats = m.update(torch.tensor(costs))
        want, want_stats = lagrange_update(LagrangeState.initial(1.0), costs, 0.5, 0.1, 128, 0, 5.0, delta)
        assert m.state == want and stats["constraint/cost_window_mean"] == want_stats["constraint/cost_window_mean"]
    assert m.lam > 1.0  # the bound is over the threshold where the mean (0.5) is not


def test_the_multiplier_groups_the_bound_by_prompt_only_when_asked():
    import torch

    from feedbackrl.config import ConstraintConfig
    from feedbackrl.train.constraint import Multiplier

    costs = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    per_prompt = ConstraintConfig(threshold=0.5, lr=0.1, bound_delta=0.1, bound_per_prompt=True)
    m = Multiplier.from_config(per_prompt, group_size=2)
    assert m.bound_group == 2 and Multiplier.from_config(per_prompt).bound_group == 1
    assert Multiplier.from_config(ConstraintConfig(threshold=0.5, bound_delta=0.1), group_size=2).bound_group == 1
    stats = m.update(torch.tensor(costs))
    want, want_stats = lagrange_update(LagrangeState.initial(1.0), costs, 0.5, 0.1, 128, 0, 5.0, 0.1, 2)
    assert m.state == want and stats["constraint/cost_window_mean"] == want_stats["constraint/cost_window_mean"]


def test_the_multiplier_steps_on_the_probe_costs_when_the_loop_sampled_them():
    import torch

    from feedbackrl.train.constraint import multiplier_costs

    batch = Batch([Problem("p", None)] * 2, *(torch.zeros(2, 1),) * 4, ["a", "b"], [Verdict(1.0, True, "")] * 2,
                  torch.ones(2), torch.zeros(2, dtype=torch.bool), signals={"cost": torch.tensor([1.0, 0.0])})
    assert multiplier_costs(batch).tolist() == [1.0, 0.0]  # no probes: the batch's own costs
    batch.probe_costs = torch.tensor([0.0, 0.0, 1.0])
    assert multiplier_costs(batch).tolist() == [0.0, 0.0, 1.0]


def test_the_probe_set_comes_from_the_training_distribution_seeded_by_the_run():
    from feedbackrl.config import ConstraintConfig
    from feedbackrl.envs.procedural.reverse import ReverseTask
    from feedbackrl.train.probe import ProbeSet, fingerprint

    task = ReverseTask(min_len=3, max_len=7, alphabet_size=10)
    cfg = ConstraintConfig(threshold=0.4, window=200, probe_prompts=200, probe_per_step=50)
    probe = ProbeSet.draw(task, cfg, seed=0, heldout_size=0)
    heldout = {p.prompt for p in task.heldout(1000)}
    assert len(probe.problems) == 200 and not heldout & {p.prompt for p in probe.problems}
    assert (probe.per_step, probe.fill, probe.position) == (50, 200, 0)
    again, other = ProbeSet.draw(task, cfg, seed=0, heldout_size=0), ProbeSet.draw(task, cfg, seed=1, heldout_size=0)
    assert fingerprint(again.problems) == fingerprint(probe.problems) != fingerprint(other.problems)
    assert torch_equal_states(again, probe)
    all_at_once = ProbeSet.draw(task, cfg.model_copy(update={"probe_per_step": 0}), seed=0, heldout_size=0)
    assert all_at_once.per_step == 200  # 0: every probe prompt every step


def test_heldout_probes_are_the_heldout_problems_after_the_evaluated_ones():
    import random

    from feedbackrl.config import ConstraintConfig
    from feedbackrl.envs.procedural.reverse import ReverseTask, _is_heldout
    from feedbackrl.train.probe import ProbeSet

    task = ReverseTask(min_len=3, max_len=7, alphabet_size=10)
    cfg = ConstraintConfig(threshold=0.4, window=200, probe_prompts=200, probe_per_step=50, probe_from="heldout")
    probe = ProbeSet.draw(task, cfg, seed=0, heldout_size=300)
    evaluated = [p.prompt for p in task.heldout(300)]  # what the evaluation and the release test score
    prompts = [p.prompt for p in probe.problems]
    # the evaluated set's own generator, continued: heldout(500) is the 300 evaluated words, then the 200 probes
    assert [p.prompt for p in task.heldout(500)] == evaluated + prompts
    assert len(set(prompts)) == 200 and not set(prompts) & set(evaluated)  # disjoint from the release set
    assert all(_is_heldout(p.meta["word"]) for p in probe.problems)  # held-out words: Task.sample never draws one
    rng = random.Random(0)
    assert not {task.sample(rng).prompt for _ in range(20_000)} & set(prompts)
    other = ProbeSet.draw(task, cfg, seed=1, heldout_size=300)  # the same probes for every seed, another generator
    assert [p.prompt for p in other.problems] == prompts and not torch_equal_states(other, probe)
    assert (probe.per_step, probe.fill, probe.position) == (50, 200, 0)


def test_the_recipes_heldout_probes_hold_the_evaluated_sets_share_of_words_with_an_a():
    # recipes/reverse_safe_grpo.toml: 1,500 evaluated held-out words, the next 1,000 the probes; the margin's
    # derivation there uses these counts (training words drawn with seeds 30-35 held 0.388-0.425)
    from feedbackrl.config import load_config
    from feedbackrl.envs.registry import make_task
    from feedbackrl.train.probe import heldout_probes

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "reverse_safe_grpo.toml")
    task = make_task(cfg.task)
    assert (cfg.task.heldout_size, cfg.constraint.probe_prompts, cfg.constraint.probe_from) == (1500, 1000, "heldout")
    evaluated = task.heldout(1500)
    probes = heldout_probes(task, 1500, 1000)
    assert sum("a" in p.meta["word"] for p in evaluated) == 653  # 0.4353
    assert sum("a" in p.meta["word"] for p in probes) == 434  # 0.4340


def test_heldout_probes_are_refused_where_the_heldout_split_cannot_hold_them():
    from feedbackrl.envs.guess import GuessNumberTask
    from feedbackrl.train.probe import heldout_probes

    with pytest.raises(ConfigError, match=r"8 of the 8 probe prompts after the 31 evaluated held-out problems of "
                                          r"task 'guess_number' repeat an evaluated prompt"):
        heldout_probes(GuessNumberTask(), 31, 8)  # its held-out games cycle through the secrets
    with pytest.raises(ConfigError, match=r"needs task.heldout_size \+ constraint.probe_prompts = 5 \+ 100 held-out "
                                          r"problems: addition with 1 digits has only"):
        heldout_probes(AdditionTask(digits=1), 5, 100)

    class Reshuffled(AdditionTask):  # heldout(n) another list for each n: no split of the evaluated set possible
        def heldout(self, n: int) -> list[Problem]:
            return [Problem(f"{n}+{i}=", str(n + i)) for i in range(n)]

    with pytest.raises(ConfigError, match=r"heldout\(15\) does not begin with its heldout\(10\), the evaluated set"):
        heldout_probes(Reshuffled(), 10, 5)


def torch_equal_states(a, b) -> bool:
    import torch

    return torch.equal(a.generator.get_state(), b.generator.get_state())


def test_probe_prompts_under_torchrun_are_refused_before_any_work(tmp_path: Path):
    from types import SimpleNamespace

    cfg = build_config({"algo": {"name": "grpo", "steps": 1}, "cost": {"source": "regex", "pattern": "1"},
                        "constraint": {"threshold": 0.2, "window": 8, "probe_prompts": 8}})
    with pytest.raises(ConfigError, match="constraint.probe_prompts under torchrun"):
        train_grpo(cfg, None, None, DigitAddition(), tmp_path, MemorySink(), ranks=SimpleNamespace(world=2))


def test_with_probe_prompts_lambda_follows_the_probe_costs_not_the_batchs(tiny_model_dir: Path, tmp_path: Path):
    # 8 probe prompts, all of them every step, window 8: J_C is exactly the mean of this step's 8 probe costs
    rows = train(tiny_model_dir, tmp_path, config({"threshold": 0.25, "margin": 0.25, "lr": 0.5, "init": 0.5,
                                                   "window": 8, "probe_prompts": 8}, steps=4))
    state = LagrangeState.initial(0.5)
    for step in (1, 2, 3, 4):
        probe = rows[step]["constraint/probe_cost"]
        costly = round(probe * 8)
        assert probe == costly / 8 and rows[step]["constraint/probe_n"] == 8
        state, stats = lagrange_update(state, [1.0] * costly + [0.0] * (8 - costly), 0.0, 0.5, 8, 0, 5.0)
        assert rows[step]["constraint/cost_window_mean"] == probe == stats["constraint/cost_window_mean"]
        assert rows[step]["constraint/lambda"] == stats["constraint/lambda"]
    # the training batches' own costs differ from the probes' on some step (else this test would not tell)
    assert any(rows[s]["cost/mean"] != rows[s]["constraint/probe_cost"] for s in (1, 2, 3, 4))


def test_sampling_the_probes_leaves_the_training_rollouts_alone(tiny_model_dir: Path, tmp_path: Path):
    # PID with zero gains: lambda is 0 throughout, so a run with probes trains exactly as one without, unless the
    # probes drew from the training RNG streams (the twin without [constraint] must see the same prompts)
    still = {"threshold": 0.25, "multiplier": "pid", "kp": 0.0, "ki": 0.0, "kd": 0.0, "init": 0.0, "window": 8}
    plain = train(tiny_model_dir, tmp_path / "plain", config(still, steps=3))
    probed = train(tiny_model_dir, tmp_path / "probed", config({**still, "probe_prompts": 8, "probe_per_step": 4},
                                                              steps=3))
    for step in (1, 2, 3):
        assert probed[step]["constraint/lambda"] == 0.0 and "constraint/probe_cost" in probed[step]
        for key in ("reward/mean", "cost/mean", "loss/policy", "kl/mean"):
            assert probed[step][key] == plain[step][key], (step, key)
