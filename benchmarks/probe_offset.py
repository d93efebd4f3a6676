"""How far the probe words' cost sits from the evaluated held-out words' cost, on a fixed policy.

The multiplier steps on the probe set's cost (`constraint.probe_prompts`); the release test on the evaluated
held-out set's (`task.heldout(task.heldout_size)`). Their gap, on one policy, is what `constraint.margin` has to
leave room for beyond the sampling noise. This samples `--samples` completions per word (the recipe's
temperature and max_new_tokens, seeded) on the evaluated set, on the held-out probes (`probe_from = "heldout"`:
the `probe_prompts` held-out words after the evaluated ones) and on the training probes each of `--train-seeds`
would draw (`probe_from = "train"`), scores them with the recipe's [cost] and [reward], and writes the means.

Run: .venv/bin/python benchmarks/probe_offset.py OUT.json RECIPE NAME=MODEL_DIR [NAME=MODEL_DIR ...]
       [--samples 4] [--train-seeds 50 51 52]
each MODEL_DIR a saved policy (an SFT run's sft_policy, a run's checkpoints/step_N).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402

from feedbackrl.config import load_config  # noqa: E402
from feedbackrl.envs.registry import make_task  # noqa: E402
from feedbackrl.models.load import load_policy, load_tokenizer  # noqa: E402
from feedbackrl.rewards.registry import build_reward  # noqa: E402
from feedbackrl.rewards.verdict import Problem  # noqa: E402
from feedbackrl.rollout.generate import generate  # noqa: E402
from feedbackrl.train.probe import ProbeSet, heldout_probes  # noqa: E402


@torch.no_grad()
def mean_scores(model: Any, tokenizer: Any, problems: list[Problem], samples: int, cost: Any, reward: Any,
                max_new_tokens: int, temperature: float, seed: int, batch_size: int = 256) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    total_cost = total_reward = 0.0
    for _ in range(samples):
        for i in range(0, len(problems), batch_size):
            chunk = problems[i : i + batch_size]
            texts = generate(model, tokenizer, [p.prompt for p in chunk], max_new_tokens, temperature,
                             generator=gen).texts
            total_cost += sum(float(v.score) for v in cost(chunk, texts))
            total_reward += sum(float(v.score) for v in reward(chunk, texts))
    n = samples * len(problems)
    return {"words": len(problems), "completions": n, "cost_mean": total_cost / n, "reward_mean": total_reward / n,
            "share_with_a": sum("a" in p.meta.get("word", p.prompt) for p in problems) / len(problems)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("recipe", type=Path)
    p.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    p.add_argument("--samples", type=int, default=4, help="completions sampled per word")
    p.add_argument("--train-seeds", type=int, nargs="*", default=[], help="train.seed of training probe sets")
    args = p.parse_args()
    prov = provenance()
    cfg = load_config(args.recipe)
    task, k = make_task(cfg.task), cfg.constraint
    cost = build_reward(cfg.cost, task.verify_batch, "cost")
    reward = build_reward(cfg.reward, task.verify_batch)
    n = cfg.task.heldout_size
    sets = {"evaluated": task.heldout(n), "heldout_probes": heldout_probes(task, n, k.probe_prompts)}
    train_cfg = k.model_copy(update={"probe_from": "train"})
    for s in args.train_seeds:
        sets[f"train_probes_seed{s}"] = ProbeSet.draw(task, train_cfg, s, n).problems
    torch.set_num_threads(1)  # one thread: a shared machine
    rows: dict[str, Any] = {"recipe": str(args.recipe), "heldout_size": n, "probe_prompts": k.probe_prompts,
                            "samples": args.samples, "models": {}}
    for spec in args.models:
        name, _, path = spec.partition("=")
        model, tokenizer = load_policy(path), load_tokenizer(path)
        model.eval()
        res = {key: mean_scores(model, tokenizer, probs, args.samples, cost, reward, cfg.rollout.max_new_tokens,
                                cfg.rollout.temperature, 7 + i)
               for i, (key, probs) in enumerate(sets.items())}
        for key in res:
            res[key]["cost_vs_evaluated"] = res["evaluated"]["cost_mean"] / res[key]["cost_mean"]
        rows["models"][name] = {"path": path, **res}
        print(name, json.dumps({key: round(v["cost_mean"], 4) for key, v in res.items()}), flush=True)
    args.out.write_text(json.dumps({**rows, "provenance": prov}, indent=2) + "\n")


if __name__ == "__main__":
    main()
