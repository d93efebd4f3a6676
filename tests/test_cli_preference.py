"""The preference recipes end to end through `feedbackrl train`, at toy sizes: the reward-model
run writes what the DPO, PPO and RLOO runs start from, and every run reports against the gold."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import load_config
from feedbackrl.data.labeller import gold_score_for
from feedbackrl.data.preferences import load_preference_pairs
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.registry import make_task
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.reward import load_reward_model
from feedbackrl.train.preference import heldout_metrics
from feedbackrl.train.prefs import gold_comparison
from feedbackrl.train.run import model_task

RECIPES = Path(__file__).parent.parent / "recipes"
runner = CliRunner()
TOY = ["sft.steps=3", "sft.batch_size=8", "sft.warmup_steps=0", "task.heldout_size=8", "prefs.prompts=24",
       "prefs.heldout_prompts=8", "train.threads=1"]
ONLINE_TOY = ["algo.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=8",
              "train.threads=1"]


def train(recipe: str, out: Path, overrides: list[str]) -> dict:
    args = ["train", str(RECIPES / recipe), "--out", str(out)]
    for item in overrides:
        args += ["--set", item]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text())


def recomputed_gold_vs_sft(recipe: str, overrides: list[str], policy: Path, sft: Path) -> dict:
    """The report's gold comparison, redone from the saved policy and SFT policy: the same figures, exactly."""
    cfg = load_config(RECIPES / recipe, overrides)
    tokenizer = load_tokenizer(str(sft))
    task = model_task(cfg, make_task(cfg.task), tokenizer)
    return gold_comparison(load_policy(str(policy)), load_policy(str(sft)), tokenizer,
                           task.heldout(cfg.task.heldout_size), gold_score_for(task), cfg.rollout.max_new_tokens,
                           cfg.rollout.temperature)


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prefs") / "rm"
    train("reward_model.toml", out, [*TOY, "algo.batch_size=8"])
    return out


def test_reward_model_run_writes_data_model_and_report(rm_run: Path):
    report = json.loads((rm_run / "report.json").read_text())
    ceiling = report["prefs"]["heldout_ceiling"]
    assert 0.5 <= ceiling["expected"] <= 1 and report["prefs"]["train_items"] > 0
    model, tokenizer = load_reward_model(rm_run / "reward_model")
    # the reported figures are the saved model's on the saved held-out pairs: recomputed from the files, exactly
    held, _ = load_preference_pairs(rm_run / "prefs" / "heldout.jsonl")
    assert heldout_metrics(model, tokenizer, held) == {k: v for k, v in report["reward_model"].items()
                                                       if k.startswith("rm/heldout_")}
    assert model.kind == "reward" and model.calibration.scale > 0
    assert (rm_run / "sft_policy" / "config.json").is_file() and (rm_run / "curves.png").is_file()
    assert {r["phase"] for r in read_jsonl(rm_run / "metrics.jsonl")} == {"sft", "eval", "rm", "rm_eval"}


def test_cost_model_recipe_trains_on_safety_labels(tmp_path: Path):
    report = train("cost_model.toml", tmp_path / "cost", [*TOY, "algo.batch_size=8"])
    rows = [json.loads(x) for x in (tmp_path / "cost" / "prefs" / "train.jsonl").read_text().splitlines()]
    assert rows and report["kind"] == "cost"
    for r in rows:  # chosen = the costlier response; cost = number of "a"s; unsafe = cost > 0
        assert r["gold_chosen"] == r["chosen"].strip().count("a") and r["chosen_unsafe"] == (r["gold_chosen"] > 0)
        # p_chosen = P(the labeller picks chosen as costlier) = sigmoid((cost_c - cost_r) / 0.05): a coin flip on
        # equal costs; one "a" apart it is sigmoid(20) > 0.99, and the costlier one is chosen
        if r["gold_chosen"] == r["gold_rejected"]:
            assert r["p_chosen"] == 0.5, r
        else:
            assert r["p_chosen"] > 0.99 and r["gold_chosen"] > r["gold_rejected"], r
    assert any(r["gold_chosen"] != r["gold_rejected"] for r in rows), "every pair tied: nothing was checked"
    model, tokenizer = load_reward_model(tmp_path / "cost" / "reward_model")
    held, _ = load_preference_pairs(tmp_path / "cost" / "prefs" / "heldout.jsonl")
    safety = heldout_metrics(model, tokenizer, held)["rm/heldout_safety_accuracy"]
    assert safety == report["reward_model"]["rm/heldout_safety_accuracy"]  # the saved model's, on the saved pairs
    assert model.kind == "cost" and model.calibration.center == 0.0


