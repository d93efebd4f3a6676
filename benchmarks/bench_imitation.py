"""Preference learning side by side: ours (`control_ppo`, control.reward = "preferences") against imitation's
`PreferenceComparisons` with Stable-Baselines3's PPO, same environment, label budget, PPO steps and seeds.

Run: make imitation-venv && .venv/bin/python benchmarks/bench_imitation.py [--envs cartpole,fixed]
     [--budgets 50,150,400] [--seeds 3]
     driving: .venv/bin/python benchmarks/bench_imitation.py --envs highway --budgets 1000,200 --seeds 3
Writes benchmarks/results/imitation.json (after every run, provenance included; driving under its "driving"
key, the classic control results at the top level) and docs/imitation.png (docs/imitation_highway.png).

- imitation 1.0.1 pins gymnasium~=0.29 and stable-baselines3~=2.2.1, so it runs in its own virtualenv
  (`.venv-imitation`, `make imitation-venv`) as a subprocess: benchmarks/imitation_side.py, whose docstring
  lists its settings. Ours runs here, on gymnasium 1.x. Classic control is the same in both gymnasium
  versions; before any training this script steps one seeded episode of each environment on both sides under
  the same actions and records the largest difference in observations and rewards (0 expected).
- driving: "highway" is highway-env's highway-fast-v0 with recipes/highway_prefs.toml's configuration (20
  steps, 10 other vehicles): ours `feedbackrl/highway-fast-v0` on highway-env 1.12.1, imitation's highway-env
  1.9.1 (the last release for gymnasium 0.29; `make imitation-venv` installs it) with our flat float32
  observation. The cross-check steps 20 seeded episodes (seeds 5-24) under two fixed controllers and compares
  observations (imitation's side with highway-env's own pandas observation and with our numpy one), rewards,
  terminations and truncations. Our side runs recipes/highway_prefs.toml (its 1,000 labels replaced by the
  budget, its teacher by the Boltzmann one); SB3's PPO gets that recipe's PPO settings; 20,480 PPO steps,
  segments of 10 steps, the greedy return and collision rate on 20 held-out episodes.
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
from cross_check import record_episodes  # noqa: E402

from feedbackrl.config import load_config  # noqa: E402
from feedbackrl.train.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "imitation.json"
FIGURE = ROOT / "docs" / "imitation.png"
FIGURE_HIGHWAY = ROOT / "docs" / "imitation_highway.png"
IMITATION_PY = ROOT / ".venv-imitation" / "bin" / "python"
ENVS = {  # name -> (our gymnasium id, imitation's)
    "cartpole": ("CartPole-v1", "CartPole-v1"),
    "fixed": ("feedbackrl.control.fixed_horizon:CartPoleFixedHorizon-v0", "seals/CartPole-v0"),
    "highway": ("feedbackrl/highway-fast-v0", "highway-fast-v0"),
}
CLASSIC = ("cartpole", "fixed")  # the results file's top level; "highway" goes under its "driving" key
HIGHWAY_CONFIG = {"duration": 20, "vehicles_count": 10}  # recipes/highway_prefs.toml (imitation_side.py's too)
# per environment: our recipe, PPO steps, fragment length, held-out episodes, our eval.every (one evaluation per
# imitation round: 10 rounds of 5,120 PPO steps on CartPole, of 2,048 on highway-fast-v0)
SETTINGS = {
    "cartpole": {"recipe": "recipes/cartpole_prefs.toml", "steps": 51_200, "fragment_len": 25, "eval_episodes": 10,
                 "eval_every": 5, "options": {}},
    "highway": {"recipe": "recipes/highway_prefs.toml", "steps": 20_480, "fragment_len": 10, "eval_episodes": 20,
                "eval_every": 8, "options": {"config": HIGHWAY_CONFIG}},
}
SETTINGS["fixed"] = SETTINGS["cartpole"]
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


def check_env(name: str, seed: int = 5, steps: int = 600, episodes: int = 1) -> dict[str, Any]:
    """Seeded episodes (seeds seed + i) on each side under the same controller: the largest differences in
    observations and rewards, and whether every step's termination and truncation agree."""
    import gymnasium as gym

    from feedbackrl.control.envs import make_vec_env

    ours_id, theirs_id = ENVS[name]
    options = SETTINGS[name]["options"]
    make_vec_env(ours_id, 1, options).close()  # registers a "module:Id" environment
    mine = record_episodes(lambda: gym.make(ours_id, **options), name == "highway", seed, steps, episodes)
    out = imitation_side("--env", theirs_id, "--seed", str(seed), "--check-env", str(steps), "--check-episodes",
                         str(episodes))
    result: dict[str, Any] = {"episodes": episodes, "seeds": [seed + i for i in range(episodes)],
                              "steps": [len(a["rewards"]) for a in mine], **_differences(mine, out["episodes"])}
    if "pandas_obs" in out:  # imitation's side with highway-env's own observation (pandas) too
        result["pandas_obs"] = _differences(mine, out["pandas_obs"])
    result.update({"gymnasium_ours": gym.__version__, "gymnasium_imitation": out["versions"]["gymnasium"]})
    if name == "highway":
        result.update({"highway_env_ours": _highway_version(), "highway_env_imitation": out["versions"]["highway_env"]})
    return result


