"""Multi-digit addition with a calculator tool: a tool teaches what the weights could not.

The policy sees ``"4821+377="``. With the tool it may call ``calc(4821+377)``, read ``=5198``,
and answer ``5198``; any turn that is not a tool call is its final answer. A whole episode in the
minimal format reads (EOS written as ⏎):

    4821+377=calc(4821+377)⏎=5198
    5198⏎

With a chat template the same episode is the template's rendering of the conversation, the tool
offered as `CALC` (one string parameter, ``expression``) and called in the template's syntax
(`envs/turn_format.py`); every call in a turn is answered with its own tool message.

The verdict is the final answer's exactness; the calculator's output is never judged. With
`tools = false` (the no-tool arm of the comparison) the same prompts must be answered directly: a
tool call gets ``=error: unknown tool calc; tools: none`` and counts as a wasted turn.

`demonstrate` is a sloppy teacher: with probability `demo_noise` it skips the tool and guesses,
writing the first operand as its estimate of the sum (a consistent habit the tiny model learns
easily, so after SFT greedy decoding mostly guesses), otherwise it calls the tool and copies the
result. Demonstrations are conversations (`demo_conversation`): SFT trains on the teacher's turns,
not on the calculator's output. Operands have `min_digits`..`max_digits` digits; held-out
problems are a fixed hash-selected ~10% of pairs, never drawn for training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.envs.multi_turn import (
    EpisodeLimits,
    EpisodicTask,
    Message,
    StepResult,
    Turn,
    demo_conversation,
    render_plain,
    sample_heldout,
)
from feedbackrl.envs.procedural.addition import is_heldout_pair
from feedbackrl.envs.tools import Toolbox, ToolSpec, calculator
from feedbackrl.rewards.verdict import Problem, Verdict, fail

CALC = ToolSpec("calc", "Integer arithmetic: + - * // % ** and parentheses.", "expression",
                "an integer expression, e.g. 4821+377")


def _is_heldout(p: Problem) -> bool:
    return is_heldout_pair(p.meta["a"], p.meta["b"])


def judge_answer(problem: Problem, answer: str) -> Verdict:
    """Exact decimal sum, surrounding spaces ignored; anything else scores 0 with the reason."""
    text = answer.strip()
    if not text:
        return fail("empty answer", expected=problem.answer)
    if not text.isdigit():
        return fail("answer is not a bare non-negative integer", answer=text[:64], expected=problem.answer)
    ok = text == problem.answer
    return Verdict(float(ok), ok, "correct sum" if ok else f"wrong sum: got {text}, expected {problem.answer}",
                   {"answer": text, "expected": problem.answer})


class CalculatorEnv:
    """One episode: tool calls are answered with the calculator's result; any other turn ends it."""

    def __init__(self, problem: Problem, toolbox: Toolbox) -> None:
        self.problem, self.toolbox = problem, toolbox

    def reset(self) -> list[Message]:
        return [{"role": "user", "content": self.problem.prompt}]

    def step(self, turn: Turn) -> StepResult:
        if turn.error is not None:
            return StepResult([{"role": "tool", "content": f"error: {turn.error}"}], False, tool_calls=1,
                              tool_errors=1)
        if not turn.calls:
            return StepResult([], True, judge_answer(self.problem, turn.text))
        results = [self.toolbox.call(call) for call in turn.calls]
        return StepResult([{"role": "tool", "content": r.content} for r in results], False,
                          tool_calls=len(results), tool_errors=sum(not r.ok for r in results))

    def close(self) -> None:
        return None


@dataclass
class CalculatorAdditionTask(EpisodicTask):
    """Sums of two integers with `min_digits`..`max_digits` digits each, played with (or without) a calculator."""

    min_digits: int = 3
    max_digits: int = 4
    tools: bool = True
    demo_noise: float = 0.5
    max_turns: int = 3
    turn_tokens: int = 16
    max_tokens: int = 48
    tool_timeout_s: float = 2.0
    tool_call_penalty: float = 0.0
    turn_penalty: float = 0.0
    turn_credit: float = 0.0
    turn_format: str = "auto"
    name: str = "calculator_addition"
    limits: EpisodeLimits = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= 9, got {self.min_digits}, {self.max_digits}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"demo_noise must be in [0, 1], got {self.demo_noise}")
        self.limits = EpisodeLimits(self.max_turns, self.turn_tokens, self.max_tokens, self.tool_timeout_s)

    def _draw(self, rng: random.Random) -> Problem:
        lo, hi = 10 ** (self.min_digits - 1), 10**self.max_digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})

    def sample(self, rng: random.Random) -> Problem:
        while True:
            p = self._draw(rng)
            if not _is_heldout(p):
                return p

    def heldout(self, n: int) -> list[Problem]:
        return sample_heldout(random.Random(1_000_003), n, self._draw, _is_heldout)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        return judge_answer(problem, completion)

    def make_env(self, problem: Problem) -> CalculatorEnv:
        return CalculatorEnv(problem, Toolbox({"calc": calculator} if self.tools else {}, self.tool_timeout_s,
                                              specs=[CALC]))

    def render(self, messages: list[Message]) -> str:
        return render_plain(messages)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [CALC.schema()] if self.tools else []

    def demonstrate(self, problem: Problem, rng: random.Random) -> list[Message]:
        a, b = problem.meta["a"], problem.meta["b"]
        if rng.random() < self.demo_noise:
            return demo_conversation([str(a)], [])  # skips the tool and guesses
        if not self.tools:
            return demo_conversation([str(a + b)], [])
        call = {"type": "function", "function": {"name": CALC.name, "arguments": {CALC.parameter: f"{a}+{b}"}}}
        return demo_conversation([{"role": "assistant", "content": "", "tool_calls": [call]}, str(a + b)],
                                 [[{"role": "tool", "content": str(a + b)}]])
