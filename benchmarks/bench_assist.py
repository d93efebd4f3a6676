"""Demonstrations and takeovers on CartPole-v1: behaviour cloning alone against BC then RL, with and without a
simulated expert taking over when the agent is about to fail (feedbackrl.control.assist).

Run: .venv/bin/python benchmarks/bench_assist.py [--seeds 3] [--updates 20]
Writes benchmarks/results/assist.json (provenance included) and docs/assist.png.

Every arm starts from the same policy per seed: behaviour cloning on `demo_steps` noisy demonstration steps
(30% of the expert's actions replaced by random ones). Then, for `updates` rollouts of 8 x 128 steps:
- bc: nothing more (the warm start alone);
- bc_dagger: DAgger rounds, the expert labelling every state the agent visited;
- bc_ppo: PPO on the environment's reward;
- bc_ppo_takeover: PPO with the expert taking over where the pole passes 0.12 rad or the cart 1.8, each
  taken-over step costing 1 in PPO's reward, and after each update behaviour cloning on the demonstrations and
  every takeover so far (the expert's labels only where it took over); the takeover rate logged per update;
- bc_ppo_takeover_free: the same without the cost of a takeover;
- bc_ppo_takeover_inbatch: the first design, kept to measure against: the takeover preference loss inside PPO's
  minibatches (takeover_coef 1) on the latest rollout's takeovers, no aggregation (takeover_bc_steps 0), cost 1.
Success: the greedy policy alone, no expert, keeps the pole up for all 500 steps, over 10 held-out episodes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, setup_threads  # noqa: E402

from feedbackrl.control.assist import (  # noqa: E402
    AssistConfig,
    behaviour_clone,
    dagger,
    demonstrations,
    evaluate,
    new_policy,
    run_assisted,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "assist.json"
FIGURE = ROOT / "docs" / "assist.png"
ARMS = ("bc", "bc_dagger", "bc_ppo", "bc_ppo_takeover", "bc_ppo_takeover_free", "bc_ppo_takeover_inbatch")
TAKEOVER_ARMS = ("bc_ppo_takeover", "bc_ppo_takeover_free", "bc_ppo_takeover_inbatch")


def one_seed(cfg: AssistConfig, seed: int) -> dict[str, list[dict[str, Any]]]:
    obs, actions = demonstrations(cfg, seed)
    warm = new_policy(cfg, seed)
    bc_stats = behaviour_clone(warm, obs, actions, cfg.bc_steps, cfg.bc_lr)
    bc_eval = evaluate(warm, cfg, seed + 10_000)
    steps = cfg.num_envs * cfg.rollout_steps
    return {
        "bc": [{"update": u, "env_steps": u * steps, **bc_stats, **bc_eval} for u in range(cfg.updates + 1)],
        "bc_dagger": dagger(copy.deepcopy(warm), cfg, seed, obs, actions),
        "bc_ppo": run_assisted(copy.deepcopy(warm), replace(cfg, takeover=False), seed),
        "bc_ppo_takeover": run_assisted(copy.deepcopy(warm), cfg, seed, (obs, actions)),
        "bc_ppo_takeover_free": run_assisted(copy.deepcopy(warm), replace(cfg, takeover_penalty=0.0), seed,
                                             (obs, actions)),
        "bc_ppo_takeover_inbatch": run_assisted(copy.deepcopy(warm), replace(cfg, takeover_bc_steps=0,
                                                                             takeover_coef=1.0), seed),
    }


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(11, 3.8))
    for arm in ARMS:
        logs = [runs[s][arm] for s in runs]
        x = [r["env_steps"] for r in logs[0]]
        ax_s.plot(x, [statistics.mean(lg[i]["eval/success"] for lg in logs) for i in range(len(x))], "o-", ms=3,
                  label=arm)
        if arm in TAKEOVER_ARMS:
            ax_t.plot(x[1:], [statistics.mean(lg[i]["assist/takeover_rate"] for lg in logs) for i in range(1, len(x))],
                      "-", lw=2, label=f"{arm}, mean of seeds")
    ax_s.set(xlabel="environment steps after the BC warm start", ylabel="success (greedy, no expert), mean of seeds",
             title="CartPole-v1: 500 steps without falling", ylim=(-0.05, 1.05))
    ax_t.set(xlabel="environment steps", ylabel="share of steps taken over by the expert",
             title="takeover rate per update")
    for ax in (ax_s, ax_t):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    p = results["provenance"]
    fig.suptitle(f"{p['date']}, {p['machine']}, load {p['load_average']}, commit {p['commit']}; "
                 f"python benchmarks/bench_assist.py {' '.join(p['argv'][1:])}", fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--demo-steps", type=int, default=AssistConfig.demo_steps)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    setup_threads(args.threads)
    cfg = AssistConfig(updates=args.updates, demo_steps=args.demo_steps)
    cfg_dict = asdict(cfg)
    cfg_dict["ppo"] = cfg.ppo.model_dump()
    results: dict[str, Any] = {"provenance": provenance(), "config": cfg_dict, "runs": {}}
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        results["runs"][str(seed)] = one_seed(cfg, seed)
        r = results["runs"][str(seed)]
        print(f"seed {seed}: " + ", ".join(
            f"{a} success {r[a][0]['eval/success']:.1f} -> {r[a][-1]['eval/success']:.1f}" for a in ARMS), flush=True)
    k = max(1, args.updates // 4)
    rates = {a: [[r["assist/takeover_rate"] for r in results["runs"][s][a][1:]] for s in results["runs"]]
             for a in TAKEOVER_ARMS}
    results["summary"] = {
        "final_success": {a: [results["runs"][s][a][-1]["eval/success"] for s in results["runs"]] for a in ARMS},
        "final_return": {a: [results["runs"][s][a][-1]["eval/return"] for s in results["runs"]] for a in ARMS},
        "takeover_rate_first_quarter": {a: [statistics.mean(r[:k]) for r in v] for a, v in rates.items()},
        "takeover_rate_last_quarter": {a: [statistics.mean(r[-k:]) for r in v] for a, v in rates.items()},
        "expert_labels": {**{a: [results["runs"][s][a][-1]["assist/takeover_labels"] for s in results["runs"]]
                             for a in TAKEOVER_ARMS},
                          "bc_dagger": [results["runs"][s]["bc_dagger"][-1]["dagger/labels"] - cfg.demo_steps
                                        for s in results["runs"]]},
    }
    results["wall_seconds"] = time.perf_counter() - t0
    results["load_average_end"] = provenance()["load_average"]
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    plot(results)
    print(json.dumps(results["summary"]), flush=True)


if __name__ == "__main__":
    main()
