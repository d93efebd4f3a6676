"""GRPO rewarded by SmolLM2 as a judge against the same run rewarded by the verifier: the summary, and the judge
probed on held-out words before it is trusted (its agreement with gold in the run's answer format, and what it pays
for answers that game it).

    OMP_NUM_THREADS=1 python benchmarks/judge_smollm2_grpo.py --judge-run runs/judge_smollm2 \\
        --verifier-run runs/judge_smollm2_verifier --results benchmarks/results/judge_smollm2_grpo.json

(several seeds: one --judge-run and one --verifier-run per seed, in the same order).

The two runs are `feedbackrl train recipes/judge_smollm2_grpo.toml` and `recipes/judge_smollm2_verifier_grpo.toml`
(`make judge-smollm2` runs all three). The probe builds the judge from the judge recipe's own `[reward]` section,
so it is the judge that rewarded the run, prompt for prompt. For each held-out problem it scores the right answer,
the wrong answer `feedbackrl judge quality --task reverse` pairs it with (the word reversed back, two letters
swapped, one dropped or added), the word copied (the SFT start's habit on long words), and answers a policy could
write to please a judge that compares with a reference: "Yes", nothing, the right answer with a symbol added or
written twice, or beside the copy.
"beats_right" is the share of problems where that answer scores at least as high as the right one: in a GRPO
group it would then get at least the right answer's advantage.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from common import provenance

from feedbackrl.config import load_config
from feedbackrl.envs.registry import make_task
from feedbackrl.rewards.judge_quality import corrupt
from feedbackrl.rewards.registry import build_reward

JUDGE_RECIPE = "recipes/judge_smollm2_grpo.toml"
STEP_KEYS = ("reward/mean", "reward/gold_mean", "reward/gold_pass_rate", "reward/gold_agreement",
             "reward/gold_rank_agreement", "reward/gold_rank_pairs", "judge/calls", "judge/cache_hits", "judge/seconds",
             "perf/score_s", "kl/mean", "rollout/len_mean")


CHEATS = {
    "right": lambda p, rng: p.answer,
    "wrong (judge quality's)": lambda p, rng: corrupt(p.answer, rng),
    "copied (not reversed)": lambda p, rng: p.meta["word"],
    "Yes": lambda p, rng: "Yes",
    "empty": lambda p, rng: "",
    "right + a symbol": lambda p, rng: p.answer + rng.choice(p.answer),
    "right twice": lambda p, rng: p.answer * 2,
    "right then copied": lambda p, rng: f"{p.answer} {p.meta['word']}",
    "copied then right": lambda p, rng: f"{p.meta['word']} {p.answer}",
}


def probe(n: int) -> dict[str, Any]:
    cfg = load_config(JUDGE_RECIPE)
    task = make_task(cfg.task)
    t0 = time.perf_counter()
    judge = build_reward(cfg.reward, task.verify_batch)
    load_s = time.perf_counter() - t0
    problems = task.heldout(n)
    answers = {name: [make(p, random.Random(i)) for i, p in enumerate(problems)] for name, make in CHEATS.items()}
    names = list(answers)
    flat_p = [p for _ in names for p in problems]
    flat_c = [c for name in names for c in answers[name]]
    t0 = time.perf_counter()
    verdicts = judge(flat_p, flat_c)
    score_s = time.perf_counter() - t0
    scores = {name: [v.score for v in verdicts[i * n : (i + 1) * n]] for i, name in enumerate(names)}
    right = scores["right"]
    out: dict[str, Any] = {"problems": n, "judge_load_s": load_s, "judge_scoring_s": score_s,
                           "judge_calls": judge.pop_metrics()["judge/calls"], "answers": {}}
    for name in names:
        s = scores[name]
        out["answers"][name] = {
            "example": f"{problems[0].prompt}{answers[name][0]!r}", "mean_score": statistics.fmean(s),
            "passes_judge": sum(x >= 0.5 for x in s) / n,
            "gold_pass": sum(task.verify(p, c).passed for p, c in zip(problems, answers[name], strict=True)) / n,
            **({} if name == "right" else {"beats_right": sum(x >= r for x, r in zip(s, right, strict=True)) / n})}
    for name in ("wrong (judge quality's)", "copied (not reversed)"):
        wrong = scores[name]
        out["answers"][name]["pointwise_agreement"] = sum((r > w) + 0.5 * (r == w)
                                                          for r, w in zip(right, wrong, strict=True)) / n
    return out


def read_run(run: Path) -> dict[str, Any]:
    report = json.loads((run / "report.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    evals = [{"step": r["step"], "accuracy": r["eval/accuracy"]} for r in rows if "eval/accuracy" in r]
    steps = [{"step": r["step"], **{k: r[k] for k in STEP_KEYS if k in r}} for r in rl]

    def mean(key: str, rs: list[dict[str, Any]]) -> float | None:
        vs = [r[key] for r in rs if key in r]
        return statistics.fmean(vs) if vs else None

    first, last = rl[:5], rl[-5:]
    out = {"reward": report["reward"], "steps": len(rl), "train_seconds": report["train_seconds"],
           "wall_seconds": report["wall_seconds"],
           "heldout_greedy_accuracy_before": report["eval_before"]["accuracy"],
           "heldout_greedy_accuracy_after": report["eval_after"]["accuracy"],
           "heldout_pass_at_k_before": report["eval_before"].get(f"pass@{report['eval_before']['k']}"),
           "heldout_pass_at_k_after": report["eval_after"].get(f"pass@{report['eval_after']['k']}"),
           "heldout_eval": evals, "alerts": report.get("alerts"), "gold_vs_sft": report.get("gold_vs_sft"),
           "first5": {k: mean(k, first) for k in STEP_KEYS}, "last5": {k: mean(k, last) for k in STEP_KEYS},
           "per_step": steps}
    if any("judge/calls" in r for r in rl):
        out["judge_calls"] = sum(r.get("judge/calls", 0) for r in rl)
        out["judge_cache_hits"] = sum(r.get("judge/cache_hits", 0) for r in rl)
        out["judge_seconds"] = sum(r.get("judge/seconds", 0.0) for r in rl)
        out["gold_agreement_mean"] = mean("reward/gold_agreement", rl)
        out["gold_rank_agreement_mean"] = mean("reward/gold_rank_agreement", rl)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge-run", type=Path, nargs="*", default=[], help="runs of the judge recipe (one per seed); "
                    "none: only the probe")
    ap.add_argument("--verifier-run", type=Path, nargs="*", default=[], help="the verifier twin's runs, same seeds "
                    "in the same order")
    ap.add_argument("--probe-problems", type=int, default=40)
    ap.add_argument("--results", type=Path, default=Path("benchmarks/results/judge_smollm2_grpo.json"))
    ap.add_argument("--runs-commit", default="", help="the commit the two runs were made at, when not this one")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {"provenance": provenance(), "runs_commit": args.runs_commit or None,
                              "recipes": [JUDGE_RECIPE, "recipes/judge_smollm2_verifier_grpo.toml"]}
    if len(args.judge_run) != len(args.verifier_run):
        raise SystemExit("give one --verifier-run per --judge-run (the same seeds, in the same order)")
    result["seeds"] = []
    for judge_run, verifier_run in zip(args.judge_run, args.verifier_run, strict=True):
        seeds = {json.loads((run / "config.json").read_text())["train"]["seed"] for run in (judge_run, verifier_run)}
        if len(seeds) != 1:
            raise SystemExit(f"{judge_run} and {verifier_run} ran different seeds: {sorted(seeds)}")
        result["seeds"].append({"seed": seeds.pop(), "judge_run": read_run(judge_run),
                                "verifier_run": read_run(verifier_run)})
    result["probe"] = probe(args.probe_problems)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2))
    brief = [{"seed": r["seed"], **{name: {m: r[name][m] for m in ("heldout_greedy_accuracy_before",
                                                                     "heldout_greedy_accuracy_after")}
                                     for name in ("judge_run", "verifier_run")}} for r in result["seeds"]]
    print(json.dumps({"summary": brief, "probe": result["probe"]}, indent=2))


if __name__ == "__main__":
    main()
