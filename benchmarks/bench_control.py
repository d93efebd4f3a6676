"""Control policies: our PPO against Stable-Baselines3's, and what preferences and a constraint cost or buy.

Run: .venv/bin/python benchmarks/bench_control.py [--parts speed,prefs,constraint] [--seeds 3] [--repeats 2]
Writes benchmarks/results/control.json (provenance included) and prints one line per result.

- speed: environment steps per second of training, ours (`algo.name = "control_ppo"`, the loop of
  `feedbackrl.control.loop`) against Stable-Baselines3's `PPO("MlpPolicy")` on CartPole-v1 with the same
  threads, 8 environments x 128 steps per update, 4 epochs of 4 minibatches (batch 256), the same network
  (two tanh layers of 64 for the actor and the critic each) and the same number of steps. Each side's
  time is its training call only (`learn()`; our loop without the before/after evaluation). The two run
  interleaved `--repeats` times each; the ratio of the medians is reported (the machine is shared: a ratio
  from one run is worth more than either rate).
- prefs: the greedy held-out return after PPO on the environment's reward (recipes/cartpole_ppo.toml) and
  after PPO on a reward learned from 400 simulated segment preferences (recipes/cartpole_prefs.toml), same
  seeds and environment steps; the fraction is their ratio of means.
- constraint: the cost `cart_off_centre` (fraction of steps with the cart more than 0.5 from the centre)
  of unconstrained PPO and of PPO-Lagrangian (recipes/cartpole_safe.toml), both for that recipe's number of
  updates, over the last quarter of training and in the greedy held-out episodes (cost per step: the mean
  episode cost over the mean episode length).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, setup_threads  # noqa: E402

from feedbackrl.config import load_config  # noqa: E402
from feedbackrl.train.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "control.json"


def ours(recipe: str, overrides: list[str], out: Path) -> dict[str, Any]:
    return run(load_config(ROOT / recipe, overrides), out)


def sb3_seconds(steps: int, seed: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, seed=seed, verbose=0,
                device="cpu")
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    return time.perf_counter() - t0


def speed(repeats: int, updates: int, tmp: Path) -> dict[str, Any]:
    steps = updates * 8 * 128
    mine, theirs = [], []
    for r in range(repeats):  # interleaved, so both sides see the same load
        report = ours("recipes/cartpole_ppo.toml", [f"algo.steps={updates}", "control.eval_episodes=1"],
                      tmp / f"speed_{r}")
        mine.append(steps / report["train_seconds"])
        theirs.append(steps / sb3_seconds(steps, seed=r))
        print(f"speed repeat {r}: ours {mine[-1]:.0f} steps/s, sb3 {theirs[-1]:.0f} steps/s", flush=True)
    import stable_baselines3

    return {"env_steps": steps, "ours_steps_per_s": mine, "sb3_steps_per_s": theirs,
            "ratio_of_medians": statistics.median(mine) / statistics.median(theirs),
            "stable_baselines3": stable_baselines3.__version__}


def prefs(seeds: int, tmp: Path) -> dict[str, Any]:
    true_r, pref_r, labels = [], [], []
    for s in range(seeds):
        true_r.append(ours("recipes/cartpole_ppo.toml", [f"train.seed={s}"], tmp / f"true_{s}")
                      ["control_eval_after"]["eval/return"])
        rep = ours("recipes/cartpole_prefs.toml", [f"train.seed={s}"], tmp / f"prefs_{s}")
        pref_r.append(rep["control_eval_after"]["eval/return"])
        labels.append(rep["labels"])
        print(f"prefs seed {s}: true-reward PPO {true_r[-1]:.1f}, preference PPO {pref_r[-1]:.1f}", flush=True)
    return {"true_reward_return": true_r, "preference_return": pref_r, "labels": labels,
            "fraction_of_true": statistics.mean(pref_r) / statistics.mean(true_r)}


def _late_cost(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    late = rl[len(rl) * 3 // 4:]
    return statistics.mean(r["cost/mean"] for r in late)


def constraint(seeds: int, tmp: Path) -> dict[str, Any]:
    safe = load_config(ROOT / "recipes/cartpole_safe.toml")
    out: dict[str, Any] = {"threshold": safe.constraint.threshold, "updates": safe.algo.steps}
    arms = (("unconstrained", "recipes/cartpole_ppo.toml", ["control.cost=cart_off_centre",
                                                             f"algo.steps={safe.algo.steps}"]),
            ("lagrangian", "recipes/cartpole_safe.toml", []))
    for name, recipe, sets in arms:
        late, held, ret = [], [], []
        for s in range(seeds):
            d = tmp / f"{name}_{s}"
            report = ours(recipe, [*sets, f"train.seed={s}"], d)
            late.append(_late_cost(d))
            held.append(report["control_eval_after"]["eval/cost"] / report["control_eval_after"]["eval/length"])
            ret.append(report["control_eval_after"]["eval/return"])
            print(f"{name} seed {s}: late training cost {late[-1]:.3f}, held-out cost rate {held[-1]:.3f}, "
                  f"return {ret[-1]:.1f}", flush=True)
        out[name] = {"late_training_cost": late, "heldout_cost_rate": held, "heldout_return": ret}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="speed,prefs,constraint")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--updates", type=int, default=50, help="speed: PPO updates of 8 x 128 steps per side")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    setup_threads(args.threads)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts.split(","):
            t0 = time.perf_counter()
            if part == "speed":
                res = speed(args.repeats, args.updates, Path(tmp))
            elif part == "prefs":
                res = prefs(args.seeds, Path(tmp))
            elif part == "constraint":
                res = constraint(args.seeds, Path(tmp))
            else:
                raise SystemExit(f"unknown part {part!r}; choose from speed, prefs, constraint")
            results[part] = {**res, "wall_seconds": time.perf_counter() - t0, "threads": args.threads,
                             "provenance": provenance()}
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
            print(json.dumps({k: v for k, v in res.items() if not isinstance(v, list | dict)}), flush=True)


if __name__ == "__main__":
    main()
