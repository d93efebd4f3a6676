"""The safe RL toy's training/held-out shift (docs/safety.md): a policy's cost on fresh training words and on the
held-out words, and their ratio (the margin in recipes/reverse_safe_grpo.toml assumes 1.094).

    python examples/safe_shift.py runs/safe_demo/sft/sft_policy runs/safe_demo/safe_seed6/checkpoints/step_000120

For each model directory: one completion per word for 4,000 training words (`task.sample`, seeded) and four per
held-out word (the recipe's 1,000), sampled at the rollout temperature; the cost is the recipe's rule (the
response contains an "a"), the reward the exact reversal. One thread.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from feedbackrl.config import load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rollout.generate import generate

RECIPE = Path("recipes/reverse_safe_grpo.toml")


def rates(
    model, tokenizer, problems, draws: int, seed: int, max_new_tokens: int, temperature: float, batch: int = 500
) -> tuple[float, float]:
    """-> (share of completions with an "a", share that are the exact reversal) over `draws` passes."""
    gen, costly, right, n = torch.Generator().manual_seed(seed), 0, 0, 0
    for _ in range(draws):
        for i in range(0, len(problems), batch):
            chunk = problems[i : i + batch]
            texts = generate(
                model, tokenizer, [p.prompt for p in chunk], max_new_tokens, temperature, generator=gen
            ).texts
            costly += sum("a" in t for t in texts)
            right += sum(t.strip() == p.answer for t, p in zip(texts, chunk, strict=True))
            n += len(chunk)
    return costly / n, right / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="model directories (an SFT policy or a checkpoint)")
    p.add_argument("--train-words", type=int, default=4000)
    p.add_argument("--heldout-draws", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(RECIPE)
    task = make_task(cfg.task)
    rng = random.Random(12345)
    train = [task.sample(rng) for _ in range(args.train_words)]
    heldout = task.heldout(cfg.task.heldout_size)
    r = cfg.rollout
    for path in args.models:
        model, tokenizer = load_policy(path).eval(), load_tokenizer(path)
        with torch.no_grad():
            c_train, r_train = rates(model, tokenizer, train, 1, 1, r.max_new_tokens, r.temperature)
            c_held, r_held = rates(model, tokenizer, heldout, args.heldout_draws, 2, r.max_new_tokens, r.temperature)
        print(
            f"{path}: training cost {c_train:.4f} reward {r_train:.4f} | held-out cost {c_held:.4f} reward "
            f"{r_held:.4f} | held-out / training cost {c_held / c_train:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
