"""End to end through the run path: the planted length hack recipe is stopped by its monitors."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedbackrl.config import load_config
from feedbackrl.data.rows import read_jsonl

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "planted_length_grpo.toml"


@pytest.mark.slow
def test_the_length_hack_recipe_is_stopped_before_gold_collapses(tmp_path):
    from feedbackrl.train.run import run

    cfg = load_config(RECIPE, ["train.threads=1", "eval.every=0"])
    run(cfg, tmp_path)
    alerts = read_jsonl(tmp_path / "alerts.jsonl")
    rl = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("phase") == "rl"]
    stop = [a for a in alerts if a["action"] == "stop"]
    assert stop and stop[0]["step"] == rl[-1]["step"] < cfg.algo.steps, (alerts, len(rl))
    gold = [r["monitor/gold_mean"] for r in rl]
    # the run stopped while the gold sample was still near its start, not after it collapsed to 0
    assert sum(gold[-3:]) / 3 > 0.5 * sum(gold[:3]) / 3, gold
