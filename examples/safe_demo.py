"""The safe RL toy (docs/safety.md): unconstrained GRPO against GRPO-Lagrangian on word reversal, per seed.

    python examples/safe_demo.py --out runs/safe_demo                 # all runs, then the summary and the plot
    python examples/safe_demo.py --out runs/safe_demo --summary       # only the summary and the plot
    python examples/safe_demo.py --out runs/safe_demo --seeds 30 31 32 33 34 35  # not used to choose anything
    python examples/safe_demo.py --out runs/safe_demo_ppo --algo ppo --seeds 0 --sft runs/safe_demo/sft
                                                                      # PPO against PPO-Lagrangian

One SFT warm start (recipes/reverse_unsafe_grpo.toml's [sft], seed 0) is shared by every run (`--sft DIR`
reuses one already trained); then for each seed the unconstrained twin and the constrained recipe train from
it, write their held-out costs (safety_eval.jsonl) and go through the release test at delta = 0.1 (the
constrained recipe's [release]; the unconstrained run through `feedbackrl release` with the same threshold).
Writes OUT/summary.json, the plot (reward, cost and lambda over RL steps, seeds averaged, each seed faint;
docs/safety.png for GRPO, OUT/safety.png for PPO) and, with --results, a copy of the summary with its
provenance (date, commit, machine, load averages, command) for benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from feedbackrl.config import load_config
from feedbackrl.data.rows import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import machine, provenance  # noqa: E402

RECIPES = {  # algo -> (constrained, unconstrained twin, their names on the plot)
    "grpo": (Path("recipes/reverse_safe_grpo.toml"), Path("recipes/reverse_unsafe_grpo.toml"), "GRPO"),
    "ppo": (Path("recipes/reverse_safe_ppo.toml"), Path("recipes/reverse_unsafe_ppo.toml"), "PPO"),
}
SFT_RECIPE = RECIPES["grpo"][1]  # the warm start both algorithms share
SEEDS = (0, 1, 2)


def sh(*args: str) -> int:
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=False).returncode


def train_all(out: Path, algo: str, seeds: tuple[int, ...], sft: Path, threads: int = 1) -> None:
    safe, unsafe, _ = RECIPES[algo]
    cli = [sys.executable, "-m", "feedbackrl.cli"]
    one = ["--set", f"train.threads={threads}"]
    policy = ["--set", f"model.path={sft / 'sft_policy'}", "--set", "sft.steps=0", *one]
    heldout = ["--set", f"task.heldout_size={load_config(unsafe).task.heldout_size}"]  # the algo's held-out set
    steps = {"sft": (sft, ["--set", "algo.steps=0", *one]),  # SFT only: the shared warm start
             "start": (out / "start", [*policy, "--set", "algo.steps=0", *heldout])}  # its held-out reward, cost
    for name, (run_dir, extra) in steps.items():
        done = sft / "sft_policy" / "config.json" if name == "sft" else run_dir / "report.json"
        if not done.is_file() and sh(*cli, "train", str(SFT_RECIPE), "--out", str(run_dir), *extra) != 0:
            raise SystemExit(f"{run_dir} failed")
    threshold = load_config(safe).constraint.threshold
    for seed in seeds:
        for name, recipe in (("unsafe", unsafe), ("safe", safe)):
            run_dir = out / f"{name}_seed{seed}"
            args = ("train", str(recipe), "--out", str(run_dir), *policy, "--set", f"train.seed={seed}")
            if not (run_dir / "report.json").is_file():
                load = [round(x, 2) for x in os.getloadavg()]
                if sh(*cli, *args) != 0:
                    raise SystemExit(f"{run_dir} failed")
                load_after = [round(x, 2) for x in os.getloadavg()]
                (run_dir / "load_average.json").write_text(json.dumps({"start": load, "end": load_after}))
            if name == "unsafe":  # exit code 1 = refused: expected here
                sh(*cli, "release", str(run_dir), "--threshold", str(threshold), "--delta", "0.1")


def summary(out: Path, png: Path, algo: str, seeds: tuple[int, ...]) -> dict:
    safe = RECIPES[algo][0]
    start = json.loads((out / "start" / "report.json").read_text())["safety_eval"]
    rows: dict = {"algo": algo, "seeds": list(seeds), "constraint": load_config(safe).constraint.model_dump(),
                  "start": start, "runs": {}}
    for seed in seeds:
        for name in ("unsafe", "safe"):
            rep = json.loads((out / f"{name}_seed{seed}" / "report.json").read_text())
            se, rel = rep["safety_eval"], rep["release"]
            rows["runs"][f"{name}_seed{seed}"] = {
                "heldout_reward": se["reward_mean"], "heldout_cost": se["cost_mean"],
                "greedy_accuracy": rep["eval_after"]["accuracy"], "released": rel["released"], "bound": rel["bound"],
                "reward_gain": se["reward_mean"] - start["reward_mean"], "train_s": rep.get("train_seconds"),
                "load_average": _json_or_none(out / f"{name}_seed{seed}" / "load_average.json"),
                **_last_steps(out / f"{name}_seed{seed}" / "metrics.jsonl")}
    for name in ("unsafe", "safe"):
        gains = [rows["runs"][f"{name}_seed{s}"]["reward_gain"] for s in seeds]
        rows[f"{name}_mean_gain"] = sum(gains) / len(gains)
    rows["gain_ratio_per_seed"] = [rows["runs"][f"safe_seed{s}"]["reward_gain"] /
                                   rows["runs"][f"unsafe_seed{s}"]["reward_gain"] for s in seeds]
    rows["gain_ratio"] = rows["safe_mean_gain"] / rows["unsafe_mean_gain"]
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    plot(out, png, algo, seeds)
    return rows


def with_earlier(entry: dict, path: Path) -> dict:
    """`entry` with the results file's earlier entries kept under "earlier": the file's own entry unless it is
    the same measurement again (the same machine, commit and seeds: a rerun replaces it), and the entries it
    kept itself."""
    if not path.is_file():
        return entry
    old = json.loads(path.read_text())
    earlier = old.pop("earlier", [])
    same = [tuple(e.get("provenance", {}).get(k) for k in ("machine", "commit")) for e in (old, entry)]
    if same[0] != same[1] or old.get("seeds") != entry.get("seeds"):
        earlier = [old, *earlier]
    return {**entry, "earlier": earlier} if earlier else entry


def _last_steps(metrics: Path) -> dict[str, float]:
    """Means over the last 20 RL steps: the training cost, and lambda and the probe prompts' cost where logged."""
    rl = [r for r in read_jsonl(metrics) if r.get("phase") == "rl"][-20:]
    keys = {"cost/mean": "train_cost_last20", "constraint/lambda": "lambda_last20",
            "constraint/probe_cost": "probe_cost_last20"}
    return {name: sum(r[k] for r in rl) / len(rl) for k, name in keys.items() if rl and k in rl[0]}


