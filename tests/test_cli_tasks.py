"""`feedbackrl tasks` lists what a recipe can name: tasks, reward sources, algorithms, with their options."""

from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import ALGO_NAMES
from feedbackrl.envs.registry import TASKS
from feedbackrl.rewards.registry import REWARDS


def test_tasks_lists_every_task_reward_source_and_algorithm_with_options():
    res = CliRunner().invoke(app, ["tasks"])
    assert res.exit_code == 0, res.output
    out = res.output
    lines = out.splitlines()
    for name in TASKS:
        assert f"  {name}: " in out, name
    for name in REWARDS:
        assert f"  {name}: " in out, name
    for name in ALGO_NAMES:
        assert any(line.startswith(f"  {name}: ") for line in lines), name
    rg = lines[lines.index(next(line for line in lines if line.startswith("  reasoning_gym: "))) + 1]
    assert "dataset, config, prompt_template='{question}'" in rg and "verifier='score_answer'" in rg
    math = lines[lines.index(next(line for line in lines if line.startswith("  math: "))) + 1]
    assert math.strip() == "options: order=None, timeout_s=3.0, max_answer_chars=500"
    grpo = next(line for line in lines if line.startswith("  grpo: "))
    assert "steps=100 (training steps (one rollout batch each))" in grpo and "kl_coef=0.0" in grpo
