"""tiny-reverse: a `verifiers` v1 environment the tiny character-level model can play.

Written in verifiers' own API (a `Taskset` of `Task`s with a `@vf.reward`), loaded by module name
(`tiny_reverse`) from the directory above this one. One turn: the prompt is a short word followed
by ``=`` (letters from a small alphabet), the answer is the word reversed. The reward is the
similarity ratio (difflib) between the reply and the reversal: 1.0 when exact, partial credit
otherwise, so even an untrained policy's rewards vary within a group.
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
    async def similarity(self, trace: vf.Trace) -> float:
        reply = (trace.last_reply or "").strip()
        return SequenceMatcher(None, reply, self.data.answer).ratio()


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