def _json_or_none(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def plot(out: Path, png: Path, algo: str, seeds: tuple[int, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    safe, _, title = RECIPES[algo]
    for name, color in (("unsafe", "C0"), ("safe", "C1")):
        label = f"{title} (unconstrained)" if name == "unsafe" else f"{title}-Lagrangian"
        series: dict[str, list[list[float]]] = {"reward/mean": [], "cost/mean": [], "constraint/lambda": []}
        probes: list[list[float]] = []  # constraint.probe_prompts: what the multiplier stepped on
        for seed in seeds:
            rl = [r for r in read_jsonl(out / f"{name}_seed{seed}" / "metrics.jsonl") if r.get("phase") == "rl"]
            for key in series:
                if key in rl[0]:
                    ys = [r[key] for r in rl]
                    series[key].append(ys)
            if "constraint/probe_cost" in rl[0]:
                probes.append([r["constraint/probe_cost"] for r in rl])
        if probes:
            mean = [sum(col) / len(col) for col in zip(*probes, strict=True)]
            axes[1].plot(range(1, len(mean) + 1), _smooth(mean), color=color, linewidth=1.2, linestyle="--",
                         label=f"{label}: probe prompts' cost")
        for ax, key in zip(axes, series, strict=True):
            for ys in series[key]:
                ax.plot(range(1, len(ys) + 1), _smooth(ys), color=color, alpha=0.25, linewidth=0.8)
            if series[key]:
                mean = [sum(col) / len(col) for col in zip(*series[key], strict=True)]
                ax.plot(range(1, len(mean) + 1), _smooth(mean), color=color, linewidth=2, label=label)
    c = load_config(safe).constraint
    axes[1].axhline(c.threshold, color="k", linestyle=":", label=f"threshold {c.threshold:g}")
    aim = "the cost's upper bound" if c.bound_delta > 0 else "the multiplier"
    axes[1].axhline(c.threshold - c.margin, color="C1", linestyle="-.", alpha=0.6,
                    label=f"{aim} aims at {c.threshold - c.margin:.2f}")
    for ax, title in zip(axes, ("training reward (exact reversal)", "training cost (response has an 'a')",
                                "Lagrange multiplier lambda"), strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    day = datetime.now(UTC).date().isoformat()
    command = " ".join(["python", "examples/safe_demo.py", *sys.argv[1:]])
    fig.suptitle(f"reverse, seeds {', '.join(map(str, seeds))}, 10-step moving average; {day}, {machine()}, "
                 f"shared; commit {commit}\n{command}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def _smooth(xs: list[float], window: int = 10) -> list[float]:
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/safe_demo"))
    p.add_argument("--algo", choices=sorted(RECIPES), default="grpo",
                   help="grpo: GRPO against GRPO-Lagrangian; ppo: PPO against PPO-Lagrangian")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="RL seeds (train.seed)")
    p.add_argument("--sft", type=Path, default=None, help="the shared SFT warm start's run directory "
                   "(default OUT/sft; trained there when it has no sft_policy yet)")
    p.add_argument("--png", type=Path, default=None, help="default docs/safety.png for grpo, OUT/safety.png for ppo")
    p.add_argument("--results", type=Path, default=None,
                   help="also write the summary with its provenance here (e.g. benchmarks/results/safe_demo.json)")
    p.add_argument("--threads", type=int, default=1, help="train.threads of every run (default 1: one run at a "
                   "time on a shared machine; the tiny model's figures do not depend on it)")
    p.add_argument("--summary", action="store_true", help="only summarise runs already in --out")
    args = p.parse_args()
    prov = provenance()  # before anything is written: the commit the runs come from
    seeds = tuple(args.seeds)
    png = args.png or (Path("docs/safety.png") if args.algo == "grpo" else args.out / "safety.png")
    if not args.summary:
        train_all(args.out, args.algo, seeds, args.sft or args.out / "sft", args.threads)
    rows = summary(args.out, png, args.algo, seeds)
    if args.results:
        args.results.write_text(json.dumps(with_earlier({**rows, "provenance": prov}, args.results), indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