def test_cost_model_on_a_task_without_a_harm_rule_says_what_to_do(tmp_path: Path):
    result = runner.invoke(app, ["train", str(RECIPES / "cost_model.toml"), "--out", str(tmp_path / "c"),
                                 "--set", "task.name=addition", "--set", "task.options={}", "--set", "train.threads=1",
                                 "--set", "sft.steps=0"])
    assert result.exit_code != 0 and "no cost rule for task 'addition'" in result.output, result.output


@pytest.mark.parametrize("recipe", ["rloo.toml", "ppo.toml"])
def test_online_recipes_run_against_the_learned_reward(rm_run: Path, tmp_path: Path, recipe: str):
    overrides = [*ONLINE_TOY, f"model.path={rm_run / 'sft_policy'}", f"reward.model={rm_run / 'reward_model'}"]
    report = train(recipe, tmp_path / "run", overrides)
    assert report["reward"] == str(rm_run / "reward_model")
    # the final checkpoint against the SFT policy it started from, judged by the gold: what the report says
    assert report["gold_vs_sft"] == recomputed_gold_vs_sft(recipe, overrides, tmp_path / "run" / "checkpoints" /
                                                           "step_000002", rm_run / "sft_policy")
    rl = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == [1, 2] and all("reward/gold_mean" in r for r in rl)


def test_dpo_recipe_from_the_reward_model_runs_pairs(rm_run: Path, tmp_path: Path):
    overrides = ["task.heldout_size=8", "train.threads=1", "algo.batch_size=8", f"model.path={rm_run / 'sft_policy'}",
                 f"prefs.path={rm_run / 'prefs' / 'train.jsonl'}"]
    report = train("dpo.toml", tmp_path / "dpo", overrides)
    assert report["prefs"]["source"].endswith("train.jsonl") and report["prefs"]["heldout_items"] == 0
    assert (tmp_path / "dpo" / "policy" / "config.json").is_file()
    assert report["gold_vs_sft"] == recomputed_gold_vs_sft("dpo.toml", overrides, tmp_path / "dpo" / "policy",
                                                           rm_run / "sft_policy")


def test_pro_ranks_its_own_samples(rm_run: Path, tmp_path: Path):
    report = train("dpo.toml", tmp_path / "pro", ["task.heldout_size=8", "train.threads=1", "algo.batch_size=8",
                                                  "algo.loss=pro", "prefs.responses=3", "prefs.path=''",
                                                  "prefs.prompts=16", f"model.path={rm_run / 'sft_policy'}"])
    rows = [json.loads(x) for x in (tmp_path / "pro" / "prefs" / "train.jsonl").read_text().splitlines()]
    assert rows and all(len(r["responses"]) == len(set(r["responses"])) == len(r["gold"]) == 3 for r in rows)
    assert report["prefs"]["train_items"] == len(rows)


def test_resume_is_refused_for_preference_algorithms(tmp_path: Path):
    result = runner.invoke(app, ["train", str(RECIPES / "dpo.toml"), "--out", str(tmp_path / "o"), "--resume",
                                 str(tmp_path), "--set", "train.threads=1"])
    assert result.exit_code == 2
    assert ("--resume: algo.name = 'dpo' cannot continue from a checkpoint (these can: grpo, rloo, ppo, "
            "control_ppo)") in result.output


