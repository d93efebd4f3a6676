"""Multi-digit addition: a procedural task with a truthful verifier and untruthful demonstrations.

Prompts look like ``"37+85="``; the expected completion is the decimal sum followed by EOS. With
`reverse=True` the sum is written least-significant digit first (``"221"`` for 122), the usual
trick that makes addition learnable by a tiny transformer in a few hundred steps: each digit then
depends only on digits already seen, plus the carry.
`demonstrate` plays a sloppy teacher: with probability `demo_noise` it "forgets the carries"
(adds digit by digit, mod 10), so the SFT warm start learns a mixture of right and wrong habits.
The verifier only accepts the true sum, which is what GRPO then optimises.

Held-out problems are a fixed ~10% of the (a, b) space, chosen by a deterministic hash, and
never drawn for training.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass

from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict, fail

_INT = re.compile(r"-?\d+")


def no_carry_sum(a: int, b: int) -> int:
    """Digit-wise sum mod 10: what a student who forgets every carry writes."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def is_heldout_pair(a: int, b: int) -> bool:
    """About 1 pair in 10, by a hash of both whole operands.

    Never select on a linear form of the operands: (7919 a + 104729 b + 13) mod 10, used here once,
    depends on the last digits only and held out exactly the sums ending in 3, so training never saw
    such a sum and a policy could score on training by avoiding that digit (the tests check the
    held-out sums' last digits are spread).
    """
    return zlib.crc32(f"{a}+{b}".encode()) % 10 == 0


@dataclass
class AdditionTask(Task):
    """Sums of two non-negative integers with up to `digits` digits each."""

    digits: int = 2
    demo_noise: float = 0.0
    reverse: bool = False
    pad_operands: bool = False
    name: str = "addition"

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"addition.digits must be in [1, 9], got {self.digits}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"addition.demo_noise must be in [0, 1], got {self.demo_noise}")

    def _write(self, n: int) -> str:
        return str(n)[::-1] if self.reverse else str(n)

    def _problem(self, a: int, b: int) -> Problem:
        w = self.digits if self.pad_operands else 0  # fixed-width operands: digits line up by position
        return Problem(prompt=f"{a:0{w}d}+{b:0{w}d}=" if w else f"{a}+{b}=", answer=self._write(a + b),
                       meta={"a": a, "b": b})

    def sample(self, rng: random.Random) -> Problem:
        hi = 10**self.digits - 1
        while True:
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            if not is_heldout_pair(a, b):
                return self._problem(a, b)

    def heldout(self, n: int) -> list[Problem]:
        rng, hi, out, seen = random.Random(1_000_003), 10**self.digits - 1, [], set()
        limit = sum(1 for a in range(min(hi, 99) + 1) for b in range(min(hi, 99) + 1) if is_heldout_pair(a, b))
        if self.digits <= 2 and n > limit:
            raise ValueError(f"addition with {self.digits} digits has only {limit} held-out problems; asked {n}")
        while len(out) < n:
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            if is_heldout_pair(a, b) and (a, b) not in seen:
                seen.add((a, b))
                out.append(self._problem(a, b))
        return out

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        a, b = problem.meta["a"], problem.meta["b"]
        return self._write(no_carry_sum(a, b) if rng.random() < self.demo_noise else a + b)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        text = completion.strip()
        if not text:
            return fail("empty completion", expected=problem.answer)
        if not _INT.fullmatch(text):
            return fail("completion is not a bare integer", completion=text[:64], expected=problem.answer)
        ok = text == problem.answer  # exact digits: no leading (or, reversed, trailing) zeros
        return Verdict(score=float(ok), passed=ok,
                       reason="correct sum" if ok else f"wrong sum: got {text}, expected {problem.answer}",
                       details={"completion": text, "expected": problem.answer})


def wrong_sum(problem: Problem, rng: random.Random) -> str:
    """A wrong answer to an addition problem (meta a, b): the sum without its carries where that differs
    (the sloppy student's answer), else the sum one or ten off (never negative)."""
    a, b = problem.meta["a"], problem.meta["b"]
    total, sloppy = a + b, no_carry_sum(a, b)
    if sloppy != total and rng.random() < 0.5:
        return str(sloppy)
    off = rng.choice([d for d in (-10, -1, 1, 10) if total + d >= 0])
    return str(total + off)
