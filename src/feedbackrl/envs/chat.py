"""A task whose prompts are rendered with the model's chat template (see `models/chat.py`).

`ChatTask(task, tokenizer, system_prompt)` hands out the wrapped task's problems with
`prompt = render_prompt(tokenizer, original prompt, system_prompt)` and the original text kept in
`meta["raw_prompt"]`; verdicts, feedback, difficulty and state are the wrapped task's. A problem that
carries its conversation (`meta["messages"]`, a chat-format dataset row, ending with the user turn) is
rendered whole, after a `system_prompt` turn unless it has a system turn of its own. Wrapping the
task (rather than each caller) renders every prompt the same way at rollout, eval and SFT.
Demonstrations end with the template's end-of-turn text, so SFT teaches the model to stop.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from feedbackrl.envs.base import Task
from feedbackrl.models.chat import end_of_turn, render_prompt, use_chat
from feedbackrl.rewards.verdict import Problem, Verdict


class ChatTask(Task):
    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, system_prompt: str = "") -> None:
        self.task, self.tokenizer, self.system_prompt = task, tokenizer, system_prompt
        self.name = task.name
        self._heldout: list[Problem] = []

    def render(self, problem: Problem) -> Problem:
        """`problem` with its prompt in the chat template (its conversation, or the prompt as one user turn)."""
        convo = problem.meta.get("messages")
        if convo:
            head = [] if convo[0]["role"] == "system" or not self.system_prompt else \
                [{"role": "system", "content": self.system_prompt}]
            prompt = self.tokenizer.apply_chat_template([*head, *convo], tokenize=False, add_generation_prompt=True)
        else:
            prompt = render_prompt(self.tokenizer, problem.prompt, self.system_prompt)
        return dataclasses.replace(problem, prompt=prompt, meta={**problem.meta, "raw_prompt": problem.prompt})

    def sample(self, rng: random.Random) -> Problem:
        return self.render(self.task.sample(rng))

    def heldout(self, n: int) -> list[Problem]:
        if len(self._heldout) < n:
            self._heldout = [self.render(p) for p in self.task.heldout(n)]
        return self._heldout[:n]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        return self.task.verify(problem, completion)

    def verify_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        return self.task.verify_batch(problems, completions)

    def observe(self, problems: Sequence[Problem], verdicts: Sequence[Verdict]) -> None:
        self.task.observe(problems, verdicts)

    @property
    def difficulty(self) -> int | None:
        return self.task.difficulty

    def state_dict(self) -> dict[str, Any] | None:
        return self.task.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.task.load_state_dict(state)

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        return self.task.demonstrate(problem, rng) + end_of_turn(self.tokenizer)


def chat_task(task: Task, tokenizer: PreTrainedTokenizerBase, mode: str, system_prompt: str = "") -> Task:
    """`task` with chat-rendered prompts when `mode` (model.chat_template) and the tokenizer call for it."""
    return ChatTask(task, tokenizer, system_prompt) if use_chat(tokenizer, mode) else task
