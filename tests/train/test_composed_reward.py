"""GRPO against a reward composed in a recipe's [reward] section (gate + weighted sum of math and instruction
checks) on a JSONL dataset task whose rows carry a math answer and their own constraints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from feedbackrl.config import build_config
from feedbackrl.envs.dataset import DatasetError
from feedbackrl.envs.registry import make_task
from feedbackrl.log import MemorySink
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rewards.registry import build_reward, part_metrics
from feedbackrl.train.grpo import train_grpo

REWARD = {
    "source": "gate",
    "gate": {"source": "regex", "pattern": r"\d", "mode": "search"},  # some digit: an answer was attempted
    "reward": {"source": "weighted_sum", "parts": {
        "math": {"source": "math", "weight": 2},
        "short": {"source": "length_chars", "relation": "at most", "num": 2},
        "commas": {"source": "no_commas"},
        "own": {"source": "constraints"},  # the row's constraints column
    }},
}


def write_rows(path: Path) -> Path:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "constraints": [{"id": "no_digits"}] if a % 2 else
             [{"id": "length_chars", "relation": "at least", "num": 1}]} for a in range(6) for b in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def recipe(data: Path) -> dict:
    return {"task": {"name": "dataset", "options": {"path": str(data), "verifier": "math",
                                                    "meta_fields": ["constraints"]}},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 3},
            "algo": {"name": "grpo", "steps": 3, "lr": 1e-3}, "reward": REWARD, "train": {"seed": 0}}


def test_grpo_steps_against_a_composed_reward(tmp_path: Path) -> None:
    cfg = build_config(recipe(write_rows(tmp_path / "add.jsonl")))
    task = make_task(cfg.task)
    reward = build_reward(cfg.reward, task.verify_batch)
    seen = []

    def scorer(problems, completions):
        verdicts = reward(problems, completions)
        seen.append(list(zip(problems, completions, verdicts, strict=True)))
        return verdicts, part_metrics(verdicts)

    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    sink = MemorySink()
    train_grpo(cfg, model, tok, task, tmp_path / "run", sink, scorer=scorer)

    assert sorted(sink.by_step) == [1, 2, 3] and len(seen) == 3
    opened = 0
    for (step, metrics), batch in zip(sorted(sink.by_step.items()), seen, strict=True):
        scores = [v.score for _, _, v in batch]
        assert metrics["reward/mean"] == pytest.approx(sum(scores) / len(scores)), step
        assert metrics["reward/gate/pass_rate"] == sum(bool(re.search(r"\d", c)) for _, c, _ in batch) / 16
        for problem, text, verdict in batch:
            parts = verdict.details["parts"]
            if not re.search(r"\d", text):
                assert verdict.score == 0.0 and set(parts) == {"gate"}, text
                continue
            opened += 1
            inner = parts["reward"]["details"]
            assert inner["weights"] == {"math": 0.4, "short": 0.2, "commas": 0.2, "own": 0.2}
            assert inner["parts"]["math"]["details"]["gold"] == problem.answer
            own = inner["parts"]["own"]["details"]["constraints"]
            assert [c["id"] for c in own] == [s["id"] for s in problem.meta["constraints"]]
            assert inner["parts"]["commas"]["passed"] is ("," not in text)
            assert verdict.score == pytest.approx(sum(inner["weights"][n] * inner["parts"][n]["score"]
                                                      for n in inner["weights"]))
    assert opened > 0, "no completion opened the gate: the test checks nothing behind it"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_bad_constraints_cell_fails_at_load_naming_the_row(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "add.jsonl")
    lines = data.read_text().splitlines()
    lines[3] = json.dumps({"prompt": "1+1=", "answer": "2", "constraints": [{"id": "no_comas"}]})
    data.write_text("\n".join(lines))
    with pytest.raises(DatasetError, match=r"row 3 column 'constraints': constraint #0: unknown constraint id "
                                           r"'no_comas'; allowed: \["):
        make_task(build_config(recipe(data)).task)


RECIPE = """
[task]
name = "dataset"
heldout_size = 4
options = {{ path = "{data}", verifier = "math", meta_fields = ["constraints"] }}

[rollout]
prompts_per_step = 4
group_size = 4
max_new_tokens = 3

[algo]
name = "grpo"
steps = 2

[train]
threads = 1

[reward]
source = "gate"
gate = {{ source = "regex", pattern = '\\d', mode = "search" }}

[reward.reward]
source = "weighted_sum"
parts.math = {{ source = "math", weight = 2 }}
parts.short = {{ source = "length_chars", relation = "at most", num = 2 }}
parts.commas = {{ source = "no_commas" }}
"""


def test_feedbackrl_train_on_a_recipe_with_a_composed_reward(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from feedbackrl.cli import app
    from feedbackrl.data.rows import read_jsonl

    recipe = tmp_path / "composed.toml"
    recipe.write_text(RECIPE.format(data=write_rows(tmp_path / "add.jsonl")))
    result = CliRunner().invoke(app, ["train", str(recipe), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rl = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        # a closed gate scores 0 and an open one at most 1, so the mean is at most the gate's pass rate; the
        # inner reward's mean is over open completions only
        assert 0 <= r["reward/mean"] <= r["reward/gate/pass_rate"] <= 1
        assert r["reward/mean"] == pytest.approx(r["reward/gate/pass_rate"] * r["reward/reward/mean"])
    assert any(r["reward/gate/pass_rate"] > 0 for r in rl), "no completion opened the gate"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["reward"]["reward"]["parts"]["short"] == {"source": "length_chars", "relation": "at most",
                                                            "num": 2}
