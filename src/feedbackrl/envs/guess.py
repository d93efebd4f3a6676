"""Find the hidden number: a game where the environment answers every move.

The prompt is ``"guess 1-31:"``; each assistant turn is a number; the environment answers
``higher``, ``lower`` or ends the episode when the guess is right. A turn that is not a number in
range gets ``invalid`` and costs the turn. The verdict is 1 for finding the number within
`max_turns` turns; `turn_penalty` (subtracted from the trajectory reward per turn) pays for finding
it sooner. Each move's per-turn reward (for turn-level credit, `turn_credit`) is minus the share of
the numbers still possible that the worse of the two answers would leave: -1 for an invalid move or
one that contradicts earlier feedback (guessing 20 after "lower" at 12), about -0.5 for bisecting,
-0.74 for a quarter-step from 1..31, 0 for naming the only number left.

Binary search finds any of 1..31 in at most 5 guesses. `demonstrate` is a cautious player: with
probability `demo_noise` per move it guesses a quarter of the way into the numbers still possible
(consistent with the feedback, but slow: up to 9 moves on 1..31), otherwise the midpoint.
Every game starts from the same prompt, so the policy cannot memorise a secret: what it learns is
a strategy, and the training distribution of secrets. A held-out subset of secrets would therefore
test a shifted distribution (a first version held out multiples of 5: GRPO learned never to guess
them, and held-out success fell to 0 while training success rose). So training draws secrets
uniformly, and evaluation plays every secret in turn (`heldout(n)` cycles 1..hi): the exact
success rate of the strategy under the training distribution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from feedbackrl.envs.multi_turn import (
    EpisodeLimits,
    EpisodicTask,
    Message,
    StepResult,
    Turn,
    demo_conversation,
    render_plain,
)
from feedbackrl.rewards.verdict import Problem, Verdict, fail


class GuessEnv:
    """One game: `secret` in [1, hi]; the bounds the feedback so far allows are tracked for per-turn rewards."""

    def __init__(self, problem: Problem, hi: int) -> None:
        self.problem, self.secret, self.hi = problem, int(problem.answer), hi
        self.low, self.high, self.moves = 1, hi, 0

    def reset(self) -> list[Message]:
        return [{"role": "user", "content": self.problem.prompt}]

    def step(self, turn: Turn) -> StepResult:
        self.moves += 1
        text = turn.text.strip()
        if not text.isdigit() or not 1 <= int(text) <= self.hi:
            return StepResult([{"role": "user", "content": "invalid"}], False, reward=-1.0)
        g = int(text)
        reward = self.move_reward(g)
        if g == self.secret:
            return StepResult([], True, Verdict(1.0, True, f"found {g} in {self.moves} moves", {"moves": self.moves}),
                              reward=reward)
        if g < self.secret:
            self.low = max(self.low, g + 1)
            return StepResult([{"role": "user", "content": "higher"}], False, reward=reward)
        self.high = min(self.high, g - 1)
        return StepResult([{"role": "user", "content": "lower"}], False, reward=reward)

    def move_reward(self, g: int) -> float:
        """Minus the share of the still-possible numbers that the worse answer to guess `g` would leave.

        Bisection leaves about half (-0.48 for 16 on 1..31), a quarter-step three quarters (-0.74 for 8);
        a guess the feedback already ruled out leaves them all (-1), the last possible number none (0).
        """
        n = self.high - self.low + 1
        if not self.low <= g <= self.high:
            return -1.0
        return -max(g - self.low, self.high - g) / n

    def close(self) -> None:
        return None


@dataclass
class GuessNumberTask(EpisodicTask):
    """Find a hidden number in 1..`hi` from higher/lower feedback."""

    hi: int = 31
    demo_noise: float = 0.5
    max_turns: int = 6
    turn_tokens: int = 4
    max_tokens: int | None = None
    turn_penalty: float = 0.0
    tool_call_penalty: float = 0.0
    turn_credit: float = 0.0
    turn_format: str = "auto"
    name: str = "guess_number"
    limits: EpisodeLimits = field(init=False)

    def __post_init__(self) -> None:
        if not 4 <= self.hi <= 999:
            raise ValueError(f"guess_number.hi must be in [4, 999], got {self.hi}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"demo_noise must be in [0, 1], got {self.demo_noise}")
        # by default room for `max_turns` whole moves in the minimal format: a turn, then the longest answer
        # ("invalid\n", one token per character with the tiny tokenizer); a fixed budget silently cut longer
        # games short. A chat template's turns take more tokens: set max_tokens for those.
        budget = self.max_turns * (self.turn_tokens + 8) if self.max_tokens is None else self.max_tokens
        self.limits = EpisodeLimits(self.max_turns, self.turn_tokens, budget)

    def _problem(self, secret: int) -> Problem:
        return Problem(prompt=f"guess 1-{self.hi}:", answer=str(secret), meta={"secret": secret})

    def sample(self, rng: random.Random) -> Problem:
        return self._problem(rng.randint(1, self.hi))

    def heldout(self, n: int) -> list[Problem]:
        """Every secret in turn, 1..hi, then again: with n = hi each exactly once (see the module docstring)."""
        return [self._problem(i % self.hi + 1) for i in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        if completion.strip() == problem.answer:
            return Verdict(1.0, True, "found in one move")
        return fail("not found in one move", guess=completion.strip()[:16])

    def make_env(self, problem: Problem) -> GuessEnv:
        return GuessEnv(problem, self.hi)

    def render(self, messages: list[Message]) -> str:
        return render_plain(messages)

    def demonstrate(self, problem: Problem, rng: random.Random) -> list[Message]:
        secret, lo, hi = problem.meta["secret"], 1, self.hi
        turns, obs = [], []
        while True:
            g = lo + (hi - lo) // 4 if rng.random() < self.demo_noise else (lo + hi) // 2
            turns.append(str(g))
            if g == secret or len(turns) == self.max_turns:
                return demo_conversation(turns, obs)
            lo, hi = (g + 1, hi) if g < secret else (lo, g - 1)
            obs.append([{"role": "user", "content": "higher" if g < secret else "lower"}])