def _differences(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest differences between the two sides' episodes, and whether lengths and terminations agree."""
    pairs = list(zip(mine, theirs, strict=True))
    return {"same_length": all(len(a["rewards"]) == len(b["rewards"]) for a, b in pairs),
            "max_obs_diff": max(abs(x - y) for a, b in pairs for ra, rb in zip(a["obs"], b["obs"], strict=False)
                                for x, y in zip(ra, rb, strict=True)),
            "max_reward_diff": max(abs(x - y) for a, b in pairs for x, y in zip(a["rewards"], b["rewards"],
                                                                                strict=False)),
            "same_terminations": all(a[k] == b[k] for a, b in pairs for k in ("terminated", "truncated"))}


def _highway_version() -> str:
    import highway_env

    return highway_env.__version__


def ours(name: str, seed: int, labels: int, out: Path) -> dict[str, Any]:
    st = SETTINGS[name]
    sets = [f"control.env={ENVS[name][0]}", f"train.seed={seed}", f"control.preferences.labels={labels}",
            "control.preferences.teacher.beta=1.0", "control.preferences.teacher.equal_within=0.0",
            f"eval.every={st['eval_every']}"]
    t0 = time.perf_counter()
    run(load_config(ROOT / st["recipe"], sets), out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve, asked, steps = [], 0, 0
    for r in rows:
        asked = int(r.get("prefs/labels", asked))
        steps = int(r.get("env_steps", steps))
        if "eval/return" in r:
            curve.append({"env_steps": steps if r.get("phase") == "rl" or curve else 0, "labels": asked,
                          "return": r["eval/return"], **({"collision": r["eval/collision"]}
                                                         if "eval/collision" in r else {})})
    return {"curve": curve, "final_return": curve[-1]["return"], "env_steps": curve[-1]["env_steps"],
            "labels": asked, "seconds": time.perf_counter() - t0,
            **({"final_collision": curve[-1]["collision"]} if "collision" in curve[-1] else {})}


def theirs(name: str, seed: int, labels: int) -> dict[str, Any]:
    st = SETTINGS[name]
    return imitation_side("--env", ENVS[name][1], "--seed", str(seed), "--labels", str(labels), "--steps",
                          str(st["steps"]), "--fragment-len", str(st["fragment_len"]), "--eval-episodes",
                          str(st["eval_episodes"]))


def reference(name: str, seed: int, out: Path) -> float:
    """Our PPO on the environment's true reward (recipes/cartpole_ppo.toml, recipes/highway_ppo.toml), same steps
    and seed: the ceiling."""
    recipe = SETTINGS[name]["recipe"].replace("_prefs", "_ppo")
    report = run(load_config(ROOT / recipe, [f"control.env={ENVS[name][0]}", f"train.seed={seed}"]), out)
    return report["control_eval_after"]["eval/return"]


def _provenance_lines(results: dict[str, Any]) -> str:
    """A figure's last two title lines: when, where, the load, and the command that made `results`."""
    p = results.get("provenance", {})
    return (f"{p.get('date', '')}, {p.get('machine', '')}, load {p.get('load_average', '')} at start, "
            f"{results.get('load_average_end', '')} at end\ncommit {p.get('commit', '')}: "
            f"python benchmarks/bench_imitation.py {' '.join(p.get('argv', [])[1:])}")


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e for e in CLASSIC if e in results.get("runs", {})]
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
    n_seeds = max(len(c["ours"]) for cells in results["runs"].values() for c in cells.values())
    fig.suptitle(f"Preference PPO (feedbackrl) vs imitation 1.0.1 PreferenceComparisons + SB3 PPO, Boltzmann teacher "
                 f"(beta 1), {n_seeds} seeds\n"
                 + _provenance_lines(results), fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)


def plot_driving(section: dict[str, Any]) -> None:
    """docs/imitation_highway.png: greedy held-out return and collision rate after training against the label
    budget, each seed a dot, the mean a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = section["runs"]["highway"]
    budgets = sorted(int(b) for b in runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"ours": "tab:blue", "imitation": "tab:orange"}
    for ax, key, label in ((axes[0], "final_return", "greedy true return"),
                           (axes[1], "final_collision", "collision rate")):
        for side in ("ours", "imitation"):
            bs = [b for b in budgets if runs[str(b)][side]]
            vals = [[s[key] for s in runs[str(b)][side].values()] for b in bs]
            if not bs:
                continue
            ax.plot(bs, [statistics.mean(v) for v in vals], "o-", color=colours[side], label=side)
            for b, v in zip(bs, vals, strict=True):
                ax.scatter([b] * len(v), v, color=colours[side], alpha=0.35, s=14)
        ref = section.get("reference", {}).get("highway")
        if ref and key == "final_return":
            ax.axhline(statistics.mean(ref), color="grey", ls="--", lw=1, label="PPO on the true reward (ours)")
        ax.set(xscale="log", xlabel="label budget", ylabel=f"{label} (20 held-out episodes)",
               title=f"highway-fast-v0: {label} after 20,480 PPO steps")
        ax.minorticks_off()
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    n_seeds = max(len(c["ours"]) for c in runs.values())
    fig.suptitle(f"Driving: preference PPO (feedbackrl, highway-env 1.12.1) vs imitation 1.0.1 PreferenceComparisons "
                 f"+ SB3 PPO (highway-env 1.9.1), Boltzmann teacher (beta 1), {n_seeds} seeds\n"
                 + _provenance_lines(section), fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURE_HIGHWAY, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="cartpole,fixed", help=f"comma-separated, of {', '.join(ENVS)}; classic "
                   "control and driving are separate runs (separate sections of the results file)")
    p.add_argument("--budgets", default="50,150,400")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot-only", action="store_true", help="redraw the figures from the results file")
    p.add_argument("--reference-only", action="store_true",
                   help="add our true-reward PPO (the same seeds and steps) to the results file, and redraw")
    args = p.parse_args()
    names = args.envs.split(",")
    for name in names:
        if name not in ENVS:
            raise SystemExit(f"unknown environment {name!r}; choose from {', '.join(ENVS)}")
    driving = "highway" in names
    if driving and len(names) > 1:
        raise SystemExit("--envs highway runs alone (its results go under the results file's \"driving\" key); "
                         "run the classic control environments separately")
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.plot_only or args.reference_only:
        if args.reference_only:
            setup_threads(args.threads)
            section = old["driving"] if driving else old
            with tempfile.TemporaryDirectory() as tmp:
                section["reference"] = {name: [reference(name, s, Path(tmp) / f"ref_{name}_{s}")
                                               for s in range(args.seeds)] for name in names}
            section["reference_provenance"] = provenance()
            RESULTS.write_text(json.dumps(old, indent=2) + "\n")
        plot(old)
        if "driving" in old:
            plot_driving(old["driving"])
        return
    setup_threads(args.threads)
    section: dict[str, Any] = {"provenance": provenance(), "env_check": {}, "runs": {}}
    if driving:  # the classic control results stay as they are, and the other way round
        results = {**old, "driving": section}
    else:
        results = {**section, **({"driving": old["driving"]} if "driving" in old else {})}
    t_start = time.perf_counter()
    for name in names:
        check = {"seed": 5, "steps": 40, "episodes": 20} if name == "highway" else {}
        section["env_check"][name] = check_env(name, **check)
        print(f"{name}: environments agree? {section['env_check'][name]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for budget in (int(b) for b in args.budgets.split(",")):
                cell = section["runs"].setdefault(name, {}).setdefault(str(budget), {"ours": {}, "imitation": {}})
                for seed in range(args.seeds):  # the two sides alternate, so both see the same load
                    cell["ours"][str(seed)] = ours(name, seed, budget, Path(tmp) / f"{name}_{budget}_{seed}")
                    cell["imitation"][str(seed)] = theirs(name, seed, budget)
                    print(f"{name} labels {budget} seed {seed}: ours {cell['ours'][str(seed)]['final_return']:.2f}, "
                          f"imitation {cell['imitation'][str(seed)]['final_return']:.2f}", flush=True)
                    section["wall_seconds"] = time.perf_counter() - t_start
                    section["load_average_end"] = provenance()["load_average"]
                    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
                    plot_driving(section) if driving else plot(results)


if __name__ == "__main__":
    main()
