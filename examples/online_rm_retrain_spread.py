"""How much does the online loop's reward model depend on its training settings and seed?

Labels `--labels` random pairs of the online recipe's policy once (seed 0's pool, the recipe's
labeller), then retrains the reward model on them with `--retrains` training seeds under each
setting and prints held-out accuracy: mean, standard deviation and seconds per fit.

    python examples/online_rm_retrain_spread.py --labels 800 --retrains 4 \\
        --set model.path=runs/reward_model/sft_policy --set sft.steps=0 \\
        --setting "" --setting algo.epochs=16 --setting algo.epochs=8,algo.lr=3e-4

Each `--setting` is a comma-separated list of overrides on top of `--set` ("" = the recipe as is).
docs/human_feedback.md ("A converged reward model") has the results.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from feedbackrl.config import load_config
from feedbackrl.data.labeller import SimulatedLabeller, gold_score_for, sample_candidates
from feedbackrl.envs.registry import make_task
from feedbackrl.train.online_labels import fit_reward_model, heldout_pairs, with_gold
from feedbackrl.train.preference import heldout_metrics
from feedbackrl.train.run import load_or_build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/online_rm.toml")
    ap.add_argument("--labels", type=int, default=800)
    ap.add_argument("--retrains", type=int, default=4)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--setting", dest="settings", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(args.recipe, args.overrides)
    torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg.task)
    policy, tok = load_or_build(cfg, "runs/online_rm_retrain_spread")  # type: ignore[arg-type]
    policy.eval()
    heldout = heldout_pairs(cfg, policy, tok, task)
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    problems = [task.sample(rng) for _ in range(int(1.3 * args.labels))]  # ~85% have a pair
    cands = sample_candidates(policy, tok, problems, cfg.online.candidates, cfg.rollout.max_new_tokens,
                              cfg.rollout.temperature, gen)
    labeller = SimulatedLabeller(gold_score_for(task, cfg.online.gold), cfg.online.temperature, seed=1)
    rows = []
    for p, c in zip(problems, cands, strict=True):
        if len(c) >= 2 and len(rows) < args.labels:
            i, j = random.Random(p.prompt).sample(range(len(c)), 2)
            chosen, rejected = labeller.choose(p, c[i], c[j])
            rows.append({"prompt": p.prompt, "chosen": chosen, "rejected": rejected})
    pairs = with_gold(rows, {p.prompt: p for p in problems}, task, cfg.online.gold)
    for setting in args.settings or [""]:
        extra = [x for x in setting.split(",") if x]
        run_cfg = load_config(args.recipe, args.overrides + extra)
        t0, accs = time.perf_counter(), []
        for seed in range(args.retrains):
            rm = fit_reward_model(run_cfg, policy, tok, pairs, seed).eval()
            accs.append(heldout_metrics(rm, tok, heldout)["rm/heldout_accuracy"])
        print(json.dumps({"setting": extra, "labels": len(pairs), "mean": round(statistics.mean(accs), 4),
                          "sd": round(statistics.stdev(accs), 4) if len(accs) > 1 else None,
                          "accuracy": [round(a, 4) for a in accs],
                          "s_per_fit": round((time.perf_counter() - t0) / args.retrains, 1)}), flush=True)


if __name__ == "__main__":
    main()
