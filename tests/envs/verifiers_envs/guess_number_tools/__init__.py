"""guess-number-tools: guess-number with a per-rollout `vf.Toolset` (test fixture).

The same game and reward as `guess_number`, and each rollout gets its own calculator tool server
(`Task.toolsets`, a `vf.Toolset` with one `@vf.tool`, `add`), offered to the player in every model
request. Tool calls are recorded in the trace and score nothing.
"""

import random

import verifiers.v1 as vf
from guess_number import GuessNumberConfig, GuessNumberData, GuessNumberEnvConfig, feedback

from guess_number_tools.calculator import CalculatorToolset


class GuessToolsTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class GuessToolsTask(vf.Task[GuessNumberData, vf.State, GuessToolsTaskConfig]):
    @classmethod
    def toolsets(cls, config: GuessToolsTaskConfig) -> list[vf.Toolset]:
        return [CalculatorToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        replies = [(m.content or "").strip() for m in trace.messages if m.role == "assistant"]
        return float(self.data.answer in replies)


class GuessToolsConfig(GuessNumberConfig):
    task: GuessToolsTaskConfig = GuessToolsTaskConfig()


class GuessToolsTaskset(vf.Taskset[GuessToolsTask, GuessToolsConfig]):
    def load(self) -> list[GuessToolsTask]:
        rng = random.Random(self.config.seed)
        return [GuessToolsTask(GuessNumberData(prompt=f"guess 1-{self.config.high}=",
                                               answer=str(rng.randint(1, self.config.high))), self.config.task)
                for _ in range(self.config.num_tasks)]


class GuessToolsEnv(vf.Env[GuessNumberEnvConfig]):
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


__all__ = ["GuessToolsEnv", "GuessToolsTaskset"]
