"""Seconds per step of episodes on a `verifiers` environment: `tiny_reverse`, B x G episodes played
by verifiers' machinery against the (untrained) tiny model on the loopback endpoint, as a training
step's collect plays them (the policy update itself is not included).

    PYTHONPATH=src python benchmarks/bench_verifiers_step.py [--steps 3] [--episodes 16] [--max-concurrent 4]
        [--python .venv-verifiers/bin/python] [--path examples/verifiers_envs]

Run it in two source trees one after the other (each tree's sources first on PYTHONPATH) to compare
them under the same load; the first step includes starting the driver where the tree keeps one.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from feedbackrl.envs.verifiers_env import VerifiersTask
from feedbackrl.episodes.external import policy_endpoint
from feedbackrl.models.tiny import build_model, build_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=16, help="episodes per step (4 tasks x episodes/4)")
    ap.add_argument("--max-concurrent", type=int, default=4)
    ap.add_argument("--python", default=".venv-verifiers/bin/python")
    ap.add_argument("--path", default="examples/verifiers_envs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0)
    task = VerifiersTask(env="tiny_reverse", python=args.python, path=[args.path], taskset={"num_tasks": 48},
                         heldout_tasks=8, max_concurrent=args.max_concurrent)
    rng = random.Random(0)
    problems = [p for p in (task.sample(rng) for _ in range(4)) for _ in range(args.episodes // 4)]
    times = []
    for step in range(args.steps):
        with policy_endpoint(model, tok) as (url, tok_dir):
            t = time.perf_counter()
            task.play(url, tok_dir, problems, {"temperature": 1.0, "max_tokens": 6})
            times.append(time.perf_counter() - t)
        print(f"step {step + 1}: {times[-1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    if hasattr(task, "close"):
        task.close()
    print(f"mean {statistics.mean(times):.1f} s/step over {len(times)} steps")


if __name__ == "__main__":
    main()
