"""Preference learning side by side: ours (`control_ppo`, control.reward = "preferences") against imitation's
`PreferenceComparisons` with Stable-Baselines3's PPO, same environment, label budget, PPO steps and seeds.

Run: make imitation-venv && .venv/bin/python benchmarks/bench_imitation.py [--envs cartpole,fixed]
     [--budgets 50,150,400] [--seeds 3]
Writes benchmarks/results/imitation.json (after every run, provenance included) and docs/imitation.png.

- imitation 1.0.1 pins gymnasium~=0.29 and stable-baselines3~=2.2.1, so it runs in its own virtualenv
  (`.venv-imitation`, `make imitation-venv`) as a subprocess: benchmarks/imitation_side.py, whose docstring
  lists its settings. Ours runs here, on gymnasium 1.x. Classic control is the same in both gymnasium
  versions; before any training this script steps one seeded episode of each environment on both sides under
  the same actions and records the largest difference in observations and rewards (0 expected).
- environments: "cartpole" is CartPole-v1 (variable horizon: the episode ends when the pole falls; imitation
  needs allow_variable_horizon=True, as its own `cartpole` config sets); "fixed" is the fixed-horizon
  CartPole of the `seals` package (`seals/CartPole-v0` there, `feedbackrl.control.fixed_horizon` here: 500
  steps, reward 1 while upright), the kind of environment imitation's preference comparisons are built for.
- the teacher is the same on both sides: Boltzmann-rational on the true segment returns, P(first) =
  sigmoid(R_1 - R_2) sampled (imitation's `SyntheticGatherer(temperature=1)`; ours `teacher.beta = 1`, no
  mistakes, no skips, no equal labels).
- each side's own way of choosing and scheduling labels: ours the recipe's (ensemble disagreement, 8 rounds
  over the first half of training, equal shares), imitation's its script's defaults (random fragments, 10%
  up front and a hyperbolic schedule over the whole run).
- 51,200 PPO steps each (50 updates of 8 x 128); the environment steps each side really took are recorded
  (imitation samples extra episodes to label when PPO's last rollout holds too few finished ones).
- true return: greedy, one episode on each of 10 held-out environments seeded seed + 10,000 + i, before
  training and every 5,120 PPO steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULT_TAG, provenance, setup_threads  # noqa: E402

from feedbackrl.config import load_config  # noqa: E402
from feedbackrl.train.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "imitation.json"
FIGURE = ROOT / "docs" / "imitation.png"
IMITATION_PY = ROOT / ".venv-imitation" / "bin" / "python"
ENVS = {  # name -> (our gymnasium id, imitation's)
    "cartpole": ("CartPole-v1", "CartPole-v1"),
    "fixed": ("feedbackrl.control.fixed_horizon:CartPoleFixedHorizon-v0", "seals/CartPole-v0"),
}


def imitation_side(*args: str) -> dict[str, Any]:
    if not IMITATION_PY.exists():
        raise SystemExit(f"{IMITATION_PY.relative_to(ROOT)} is missing: run `make imitation-venv` first")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    proc = subprocess.run([str(IMITATION_PY), str(ROOT / "benchmarks" / "imitation_side.py"), *args],
                          capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode or not lines:
        raise RuntimeError(f"imitation side failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def check_env(ours_id: str, theirs_id: str, seed: int = 5, steps: int = 600) -> dict[str, Any]:
    """One seeded episode on each side under the same action pattern: the largest differences."""
    import gymnasium as gym

    from feedbackrl.control.envs import make_vec_env

    make_vec_env(ours_id, 1).close()  # registers a "module:Id" environment
    env = gym.make(ours_id)
    obs, _ = env.reset(seed=seed)
    rows, rewards = [[float(v) for v in obs]], []
    for t in range(steps):  # the controller of imitation_side.check_env
        obs, r, term, trunc, _ = env.step(int(obs[2] + 0.3 * obs[3] > 0) if t % 9 else t % 2)
        rows.append([float(v) for v in obs])
        rewards.append(float(r))
        if term or trunc:
            break
    theirs = imitation_side("--env", theirs_id, "--seed", str(seed), "--check-env", str(steps))
    same_len = len(rows) == len(theirs["obs"])
    obs_diff = max(abs(a - b) for ra, rb in zip(rows, theirs["obs"], strict=False) for a, b in zip(ra, rb, strict=True))
    rew_diff = max(abs(a - b) for a, b in zip(rewards, theirs["rewards"], strict=False))
    return {"steps": len(rewards), "same_length": same_len, "max_obs_diff": obs_diff, "max_reward_diff": rew_diff,
            "gymnasium_ours": gym.__version__, "gymnasium_imitation": theirs["versions"]["gymnasium"]}


def ours(env_id: str, seed: int, labels: int, out: Path) -> dict[str, Any]:
    sets = [f"control.env={env_id}", f"train.seed={seed}", f"control.preferences.labels={labels}",
            "control.preferences.teacher.beta=1.0", "control.preferences.teacher.equal_within=0.0", "eval.every=5"]
    t0 = time.perf_counter()
    run(load_config(ROOT / "recipes/cartpole_prefs.toml", sets), out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve, asked, steps = [], 0, 0
    for r in rows:
        asked = int(r.get("prefs/labels", asked))
        steps = int(r.get("env_steps", steps))
        if "eval/return" in r:
            curve.append({"env_steps": steps if r.get("phase") == "rl" or curve else 0, "labels": asked,
                          "return": r["eval/return"]})
    return {"curve": curve, "final_return": curve[-1]["return"], "env_steps": curve[-1]["env_steps"],
            "labels": asked, "seconds": time.perf_counter() - t0}


def reference(env_id: str, seed: int, out: Path) -> float:
    """Our PPO on the environment's true reward (recipes/cartpole_ppo.toml), same steps and seed: the ceiling."""
    report = run(load_config(ROOT / "recipes/cartpole_ppo.toml", [f"control.env={env_id}", f"train.seed={seed}"]), out)
    return report["control_eval_after"]["eval/return"]


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e for e in ENVS if e in results.get("runs", {})]
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 0.6 + 3.6 * len(names)), squeeze=False)
    colours = {"ours": "tab:blue", "imitation": "tab:orange"}
    for row, name in zip(axes, names, strict=True):
        runs = results["runs"][name]
        budgets = sorted({int(b) for b in runs})
        for side in ("ours", "imitation"):
            finals = [[s["final_return"] for s in runs[str(b)][side].values()] for b in budgets if side in runs[str(b)]]
            bs = [b for b in budgets if side in runs[str(b)]]
            if not bs:
                continue
            row[0].plot(bs, [statistics.mean(f) for f in finals], "o-", color=colours[side], label=side)
            for b, f in zip(bs, finals, strict=True):
                row[0].scatter([b] * len(f), f, color=colours[side], alpha=0.35, s=14)
            top = str(max(bs))
            for i, c in enumerate(runs[top][side].values()):
                row[1].plot([p["env_steps"] for p in c["curve"]], [p["return"] for p in c["curve"]], "-",
                            color=colours[side], alpha=0.8, label=f"{side}, {top} labels" if i == 0 else None)
        ref = results.get("reference", {}).get(name)
        if ref:
            for ax in row:
                ax.axhline(statistics.mean(ref), color="grey", ls="--", lw=1, label="PPO on the true reward (ours)")
        row[0].set(xscale="log", xlabel="label budget", ylabel="greedy true return (10 held-out episodes)",
                   title=f"{ENVS[name][0].split(':')[-1]}: return after 51,200 PPO steps")
        row[1].set(xlabel="environment steps", ylabel="greedy true return",
                   title=f"{ENVS[name][0].split(':')[-1]}: during training, each seed")
        row[0].minorticks_off()
        row[0].set_xticks(budgets, [str(b) for b in budgets])
        for ax in row:
            ax.set_ylim(0, 520)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    p = results.get("provenance", {})
    n_seeds = max(len(c["ours"]) for cells in results["runs"].values() for c in cells.values())
    fig.suptitle(f"Preference PPO (feedbackrl) vs imitation 1.0.1 PreferenceComparisons + SB3 PPO, Boltzmann teacher "
                 f"(beta 1), {n_seeds} seeds\n"
                 f"{p.get('date', '')}, {p.get('machine', '')}, load {p.get('load_average', '')} at start, "
                 f"{results.get('load_average_end', '')} at end\ncommit {p.get('commit', '')}: "
                 f"python benchmarks/bench_imitation.py {' '.join(p.get('argv', [])[1:])}", fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="cartpole,fixed")
    p.add_argument("--budgets", default="50,150,400")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot-only", action="store_true", help="redraw docs/imitation.png from the results file")
    p.add_argument("--reference-only", action="store_true",
                   help="add our true-reward PPO (the same seeds and steps) to the results file, and redraw")
    args = p.parse_args()
    if args.plot_only or args.reference_only:
        results = json.loads(RESULTS.read_text())
        if args.reference_only:
            setup_threads(args.threads)
            with tempfile.TemporaryDirectory() as tmp:
                results["reference"] = {name: [reference(ENVS[name][0], s, Path(tmp) / f"ref_{name}_{s}")
                                               for s in range(args.seeds)] for name in args.envs.split(",")}
            results["reference_provenance"] = provenance()
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        plot(results)
        return
    setup_threads(args.threads)
    results: dict[str, Any] = {"provenance": provenance(), "env_check": {}, "runs": {}}
    t_start = time.perf_counter()
    for name in args.envs.split(","):
        if name not in ENVS:
            raise SystemExit(f"unknown environment {name!r}; choose from {', '.join(ENVS)}")
        results["env_check"][name] = check_env(*ENVS[name])
        print(f"{name}: environments agree? {results['env_check'][name]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.envs.split(","):
            ours_id, theirs_id = ENVS[name]
            for budget in (int(b) for b in args.budgets.split(",")):
                cell = results["runs"].setdefault(name, {}).setdefault(str(budget), {"ours": {}, "imitation": {}})
                for seed in range(args.seeds):  # the two sides alternate, so both see the same load
                    cell["ours"][str(seed)] = ours(ours_id, seed, budget, Path(tmp) / f"{name}_{budget}_{seed}")
                    cell["imitation"][str(seed)] = imitation_side("--env", theirs_id, "--seed", str(seed),
                                                                  "--labels", str(budget))
                    print(f"{name} labels {budget} seed {seed}: ours {cell['ours'][str(seed)]['final_return']:.1f}, "
                          f"imitation {cell['imitation'][str(seed)]['final_return']:.1f}", flush=True)
                    results["wall_seconds"] = time.perf_counter() - t_start
                    results["load_average_end"] = provenance()["load_average"]
                    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
                    plot(results)


if __name__ == "__main__":
    main()
