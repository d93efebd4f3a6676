"""`feedbackrl redteam`: the search against a real (tiny, untrained) policy, and its input errors."""

from pathlib import Path

from typer.testing import CliRunner

from feedbackrl.cli import app

runner = CliRunner()
RECIPE = Path("recipes/secret_grpo.toml")


def test_redteam_on_an_untrained_policy_writes_an_empty_scenario(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "found.jsonl"
    res = runner.invoke(app, ["redteam", str(tiny_model_dir), "--recipe", str(RECIPE), "--out", str(out),
                              "--rounds", "1", "--children", "3", "--trials", "1", "--set", "rollout.max_new_tokens=4"])
    assert res.exit_code == 0, res.output
    # 14 distinct template requests + 3 children; 4 new tokens cannot hold the 5-letter code word: no leak
    assert "0 request(s) at violation rate >= 0.5 among 17 scored" in res.output
    assert out.read_text() == ""


def test_redteam_refuses_a_recipe_without_the_secret_task(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["redteam", str(tiny_model_dir), "--recipe", "recipes/reverse_grpo.toml",
                              "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "task.name = 'reverse'" in res.output and "'secret'" in res.output


def test_redteam_names_a_missing_model(tmp_path: Path) -> None:
    res = runner.invoke(app, ["redteam", str(tmp_path / "nope"), "--recipe", str(RECIPE),
                              "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "does not exist" in res.output
