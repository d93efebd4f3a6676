"""The `feedbackrl` command: resolved config, user errors exit 2 with a clear message, a tiny end-to-end run."""

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feedbackrl.cli import app, demo_recipe_path
from feedbackrl.data.rows import read_jsonl

runner = CliRunner()

# Toy sizes: a few seconds on one CPU thread.
TINY = ["sft.steps=3", "sft.batch_size=8", "sft.warmup_steps=0", "algo.steps=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=4", "task.heldout_size=6", "eval.pass_k=2", "eval.every=1",
        "eval.batch_size=8", "train.threads=1", "train.checkpoint_every=1"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_config_prints_the_resolved_json():
    result = runner.invoke(app, ["config", "--set", "algo.lr=0.001", "--set", "task.options.digits=3"])
    assert result.exit_code == 0, result.output
    cfg = json.loads(result.stdout)
    assert cfg["algo"]["lr"] == 0.001 and cfg["task"]["options"] == {"digits": 3}
    assert cfg["rollout"]["group_size"] == 8  # defaults filled in


def test_config_of_a_recipe():
    recipe = tomllib.loads(demo_recipe_path().read_text())
    result = runner.invoke(app, ["config", str(demo_recipe_path())])
    assert result.exit_code == 0, result.output
    cfg = json.loads(result.stdout)
    assert cfg["sft"]["steps"] == recipe["sft"]["steps"] and cfg["task"]["name"] == recipe["task"]["name"]
    assert cfg["eval"]["batch_size"] == 256  # not in the recipe: default filled in


def test_train_with_an_unknown_key_exits_2_naming_it(tmp_path: Path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[algo]\nstepz = 3\n")
    result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "algo.stepz: unknown key" in result.output
    assert not (tmp_path / "out").exists()  # nothing ran


def test_train_with_a_missing_model_dir_exits_2(tmp_path: Path):
    missing = tmp_path / "no_model"
    result = runner.invoke(app, ["train", str(demo_recipe_path()), "--out", str(tmp_path / "out"),
                                 *sets([f"model.path={missing}", "train.threads=1"])])
    assert result.exit_code == 2
    assert f"error: model path {str(missing)!r} does not exist" in result.output


def test_train_resume_from_a_non_checkpoint_dir_exits_2(tmp_path: Path):
    result = runner.invoke(app, ["train", str(demo_recipe_path()), "--out", str(tmp_path / "out"),
                                 "--resume", str(tmp_path), *sets(["train.threads=1"])])
    assert result.exit_code == 2
    assert "cannot resume from" in result.output and "neither a checkpoint" in result.output


def test_missing_recipe_exits_2(tmp_path: Path):
    result = runner.invoke(app, ["train", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    result = runner.invoke(app, ["train", str(demo_recipe_path()), "--out", str(out), *sets(TINY)])
    assert result.exit_code == 0, result.output
    return out


def test_tiny_train_writes_report_metrics_and_plot(tiny_run: Path):
    report = json.loads((tiny_run / "report.json").read_text())
    for key in ("accuracy", "pass@2", "n"):
        assert key in report["eval_before"] and key in report["eval_after"]
    assert report["eval_before"]["n"] == 6 and 0.0 <= report["eval_after"]["accuracy"] <= 1.0
    assert report["wall_seconds"] > 0 and report["resumed_from"] is None
    rows = read_jsonl(tiny_run / "metrics.jsonl")
    phases = [r["phase"] for r in rows]
    # 3 SFT steps, eval before, RL step 1 (with a mid-run eval), RL step 2, eval after
    assert phases == ["sft"] * 3 + ["eval", "rl", "rl", "eval"]
    assert "eval/accuracy" in rows[4] and "eval/accuracy" not in rows[5]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2]
    assert (tiny_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tiny_run / "config.json").read_text())["algo"]["steps"] == 2
    assert sorted(p.name for p in (tiny_run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_tiny_train_resumes_from_its_run_dir(tiny_run: Path, tmp_path: Path):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")
    result = runner.invoke(app, ["train", str(demo_recipe_path()), "--out", str(run), "--resume", str(run),
                                 *sets([*TINY, "algo.steps=3"])])
    assert result.exit_code == 0, result.output
    report = json.loads((run / "report.json").read_text())
    assert report["resumed_from"].endswith("step_000002") and report["steps"] == 3
    assert report["eval_before"] == json.loads((tiny_run / "report.json").read_text())["eval_before"]
    rl_steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["phase"] == "rl"]
    assert rl_steps == [1, 2, 3]  # appended, SFT not redone
    assert (run / "checkpoints" / "step_000003").is_dir()


def test_eval_a_checkpoint(tiny_run: Path, tmp_path: Path):
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["eval", str(tiny_run / "checkpoints" / "step_000002"), "--out", str(out),
                                 *sets(["task.heldout_size=4", "eval.pass_k=2", "train.threads=1",
                                        "rollout.max_new_tokens=4"])])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["n"] == 4 and saved["k"] == 2 and 0.0 <= saved["accuracy"] <= 1.0