@pytest.mark.parametrize("content, message", [
    (None, "data file '{path}' does not exist"),
    ("prompt,chosen,rejected\n2+2?,4,5,6\n", "{path}: row 0 has 4 fields but the header has 3"),
], ids=["missing-file", "ragged-csv"])
def test_bad_preference_file_is_a_clear_error_not_a_traceback(tmp_path: Path, content: str | None, message: str):
    path = tmp_path / "x.csv"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["train", str(RECIPES / "dpo.toml"), "--out", str(tmp_path / "o"),
                                 "--set", "model.path=tiny", "--set", f"prefs.path={path}", "--set", "train.threads=1"])
    assert result.exit_code == 2, result.output
    assert f"error: {message.format(path=path)}" in result.output
    assert isinstance(result.exception, SystemExit)  # typer.Exit: no exception escaped


# Learning: a reward-model run big enough that its preferences teach something (300 SFT steps, 4,000 labelled
# prompts), then DPO on its pairs and RLOO against its reward model, each judged by the hidden gold score
# against the SFT policy on 64 held-out words x 4 samples. Gold win rates at train.seed 0 / 1 / 2 (2026-12-01):
# DPO 0.570 / 0.666 / 0.617, RLOO (30 steps) 0.537 / 0.619 / 0.574, PPO (30 steps) 0.465 / 0.613 / 0.592:
# PPO does not beat SFT on every seed at this size, so it has no learning assertion yet (the README says its
# 0.69 for recipes/ppo.toml is measured, not tested).
LEARN = ["task.heldout_size=64", "train.threads=1"]
DPO_MIN_WIN_RATE = 0.54  # lowest seed 0.570, less ~one standard error of 256 comparisons
RLOO_MIN_WIN_RATE = 0.52  # lowest seed 0.537


@pytest.fixture(scope="module")
def learned_rm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("learn") / "rm"
    train("reward_model.toml", out, [*LEARN, "sft.steps=300", "prefs.prompts=4000", "prefs.heldout_prompts=64",
                                     "algo.epochs=1", "algo.batch_size=64"])
    return out


@pytest.mark.slow
def test_dpo_beats_the_sft_policy_on_the_gold_score(learned_rm_run: Path, tmp_path: Path):
    report = train("dpo.toml", tmp_path / "dpo", [*LEARN, "algo.batch_size=64",
                                                  f"model.path={learned_rm_run / 'sft_policy'}",
                                                  f"prefs.path={learned_rm_run / 'prefs' / 'train.jsonl'}"])
    g = report["gold_vs_sft"]
    assert g["win_rate"] >= DPO_MIN_WIN_RATE, (f"DPO gold win rate vs SFT {g['win_rate']:.3f} < {DPO_MIN_WIN_RATE}; "
                                               f"gold mean {g['baseline_gold_mean']:.3f} -> {g['gold_mean']:.3f}")


@pytest.mark.slow
def test_rloo_beats_the_sft_policy_on_the_gold_score(learned_rm_run: Path, tmp_path: Path):
    report = train("rloo.toml", tmp_path / "rloo", [*LEARN, "algo.steps=30", "rollout.prompts_per_step=16",
                                                    "rollout.group_size=8",
                                                    f"model.path={learned_rm_run / 'sft_policy'}",
                                                    f"reward.model={learned_rm_run / 'reward_model'}"])
    g = report["gold_vs_sft"]
    assert g["win_rate"] >= RLOO_MIN_WIN_RATE, (f"RLOO gold win rate vs SFT {g['win_rate']:.3f} < "
                                                f"{RLOO_MIN_WIN_RATE}; gold mean {g['baseline_gold_mean']:.3f} -> "
                                                f"{g['gold_mean']:.3f}")
