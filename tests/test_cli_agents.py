"""`feedbackrl train` and `feedbackrl eval` on an episodic task: the run path plays episodes,
writes their transcripts, and eval reports success, turns, tool calls and tool errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.episodes.multi_turn import read_transcripts

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TINY = ["sft.steps=3", "sft.batch_size=8", "sft.warmup_steps=0", "algo.steps=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "task.heldout_size=4", "eval.pass_k=2", "eval.batch_size=8", "train.threads=1"]


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_train_then_eval_the_calculator_recipe(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", str(ROOT / "recipes" / "calculator_grpo.toml"), "--out", str(out),
                                 *_sets(TINY)])
    assert result.exit_code == 0, result.output
    steps = [s for s, _ in read_transcripts(out / "episodes.jsonl")]
    assert steps == [1] * 4 + [2] * 4
    report = json.loads((out / "report.json").read_text())
    assert "episode/success_rate" in json.dumps(report)
    ckpt = sorted((out / "checkpoints").iterdir())[-1]
    saved = tmp_path / "eval.json"
    result = runner.invoke(app, ["eval", str(ckpt), "--recipe", str(ROOT / "recipes" / "calculator_grpo.toml"),
                                 "--out", str(saved), *_sets(["task.heldout_size=4", "eval.pass_k=2",
                                                              "train.threads=1"])])
    assert result.exit_code == 0, result.output
    got = json.loads(saved.read_text())
    assert got["n"] == 4 and got["accuracy"] == got["episode/success_rate"]
    for key in ("episode/turns_mean", "episode/tool_calls_mean", "episode/tool_error_rate", "episode/end/answered"):
        assert 0.0 <= got[key] <= 3.0, key
    assert all(s["end"] in ("answered", "truncated", "out_of_turns", "error") for s in got["samples"])
