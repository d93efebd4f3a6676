"""Control policies: our PPO against Stable-Baselines3's, and what preferences and a constraint cost or buy.

Run: .venv/bin/python benchmarks/bench_control.py [--parts speed,prefs,constraint,highway] [--seeds 3] [--repeats 2]
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
- highway: driving on highway-env's highway-fast-v0 (`feedbackrl/highway-fast-v0`, episodes of 20 policy steps
  among 10 vehicles). First the environment's own speed: random meta-actions for a few seconds, steps per
  second of wall time and of CPU time, highway-env's observation against ours (numpy) and the scenario's
  default traffic against the recipes'. Then per seed, in this order (a seed is complete before the next
  starts, and the results file is rewritten after every run): PPO on the environment's reward
  (recipes/highway_ppo.toml), PPO on a reward learned from 1,000 simulated segment preferences
  (recipes/highway_prefs.toml) and PPO-Lagrangian on the collision cost (recipes/highway_safe.toml), all for
  the same environment steps. Each run records its held-out greedy metrics (return, collision rate,
  distance, mean speed, lane changes, jerk over control.eval_episodes episodes), the collision rate of its
  training episodes and the cost per step over the last quarter of training, and its CPU seconds.
- highway_safe: the PPO-Lagrangian arm alone, with `--set KEY=VALUE` recipe overrides (another multiplier
  setting), the same records plus the final lambda.
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


def _late(run_dir: Path, key: str) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl" and key in r]
    return statistics.mean(r[key] for r in rl[len(rl) * 3 // 4:])


def highway_env_speed(seconds: float = 5.0) -> list[dict[str, Any]]:
    import gymnasium as gym
    import highway_env
    import numpy as np

    import feedbackrl.control.envs  # noqa: F401  (registers feedbackrl/highway-fast-v0)

    gym.register_envs(highway_env)
    out = []
    recipe = load_config(ROOT / "recipes/highway_ppo.toml").control.env_options["config"]
    for env_id, config in (("highway-fast-v0", {}), ("feedbackrl/highway-fast-v0", {}),
                           ("highway-fast-v0", recipe), ("feedbackrl/highway-fast-v0", recipe)):
        env = gym.make(env_id, config=dict(config))
        env.reset(seed=0)
        rng, n = np.random.default_rng(0), 0
        w0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds:
            *_, term, trunc, _ = env.step(int(rng.integers(5)))
            n += 1
            if term or trunc:
                env.reset()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        env.close()
        out.append({"env": env_id, "config": config, "steps": n, "steps_per_wall_s": n / wall,
                    "steps_per_cpu_s": n / cpu})
        print(f"highway speed {env_id} {config}: {n / wall:.0f} steps/s wall, {n / cpu:.0f} per CPU second",
              flush=True)
    return out


def highway(seeds: int, tmp: Path, save: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"env_speed": highway_env_speed(), "runs": {}}
    save(res)
    arms = (("true_reward", "recipes/highway_ppo.toml"), ("preferences", "recipes/highway_prefs.toml"),
            ("lagrangian", "recipes/highway_safe.toml"))
    for s in range(seeds):
        for name, recipe in arms:
            d = tmp / f"highway_{name}_{s}"
            c0 = time.process_time()
            report = ours(recipe, [f"train.seed={s}"], d)
            cpu = time.process_time() - c0
            ev = report["control_eval_after"]
            row = {"seed": s, "eval": ev, "eval_before": report["control_eval_before"], "cpu_seconds": cpu,
                   "train_seconds": report["train_seconds"], "env_steps": report["env_steps"],
                   "late_training_cost_per_step": _late(d, "cost/mean"),
                   "late_training_collision_rate": _late(d, "episode/collision"),
                   "late_training_return": _late(d, "episode/return"),
                   "env_steps_per_s_rollout": _late(d, "perf/env_steps_per_s_rollout"),
                   "labels": report.get("labels")}
            res["runs"].setdefault(name, []).append(row)
            print(f"highway {name} seed {s}: return {ev['eval/return']:.2f}, collision {ev['eval/collision']:.2f}, "
                  f"speed {ev['eval/mean_speed']:.1f}, late cost/step {row['late_training_cost_per_step']:.4f}, "
                  f"{cpu:.0f} CPU s", flush=True)
            save(res)
    runs = res["runs"]
    true_r = [r["eval"]["eval/return"] for r in runs["true_reward"]]
    if "preferences" in runs:
        pref_r = [r["eval"]["eval/return"] for r in runs["preferences"]]
        res["fraction_of_true_return"] = statistics.mean(pref_r) / statistics.mean(true_r)
        true_c = statistics.mean(r["eval"]["eval/collision"] for r in runs["true_reward"])
        pref_c = statistics.mean(r["eval"]["eval/collision"] for r in runs["preferences"])
        res["collision_rate_true_reward"], res["collision_rate_preferences"] = true_c, pref_c
    res["constraint_threshold"] = load_config(ROOT / "recipes/highway_safe.toml").constraint.threshold
    return res


def highway_safe(seeds: int, sets: list[str], tmp: Path, save: Any) -> dict[str, Any]:
    """The PPO-Lagrangian arm of `highway` alone, with `--set` overrides (another multiplier setting)."""
    res: dict[str, Any] = {"overrides": sets, "runs": []}
    for s in range(seeds):
        d = tmp / f"highway_safe_{s}"
        c0 = time.process_time()
        report = ours("recipes/highway_safe.toml", [*sets, f"train.seed={s}"], d)
        ev = report["control_eval_after"]
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        lam = [r["constraint/lambda"] for r in rows if r.get("phase") == "rl"]
        res["runs"].append({"seed": s, "eval": ev, "cpu_seconds": time.process_time() - c0,
                            "train_seconds": report["train_seconds"], "env_steps": report["env_steps"],
                            "late_training_cost_per_step": _late(d, "cost/mean"),
                            "late_training_collision_rate": _late(d, "episode/collision"),
                            "late_training_return": _late(d, "episode/return"), "final_lambda": lam[-1]})
        print(f"highway_safe {sets} seed {s}: late cost/step {res['runs'][-1]['late_training_cost_per_step']:.4f}, "
              f"held-out collision {ev['eval/collision']:.2f}, lambda {lam[-1]:.2f}", flush=True)
        save(res)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="speed,prefs,constraint")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--updates", type=int, default=50, help="speed: PPO updates of 8 x 128 steps per side")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=[], dest="sets",
                   help="highway_safe: a recipe override (repeatable), e.g. --set constraint.lr=30")
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
            elif part in ("highway", "highway_safe"):
                def save(partial: dict[str, Any], part: str = part, t0: float = t0) -> None:
                    results[part] = {**partial, "complete": False, "wall_seconds": time.perf_counter() - t0,
                                     "threads": args.threads, "provenance": provenance()}
                    RESULTS.write_text(json.dumps(results, indent=2) + "\n")

                res = ({**highway(args.seeds, Path(tmp), save), "complete": True} if part == "highway" else
                       {**highway_safe(args.seeds, args.sets, Path(tmp), save), "complete": True})
            else:
                raise SystemExit(f"unknown part {part!r}; choose from speed, prefs, constraint, highway, highway_safe")
            results[part] = {**res, "wall_seconds": time.perf_counter() - t0, "threads": args.threads,
                             "provenance": provenance()}
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
            print(json.dumps({k: v for k, v in res.items() if not isinstance(v, list | dict)}), flush=True)


if __name__ == "__main__":
    main()
