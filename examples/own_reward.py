"""Your own reward function and task, trained from Python with `feedbackrl.train(...)`.

    python examples/own_reward.py --out runs/own_reward [--steps 40]

The task (`Mirror`: write three letters backwards) and the reward (`shape`: partial credit per letter in
place, a TRL-style score in [-1, 1]) are plain Python here; the recipe is a dict. The same function could be
named in a TOML recipe instead: `[reward] source = "python"`, `function = "examples/own_reward.py:shape"`,
`signature = "trl"`, `score_range = [-1, 1]` (docs/rewards.md). Prints the report's before/after accuracy.

It shows the plumbing, not a learning result: from a freshly built tiny model (no SFT) the training reward
(mapped onto [0, 1]) rose from 0.005 at step 1 to 0.167 at step 40 while held-out exact accuracy stayed 0.000;
16 s wall (2026-12-02, 2-core AMD EPYC, AVX2 only, shared; `OMP_NUM_THREADS=1 python examples/own_reward.py`
at the commit that added it).
"""

from __future__ import annotations

import argparse
import random

import feedbackrl
from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict


class Mirror(Task):
    """Three letters from 'abcd', written backwards; the verifier wants the exact reversal."""

    name = "mirror"

    def sample(self, rng: random.Random) -> Problem:
        word = "".join(rng.choice("abcd") for _ in range(3))
        return Problem(word + "=", word[::-1])

    def heldout(self, n: int) -> list[Problem]:
        rng = random.Random(12345)  # a fixed held-out set (it may share words with training: a toy)
        return [self.sample(rng) for _ in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        ok = completion.strip() == problem.answer
        return Verdict(float(ok), ok, "exact reversal" if ok else "not the reversal")


def shape(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """TRL's signature: -1 for an empty answer, else 2 * (share of letters in place) - 1."""
    out = []
    for text, gold in zip(completions, answer, strict=True):
        got = text.strip()
        out.append(-1.0 if not got else 2 * sum(a == b for a, b in zip(got, gold, strict=False)) / len(gold) - 1)
    return out


RECIPE = {
    "task": {"heldout_size": 64},
    "sft": {"steps": 0},
    "rollout": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 4},
    "algo": {"lr": 5e-4},
    "eval": {"pass_k": 0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/own_reward")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    report = feedbackrl.train(RECIPE, out=args.out, task=Mirror(), overrides={"algo.steps": args.steps},
                              reward={"function": shape, "signature": "trl", "score_range": [-1, 1]})
    print(f"greedy accuracy {report['eval_before']['accuracy']:.3f} -> {report['eval_after']['accuracy']:.3f}")


if __name__ == "__main__":
    main()
