"""The cost per step of a trained control policy over many held-out episodes, acting greedily, by sampling (the
trained stochastic policy, as in training) and by sampling at a lower temperature: is a constrained run's late
training cost the policy's own, or its exploration's?

Run: .venv/bin/python benchmarks/policy_cost.py OUT.json NAME=CHECKPOINT_DIR [NAME=CHECKPOINT_DIR ...]
       [--steps 20480] [--envs 16] [--modes greedy,sampled,t0.5] (a mode@N steps N in that mode)
each CHECKPOINT_DIR a `checkpoints/step_N` of a control run (or a run directory: its latest checkpoint).

Per mode, `--envs` environments seeded train.seed + 50,000 + i (apart from the training environments,
train.seed + i, from the run's greedy held-out episodes, train.seed + 10,000 + i, and from its greedy probe
environments, train.seed + 30,000 + i: `control/loop.py`'s seed offsets) are stepped for
`--steps` steps in all, episodes reset as they end. The cost per step is the sum of the cost over all steps
divided by their number: the quantity the Lagrange multiplier constrains (`constraint.threshold`, per step), on
a fixed policy. Its standard error is sqrt(p (1 - p) / steps): 0.0004 at p = 0.003 over 20,480 steps, against
0.0008 for the late training figure (5,120 steps of a policy that changes in between); with it the Wilson 95%
interval (`algos.confidence.wilson_interval`; the collision cost is 0 or 1 per step). Also recorded: the share
of episodes that end in a crash, and the policy's mean entropy over the visited states.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402

from feedbackrl.algos.confidence import wilson_interval  # noqa: E402
from feedbackrl.control.envs import make_vec_env  # noqa: E402
from feedbackrl.control.loop import READING_SEED_OFFSET, _cost_fn, load_checkpoint  # noqa: E402
from feedbackrl.control.policy import ActorCritic  # noqa: E402
from feedbackrl.control.rollout import Collector  # noqa: E402


class Tempered:
    """A discrete policy acting greedily (temperature 0) or sampling from softmax(logits / temperature)."""

    def __init__(self, policy: ActorCritic, temperature: float) -> None:
        self.policy, self.critic, self.temperature = policy, policy.critic, temperature

    @torch.no_grad()
    def act(self, obs: torch.Tensor, generator: torch.Generator) -> Any:
        logits = self.policy.actor(obs)
        if self.temperature == 0:
            actions = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / self.temperature, -1)
            actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return actions, torch.zeros(len(obs)), self.policy.values(obs)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.values(obs)


def temperature(mode: str) -> float:
    """"greedy" -> 0, "sampled" -> 1, "t0.5" -> 0.5."""
    named = {"greedy": 0.0, "sampled": 1.0}
    return named[mode] if mode in named else float(mode.removeprefix("t"))


@torch.no_grad()
def policy_cost(ckpt: Path, modes: list[str], steps: int, n_envs: int) -> dict[str, Any]:
    policy, cfg = load_checkpoint(ckpt)
    c = cfg.control
    seed = cfg.train.seed + READING_SEED_OFFSET
    out: dict[str, Any] = {"checkpoint": str(ckpt), "seed": cfg.train.seed, "env": c.env}
    for spec in modes:
        mode, _, n_steps = spec.partition("@")
        per_env = math.ceil((int(n_steps) if n_steps else steps) / n_envs)
        t0 = time.process_time()
        collector = Collector(make_vec_env(c.env, n_envs, c.env_options), seed, _cost_fn(c.cost))
        gen = torch.Generator().manual_seed(seed)
        wrapped = Tempered(policy, temperature(mode))
        cost, n, episodes, crashed, entropy = 0.0, 0, 0, 0, 0.0
        for _ in range(math.ceil(per_env / 64)):
            ro = collector.collect(wrapped, min(64, per_env - n // n_envs), gen)
            cost += float(ro.costs.sum())
            n += ro.costs.numel()
            logp = torch.log_softmax(policy.actor(ro.obs.reshape(-1, ro.obs.shape[-1])), -1)
            entropy += float(-(logp.exp() * logp).sum())
            episodes += len(ro.episodes)
            crashed += sum(e.get("collision", 0.0) for e in ro.episodes)
        collector.envs.close()
        p = cost / n
        low, high = wilson_interval(int(round(cost)), n)  # the collision cost is 0 or 1 per step
        out[mode] = {"temperature": temperature(mode), "steps": n, "cost_per_step": p,
                     "cost_per_step_se": math.sqrt(max(p, 1.0 / n) * (1 - p) / n), "wilson95": [low, high],
                     "cost_sum": cost,
                     "episodes_finished": episodes, "episode_collision_rate": crashed / max(episodes, 1),
                     "mean_entropy": entropy / n, "cpu_seconds": time.process_time() - t0}
        print(f"{ckpt}: {mode}: cost/step {p:.4f} +- {out[mode]['cost_per_step_se']:.4f} over {n} steps "
              f"({cost:.0f} crashes, {episodes} episodes), entropy {entropy / n:.3f}", flush=True)
    return out


def latest(path: Path) -> Path:
    if (path / "checkpoints").is_dir():
        return sorted((path / "checkpoints").glob("step_*"))[-1]
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+", help="NAME=CHECKPOINT_DIR")
    p.add_argument("--steps", type=int, default=20_480)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--modes", default="greedy,sampled,t0.5")
    args = p.parse_args()
    torch.set_num_threads(1)
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {"runs": {}}
    for arg in args.runs:
        name, _, path = arg.partition("=")
        measured = policy_cost(latest(Path(path)), args.modes.split(","), args.steps, args.envs)
        result["runs"][name] = result["runs"].get(name, {}) | measured
        result["provenance"] = provenance()
        out_path.write_text(json.dumps(result, indent=2) + "\n")  # after every run: a long job keeps what it has


if __name__ == "__main__":
    main()
