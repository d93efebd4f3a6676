"""guess-number: a `verifiers` v1 environment in the style of a third-party package (test fixture).

Its own `Env` subclass with one agent seat named `player` (not verifiers' default `agent`), played
turn by turn with `agents.player.interaction(task)`: the player guesses a secret number in
[1, `high`], the environment answers "higher", "lower" or "correct", for at most `max_guesses`
guesses. Reward: 1.0 when a reply is exactly the secret number (surrounding whitespace ignored),
else 0.0; the number of guesses is a `@vf.metric`.
"""

import random

import verifiers.v1 as vf


class GuessNumberData(vf.TaskData):
    answer: str
    """The secret number, as text."""


class GuessNumberTask(vf.Task[GuessNumberData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        replies = [(m.content or "").strip() for m in trace.messages if m.role == "assistant"]
        return float(self.data.answer in replies)

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessNumberConfig(vf.TasksetConfig):
    num_tasks: int = 16
    high: int = 3
    seed: int = 0


class GuessNumberTaskset(vf.Taskset[GuessNumberTask, GuessNumberConfig]):
    def load(self) -> list[GuessNumberTask]:
        rng = random.Random(self.config.seed)
        return [GuessNumberTask(GuessNumberData(prompt=f"guess 1-{self.config.high}=",
                                                answer=str(rng.randint(1, self.config.high))), self.config.task)
                for _ in range(self.config.num_tasks)]


class GuessNumberEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    max_guesses: int = 3


def feedback(reply: str, answer: str) -> str:
    """The game's answer to one guess."""
    try:
        guess = int(reply.strip())
    except ValueError:
        return "a number="
    return "correct" if guess == int(answer) else "higher=" if guess < int(answer) else "lower="


class GuessNumberEnv(vf.Env[GuessNumberEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.player.interaction(task) as game:
            segment = await game.turn()
            for _ in range(self.config.max_guesses - 1):
                if segment.terminated:
                    return
                said = feedback(segment.last_reply, task.data.answer)
                if said == "correct":
                    return
                segment = await game.turn(said)


__all__ = ["GuessNumberEnv", "GuessNumberTaskset"]
