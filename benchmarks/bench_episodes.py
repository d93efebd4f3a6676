"""Episodes per second at a fixed shape, with the time split between generation, tools and training.

Shape: B = 8 problems x G = 8 episodes, 3 assistant turns each (up to 8 tokens a turn), one
calculator call per turn (the environment calls it whatever the policy writes, so a randomly
initialised tiny model gives the same shape as a trained one), GRPO with one update per step.
The split comes from the loop's own metrics: perf/gen_s, perf/tool_s, and the rest of
perf/step_s (log-probs, loss, backward, optimizer step), averaged over the steps after a warm-up.

    PYTHONPATH=src python benchmarks/bench_episodes.py --steps 6 --out benchmarks/results/episodes.json
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import provenance

from feedbackrl.config import build_config
from feedbackrl.envs.multi_turn import EpisodeLimits, EpisodicTask, Message, StepResult, Turn, render_plain
from feedbackrl.envs.tools import Toolbox, ToolCall, calculator
from feedbackrl.log import MemorySink
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.grpo import train_grpo

TURNS, TURN_TOKENS = 3, 8


class FixedShapeEnv:
    """Calls the calculator on every turn and ends after `TURNS` turns; rewards the last turn's length."""

    def __init__(self, problem: Problem) -> None:
        self.problem, self.turns, self.box = problem, 0, Toolbox({"calc": calculator})

    def reset(self) -> list[Message]:
        return [{"role": "user", "content": self.problem.prompt}]

    def step(self, turn: Turn) -> StepResult:
        self.turns += 1
        if self.turns == TURNS:
            score = min(len(turn.text), TURN_TOKENS) / TURN_TOKENS  # any signal: the benchmark times, it does not learn
            return StepResult([], True, Verdict(score, score == 1.0, "fixed shape"))
        res = self.box.call(ToolCall("calc", str(self.problem.answer)))
        return StepResult([{"role": "tool", "content": res.content}], False, tool_calls=1, tool_errors=int(not res.ok))

    def close(self) -> None:
        return None


@dataclass
class FixedShapeTask(EpisodicTask):
    limits: EpisodeLimits = field(default_factory=lambda: EpisodeLimits(TURNS, TURN_TOKENS, 64))
    tool_call_penalty: float = 0.0
    turn_penalty: float = 0.0
    turn_credit: float = 0.0
    name: str = "fixed_shape"

    def sample(self, rng: random.Random) -> Problem:
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        return Problem(f"{a}+{b}=", f"{a}+{b}")

    def heldout(self, n: int) -> list[Problem]:
        return [self.sample(random.Random(i)) for i in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        return Verdict(0.0, False, "episodes only")

    def make_env(self, problem: Problem) -> FixedShapeEnv:
        return FixedShapeEnv(problem)

    def render(self, messages: list[Message]) -> str:
        return render_plain(messages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = build_config({"rollout": {"prompts_per_step": 8, "group_size": 8}, "algo": {"steps": args.steps}})
    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0)
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as out:
        train_grpo(cfg, model, tok, FixedShapeTask(), Path(out), sink)
    rows = [m for s, m in sorted(sink.by_step.items()) if s > args.warmup]
    n_ep = 64
    step = sum(r["perf/step_s"] for r in rows) / len(rows)
    gen = sum(r["perf/gen_s"] for r in rows) / len(rows)
    tools = sum(r["perf/tool_s"] for r in rows) / len(rows)
    result = {"provenance": provenance(),
              "shape": {"episodes": n_ep, "turns": TURNS, "turn_tokens": TURN_TOKENS, "tool_calls_per_episode":
                        TURNS - 1}, "episodes_per_s": n_ep / step, "step_s": step,
              "share": {"generation": gen / step, "tools": tools / step, "training": (step - gen - tools) / step},
              "turns_mean": sum(r["episode/turns_mean"] for r in rows) / len(rows),
              "policy_tokens_per_episode": sum(r["rollout/len_mean"] for r in rows) / len(rows),
              "steps_measured": len(rows), "threads": args.threads}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
