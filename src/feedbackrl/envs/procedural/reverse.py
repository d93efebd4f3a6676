"""Reverse a word: a procedural task with a truthful verifier and a sloppy teacher.

Prompts look like ``"hgcaf="``; the expected completion is the word reversed (``"facgh"``)
followed by EOS. `demonstrate` plays an annotator who, on words of `sloppy_from` letters or
more, forgets to reverse with probability `demo_noise` and copies the word as written. A policy
warm-started on those demonstrations inherits the habit (greedy decoding copies long words), while
sampling still finds the right answer often enough for RL against the truthful verifier to fix it.

Why this task for the demo rather than addition: each output token depends on a single input
token, which a 1M-parameter model learns in a few hundred CPU steps; the units digit of a sum is
a modular function of two digits with no signal from either alone, and a tiny model plateaus on
it for thousands of steps (measured: SFT loss flat at ln 10 for 1,500 steps).

Held-out words are a fixed ~10% of all words, chosen by a deterministic hash, never trained on.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict, fail

SYMBOLS = {"letters": "abcdefghijklmnopqrstuvwxyz", "digits": "0123456789"}


def _is_heldout(word: str) -> bool:
    return zlib.crc32(word.encode()) % 10 == 0


@dataclass
class ReverseTask(Task):
    """Words of `min_len`..`max_len` symbols drawn from the first `alphabet_size` lowercase letters, or with
    `symbols = "digits"` the first `alphabet_size` digits ("0".."9"; strings such as "40721", which tokenizers
    that split numbers into digits, e.g. SmolLM2's, see one token per symbol)."""

    min_len: int = 3
    max_len: int = 7
    alphabet_size: int = 10
    demo_noise: float = 0.0
    sloppy_from: int = 5
    symbols: str = "letters"
    name: str = "reverse"

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len <= 32:
            raise ValueError(f"reverse: need 1 <= min_len <= max_len <= 32, got {self.min_len}, {self.max_len}")
        if self.symbols not in SYMBOLS:
            raise ValueError(f"reverse.symbols must be one of {sorted(SYMBOLS)}, got {self.symbols!r}")
        if not 2 <= self.alphabet_size <= len(SYMBOLS[self.symbols]):
            raise ValueError(f"reverse.alphabet_size must be in [2, {len(SYMBOLS[self.symbols])}] with symbols = "
                             f"{self.symbols!r}, got {self.alphabet_size}")
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"reverse.demo_noise must be in [0, 1], got {self.demo_noise}")

    def _word(self, rng: random.Random) -> str:
        letters = SYMBOLS[self.symbols][: self.alphabet_size]
        return "".join(rng.choice(letters) for _ in range(rng.randint(self.min_len, self.max_len)))

    @staticmethod
    def _problem(word: str) -> Problem:
        return Problem(prompt=f"{word}=", answer=word[::-1], meta={"word": word, "length": len(word)})

    def sample(self, rng: random.Random) -> Problem:
        while True:
            word = self._word(rng)
            if not _is_heldout(word):
                return self._problem(word)

    def heldout(self, n: int) -> list[Problem]:
        rng, out, seen = random.Random(1_000_003), [], set()
        for _ in range(1000 * n):
            word = self._word(rng)
            if _is_heldout(word) and word not in seen:
                seen.add(word)
                out.append(self._problem(word))
                if len(out) == n:
                    return out
        raise ValueError(f"reverse: could not find {n} distinct held-out words; widen the alphabet or lengths")

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        word = problem.meta["word"]
        sloppy = len(word) >= self.sloppy_from and rng.random() < self.demo_noise
        return word if sloppy else word[::-1]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        text = completion.strip()
        if not text:
            return fail("empty completion", expected=problem.answer)
        ok = text == problem.answer
        if ok:
            reason = "correctly reversed"
        elif text == problem.meta.get("word"):
            reason = "copied the word instead of reversing it"
        else:
            reason = f"wrong: got {text[:40]!r}, expected {problem.answer!r}"
        return Verdict(float(ok), ok, reason, {"completion": text[:64], "expected": problem.answer})
