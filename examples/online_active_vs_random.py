"""Pair-selection rules compared in the online reward-model loop: several seeds per rule, then a
table of labels-to-reach-accuracy and a plot of held-out accuracy against labels.

    python examples/online_active_vs_random.py --out runs/online_sweep --seeds 0 1 2 --jobs 2 \\
        --set model.path=runs/reward_model/sft_policy --set sft.steps=0 --plot docs/online_rm.png

Each run is `feedbackrl train recipes/online_rm.toml --out OUT/<rule>_s<seed>`; a run that
has started (metrics.jsonl exists) is never started again, so two sweeps over the same OUT do not
collide. `--summarise-only` redraws from finished runs.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from feedbackrl.train.online_labels import ACCURACY_MARKS, summarise

ROOT = Path(__file__).resolve().parent.parent


def run_one(out: Path, rule: str, seed: int, overrides: list[str]) -> Path:
    run_dir = out / f"{rule}_s{seed}"
    if (run_dir / "report.json").is_file():
        return run_dir
    if (run_dir / "metrics.jsonl").is_file():  # another sweep is running it, or it crashed: never run twice
        print(f"skipping {run_dir}: started but unfinished (delete the directory to run it again)")
        return run_dir
    cmd = [str(Path(sys.executable).parent / "feedbackrl"), "train", str(ROOT / "recipes" / "online_rm.toml"),
           "--out", str(run_dir), "--set", f"online.selection={rule}", "--set", f"train.seed={seed}"]
    for item in overrides:
        cmd += ["--set", item]
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "log.txt").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return run_dir


def rounds(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "online"]


def run_summary(run_dir: Path, marks: tuple[float, ...] = ACCURACY_MARKS) -> dict:
    """The run's report plus labels-to-reach each of `marks` and the last round's label statistics."""
    rows = rounds(run_dir)
    report = json.loads((run_dir / "report.json").read_text())["online"]
    return {**report, **summarise(rows, marks), "gold_ties": rows[-1].get("labels/gold_ties", 0.0),
            "pairs": rows[-1].get("pairs", rows[-1]["labels"])}


def label_stats(run_dir: Path, temperature: float = 0.05) -> dict[int, dict[str, float]]:
    """Per round, over the items posted: share of gold ties, mean gold gap, expected share of labels
    that agree with gold (max(p, 1 - p) under the labeller's choice model) and the reward model's
    certainty |P(first > second) - 0.5|. Reverse task only: the gold answer is the reversed prompt; the
    gold is the run's (`online.gold`: graded, or pass/fail)."""
    from feedbackrl.data.labeller import choice_probability, reverse_gold
    from feedbackrl.rewards.verdict import Problem

    def gold(problem: Problem, text: str) -> float:
        return float(text.strip() == problem.answer) if kind == "verifier" else reverse_gold(problem, text)

    kind = json.loads((run_dir / "config.json").read_text()).get("online", {}).get("gold", "task")
    project = json.loads((run_dir / "report.json").read_text())["online"]["project_id"]
    con = sqlite3.connect(f"file:{run_dir / 'labels.db'}?mode=ro", uri=True)
    per_round: dict[int, list[tuple[float, float, float, float]]] = defaultdict(list)
    for prompt, responses, meta in con.execute("SELECT prompt, responses, meta FROM items WHERE project_id = ? "
                                               "ORDER BY id", (project,)):
        (a, b), meta = json.loads(responses), json.loads(meta)
        problem = Problem(prompt, prompt.removesuffix("=")[::-1])
        g_a, g_b = gold(problem, a), gold(problem, b)
        p = choice_probability(g_a, g_b, temperature)
        per_round[meta["round"]].append((float(g_a == g_b), abs(g_a - g_b), max(p, 1 - p),
                                         abs(meta["rm_p_first"] - 0.5)))
    con.close()
    keys = ("gold_ties", "gold_gap", "label_reliability", "rm_certainty")
    return {r: {k: sum(x[i] for x in xs) / len(xs) for i, k in enumerate(keys)} for r, xs in sorted(per_round.items())}


def label_table(runs: dict[str, list[Path]]) -> str:
    """Mean over seeds and rounds 2+ (round 1 is random for every rule) of `label_stats`."""
    lines = ["| selection | gold ties | gold gap | labels agreeing with gold (expected) | reward-model certainty |",
             "|---|---|---|---|---|"]
    for rule, dirs in runs.items():
        rows = [v for d in dirs for r, v in label_stats(d).items() if r > 1]
        if rows:
            mean = {k: sum(x[k] for x in rows) / len(rows) for k in rows[0]}
            lines.append(f"| {rule} | {mean['gold_ties']:.3f} | {mean['gold_gap']:.3f} | "
                         f"{mean['label_reliability']:.3f} | {mean['rm_certainty']:.4f} |")
    return "\n".join(lines)


def table(reports: dict[str, list[dict]], marks: tuple[float, ...] = ACCURACY_MARKS) -> str:
    head = "| selection | seed | " + " | ".join(f"labels to {m:g}" for m in marks) + \
        " | labels | preference pairs | final accuracy | final gold agreement | gold ties in labels | wall s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for rule, reps in reports.items():
        for r in reps:
            cells = " | ".join(str(r[f"labels_to_{m:g}"] or "never") for m in marks)
            lines.append(f"| {rule} | {r['seed']} | {cells} | {r['final_labels']} | {r['pairs']} | "
                         f"{r['final_accuracy']:.3f} | "
                         f"{r['final_gold_agreement']:.3f} | {r['gold_ties']:.2f} | "
                         f"{r['wall_seconds']:.0f} |")
    return "\n".join(lines)


def mean_table(runs: dict[str, list[Path]]) -> str:
    """Held-out accuracy at each label count, mean over the seeds that reached it."""
    curves = {rule: [{r["labels"]: r["rm/heldout_accuracy"] for r in rounds(d)} for d in dirs]
              for rule, dirs in runs.items() if dirs}
    counts = sorted({n for cs in curves.values() for c in cs for n in c if n > 0})
    lines = ["| labels | " + " | ".join(str(n) for n in counts) + " |", "|---|" + "---|" * len(counts)]
    for rule, cs in curves.items():
        cells = []
        for n in counts:
            xs = [c[n] for c in cs if n in c]
            cells.append(f"{sum(xs) / len(xs):.3f}" if xs else "")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, list[Path]], png: Path, ceiling: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for i, (rule, dirs) in enumerate(runs.items()):
        curves = {"rm/heldout_accuracy": [], "rm/heldout_gold_agreement": []}
        for d in dirs:
            rows = rounds(d)
            for ax, key in zip(axes, curves, strict=True):
                ax.plot([r["labels"] for r in rows], [r[key] for r in rows], color=f"C{i}", alpha=0.25, lw=0.8)
                curves[key].append([(r["labels"], r[key]) for r in rows])
        for ax, runs_xy in zip(axes, curves.values(), strict=True):
            n = min(len(c) for c in runs_xy)
            xs = [runs_xy[0][j][0] for j in range(n)]
            ys = [sum(c[j][1] for c in runs_xy) / len(runs_xy) for j in range(n)]
            ax.plot(xs, ys, "o-", color=f"C{i}", lw=2, label=f"{rule} (mean of {len(runs_xy)} seeds)")
    titles = (f"held-out pairwise accuracy (labeller-noise ceiling {ceiling:.3f})", "held-out agreement with gold")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xlabel("labels")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/online_sweep"))
    ap.add_argument("--rules", nargs="+", default=["active", "random"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="passed to every run")
    ap.add_argument("--plot", type=Path, default=None, help="write the plot here (default OUT/online_rm.png)")
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("--marks", nargs="+", type=float, default=list(ACCURACY_MARKS),
                    help="held-out accuracies to report labels-to-reach for")
    args = ap.parse_args()
    jobs = [(rule, seed) for seed in args.seeds for rule in args.rules]
    if not args.summarise_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: run_one(args.out, job[0], job[1], args.overrides), jobs))
    runs = {rule: [args.out / f"{rule}_s{s}" for s in args.seeds
                   if (args.out / f"{rule}_s{s}" / "report.json").is_file()] for rule in args.rules}
    marks = tuple(args.marks)
    reports = {rule: [run_summary(d, marks) for d in dirs] for rule, dirs in runs.items()}
    text = table(reports, marks) + "\n\n" + mean_table(runs) + "\n\n" + label_table(runs)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    ceiling = next(r["heldout_ceiling"]["expected"] for reps in reports.values() for r in reps)
    plot(runs, args.plot or args.out / "online_rm.png", ceiling)


if __name__ == "__main__":
    main()
