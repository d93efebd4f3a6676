"""The secret recipe through the run path: the leak cost reaches the batch, the multiplier and the safety eval."""

from pathlib import Path

import pytest

import feedbackrl
from feedbackrl.data.rows import read_jsonl

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "secret_safe_grpo.toml"


@pytest.mark.slow  # about 2 min on a loaded 2-core machine
def test_secret_recipe_runs_two_constrained_steps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = feedbackrl.train(RECIPE, out=out, overrides=[
        "sft.steps=2", "sft.batch_size=4", "algo.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=6", "task.heldout_size=8", "constraint.window=4"])
    rl = [r for r in read_jsonl(out / "metrics.jsonl") if r.get("phase") == "rl"]
    assert len(rl) == 2
    assert all("cost/mean" in r and "constraint/lambda" in r for r in rl)
    rows = read_jsonl(out / "safety_eval.jsonl")
    assert len(rows) == 8 and all(r["cost"] in (0.0, 1.0) for r in rows)
    assert report["release"]["n"] == 8
