"""SFT, then GRPO against the reward a recipe's [reward] section composes; prints the reward per part.

    python examples/composed_reward.py recipes/sums_composed_reward.toml [--set train.seed=1 ...]

Uses the Python API: `build_reward(cfg.reward, task.verify_batch)` is the whole reward, and
`part_metrics` logs each part's mean and pass rate beside `reward/mean`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from feedbackrl.config import load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.log import MemorySink
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rewards.registry import build_reward, part_metrics
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.sft import sft_warmstart


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def main(recipe: str, overrides: list[str]) -> None:
    cfg = load_config(recipe, overrides)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg.task)
    reward = build_reward(cfg.reward, task.verify_batch)
    tok = build_tokenizer()
    model = build_model(tok, cfg.model.size, seed=cfg.model.init_seed)
    sink = MemorySink()
    sft_warmstart(model, tok, task, cfg.sft, cfg.train.seed, sink)

    def scorer(problems, completions):
        verdicts = reward(problems, completions)
        return verdicts, part_metrics(verdicts)

    with tempfile.TemporaryDirectory() as out:
        train_grpo(cfg, model, tok, task, Path(out), sink, scorer=scorer)
    rows = [m for _, m in sorted(sink.by_step.items()) if "reward/mean" in m]
    k = max(1, len(rows) // 4)
    for key in ("reward/mean", "reward/gate/pass_rate", "reward/reward/pass_rate"):
        print(f"{key}: first {k} steps {mean(rows[:k], key):.3f} -> last {k} steps {mean(rows[-k:], key):.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    main(args[0], sets)
