"""Which labels teach a reward model? One step of the online loop, paired, with the hidden gold open.

From one set of `--base` random labels, add `--add` more chosen by each group below (every group
draws from the same pool of candidates, at most one pair per prompt), retrain the reward model from
the policy on base + added with two training seeds, and report held-out pairwise accuracy. The
labeller, pool, held-out set and base labels are shared, so the groups differ only in which pairs
were labelled.

Groups: the selection rules of `online.selection` (random, runner_up, active, contrast, bald, committee), and
oracle groups that peek at the hidden gold score, which no real rule can: `nontie` (pairs whose
two responses differ in gold), `biggap` (gold gap > 0.2), `smallgap` (0 < gap <= 0.2),
`rm_wrong` (the base reward model ranks them against gold), `long` (answers of 6+ letters).

    python examples/online_label_value.py --seed 0 --set model.path=runs/reward_model/sft_policy \\
        --set sft.steps=0

Prints one JSON line per group. docs/human_feedback.md ("Which labels teach") has the results.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from feedbackrl.algos.pair_selection import _pair_index
from feedbackrl.config import load_config
from feedbackrl.data.labeller import SimulatedLabeller, gold_score_for, sample_candidates
from feedbackrl.envs.registry import make_task
from feedbackrl.feedback.client import answer_rows
from feedbackrl.train.online_labels import (
    Fitted,
    bootstrap_members,
    candidate_covariance,
    candidate_scores,
    choose_pairs,
    fit_reward_model,
    heldout_pairs,
    with_gold,
)
from feedbackrl.train.preference import heldout_metrics
from feedbackrl.train.run import load_or_build

ORACLE = {
    "nontie": lambda x: x["gap"] != 0,
    "biggap": lambda x: abs(x["gap"]) > 0.2,
    "smallgap": lambda x: 0 < abs(x["gap"]) <= 0.2,
    "rm_wrong": lambda x: x["wrong"],
    "long": lambda x: x["length"] >= 6,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/online_rm.toml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=int, default=400, help="random labels every group starts from")
    ap.add_argument("--add", type=int, default=400, help="labels each group adds")
    ap.add_argument("--groups", nargs="+",
                    default=["random", "runner_up", "active", "contrast", "bald", "committee", *ORACLE])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(args.recipe, [*args.overrides, f"train.seed={args.seed}"])
    torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg.task)
    policy, tok = load_or_build(cfg, "runs/online_label_value")  # type: ignore[arg-type]
    policy.eval()
    gold, k, seed = gold_score_for(task, cfg.online.gold), cfg.online.candidates, args.seed
    heldout = heldout_pairs(cfg, policy, tok, task)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    problems = [task.sample(rng) for _ in range(2 * args.base + cfg.online.pool * args.add)]
    cands = sample_candidates(policy, tok, problems, k, cfg.rollout.max_new_tokens, cfg.rollout.temperature, gen)
    by_prompt = {p.prompt: p for p in problems}
    labeller = SimulatedLabeller(gold, cfg.online.temperature, seed=seed + 1, tie_margin=cfg.online.tie_margin)

    def label(p, a: str, b: str) -> list[dict]:
        return answer_rows(p.prompt, a, b, labeller.judge(p, a, b), cfg.online.train_on_ties)

    def fit(rows: list[dict], s: int):
        pairs = with_gold(rows, by_prompt, task, cfg.online.gold)
        return fit_reward_model(cfg, policy, tok, pairs, s).eval(), pairs

    base, used, spent = [], 0, 0
    while spent < args.base:  # the first prompts with a pair: one random pair each
        p, c = problems[used], cands[used]
        used += 1
        if len(c) >= 2:
            i, j = random.Random(p.prompt).sample(range(len(c)), 2)
            base += label(p, c[i], c[j])
            spent += 1
    pool_p, pool_c = problems[2 * args.base :], cands[2 * args.base :]
    rm0, pairs0 = fit(base, seed)
    scores, mask = candidate_scores(rm0, tok, pool_p, pool_c, k)
    print(json.dumps({"group": "base", "labels": spent, "pairs": sum(not x.get("tie") for x in base),
                      "accuracy": round(heldout_metrics(rm0, tok, heldout)["rm/heldout_accuracy"], 4)}), flush=True)

    def chosen_by_rule(rule: str) -> list[tuple[int, int, int]]:
        evidence = None
        if rule == "bald":
            evidence = candidate_covariance(Fitted(rm0, pairs0, []), tok, pool_p, pool_c, k,
                                            cfg.online.prior_precision)
        elif rule == "committee":  # the base model plus bootstrap members, as the online loop trains them
            members = bootstrap_members(cfg, policy, tok, pairs0)
            evidence = torch.stack([scores] + [candidate_scores(m, tok, pool_p, pool_c, k)[0] for m in members])
        prompts, pairs = choose_pairs(rule, scores, mask, args.add, torch.Generator().manual_seed(seed + 7), evidence)
        return [(b, i, j) for b, (i, j) in zip(prompts.tolist(), pairs.tolist(), strict=True)]

    def chosen_by_oracle(name: str) -> list[tuple[int, int, int]]:
        pool = []
        for b in range(len(pool_p)):
            for i, j in zip(*(t.tolist() for t in _pair_index(k)), strict=True):
                if mask[b, i] and mask[b, j]:
                    gap = gold(pool_p[b], pool_c[b][i]) - gold(pool_p[b], pool_c[b][j])
                    wrong = gap * (scores[b, i] - scores[b, j]).item() < 0
                    pool.append({"b": b, "i": i, "j": j, "gap": gap, "wrong": wrong,
                                 "length": len(pool_p[b].answer)})
        fits = [x for x in pool if ORACLE[name](x)]
        random.Random(name).shuffle(fits)
        seen, out = set(), []
        for x in fits:
            if x["b"] not in seen and len(out) < args.add:
                seen.add(x["b"])
                out.append((x["b"], x["i"], x["j"]))
        return out

    for group in args.groups:
        picks = chosen_by_oracle(group) if group in ORACLE else chosen_by_rule(group)
        added = [x for b, i, j in picks for x in label(pool_p[b], pool_c[b][i], pool_c[b][j])]
        gaps = [abs(gold(pool_p[b], pool_c[b][i]) - gold(pool_p[b], pool_c[b][j])) for b, i, j in picks]
        accs = [heldout_metrics(fit(base + added, s)[0], tok, heldout)["rm/heldout_accuracy"]
                for s in (seed, seed + 100)]
        ties = sum(g == 0 for g in gaps) / len(gaps)
        prefs = sum(not x.get("tie") for x in added)
        print(json.dumps({"group": group, "added": len(picks), "pairs": prefs, "gold_ties": round(ties, 3),
                          "gold_gap": round(sum(gaps) / len(gaps), 3), "accuracy": [round(a, 4) for a in accs],
                          "mean": round(sum(accs) / 2, 4)}), flush=True)


if __name__ == "__main__":
    main()
