"""tiny-reverse: a `verifiers` v1 environment the tiny character-level model can play.

Written in verifiers' own API (a `Taskset` of `Task`s with a `@vf.reward`), loaded by module name
(`tiny_reverse`) from the directory above this one (`options.path = ["examples/verifiers_envs"]`).
One turn: the prompt is a short word followed by ``=`` (letters from a small alphabet), the answer
is the word reversed.

Reward: 1.0 for the exact reversal (surrounding whitespace ignored), else 0.0. No partial credit:
a similarity reward pays answers that never reverse anything (a constant 3-letter answer scores
0.57-0.86 against 2-4 letter reversals over "abc", and a policy trained on it converges to one).
The difflib similarity to the reversal is recorded as a `@vf.metric` (logged, never rewarded).
"""

import random
from difflib import SequenceMatcher

import verifiers.v1 as vf


class TinyReverseData(vf.TaskData):
    answer: str
    """The prompt's word reversed."""


class TinyReverseTask(vf.Task[TinyReverseData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)

    @vf.metric
    async def similarity(self, trace: vf.Trace) -> float:
        return SequenceMatcher(None, (trace.last_reply or "").strip(), self.data.answer).ratio()


class TinyReverseConfig(vf.TasksetConfig):
    num_tasks: int = 64
    """How many words."""
    alphabet: str = "abc"
    """The letters words are made of."""
    min_len: int = 2
    max_len: int = 4
    seed: int = 0


class TinyReverseTaskset(vf.Taskset[TinyReverseTask, TinyReverseConfig]):
    def load(self) -> list[TinyReverseTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            n = rng.randint(self.config.min_len, self.config.max_len)
            word = "".join(rng.choice(self.config.alphabet) for _ in range(n))
            tasks.append(TinyReverseTask(TinyReverseData(prompt=f"{word}=", answer=word[::-1]), self.config.task))
        return tasks


__all__ = ["TinyReverseTaskset"]
