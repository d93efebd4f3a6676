"""Tasks whose episodes another program plays: the environment runs elsewhere and reaches the policy
over HTTP, then hands back what training needs.

An `ExternalTask` does not decode anything itself. For each collect step the loop serves the current
policy on a loopback OpenAI-compatible endpoint (`serve/openai_api.py`, started by
`episodes/external.py`) and calls `play(endpoint, problems, ...)`; the task runs its environment's
episodes against that endpoint and returns one `ExternalEpisode` per problem: the token ids of the
whole sequence as the environment recorded them, which of them the policy sampled (the loss
mask), their sampling log-probs, and the verdict with its evidence. `envs/verifiers_env.py` is the
one implementation (environments written for the `verifiers` library).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from feedbackrl.envs.base import Task
from feedbackrl.envs.multi_turn import EpisodeRecord
from feedbackrl.rewards.verdict import Problem


@dataclass
class ExternalEpisode:
    """One episode as the external environment recorded it."""

    token_ids: list[int]  # the whole sequence: prompt, the policy's turns and the environment's messages
    sampled: list[bool]  # (len(token_ids),) True on the tokens the policy sampled
    logprobs: list[float]  # (len(token_ids),) sampling log-prob of each sampled token, 0.0 elsewhere
    reward: float  # the environment's reward for the episode (trained on as is)
    record: EpisodeRecord  # transcript and verdict (score = reward clipped to [0, 1], evidence in details)

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.sampled) == len(self.logprobs):
            raise ValueError(f"external episode: {len(self.token_ids)} token ids, {len(self.sampled)} mask "
                             f"entries and {len(self.logprobs)} log-probs; they must align")

    @property
    def prompt_len(self) -> int:
        """Tokens before the policy's first sampled token (the whole sequence when it sampled none)."""
        return next((i for i, s in enumerate(self.sampled) if s), len(self.sampled))


@runtime_checkable
class ExternalTask(Task, Protocol):
    """A task whose episodes an external environment plays against the policy's endpoint."""

    kind: str = "external"  # its collect step and evaluation: `episodes/external.py`

    def play(self, endpoint: str, tokenizer_dir: str, problems: Sequence[Problem],
             sampling: dict[str, Any]) -> list[ExternalEpisode]:
        """One episode per problem (repeat problems for groups), in order. `endpoint` is the server root
        (``http://127.0.0.1:PORT``), `tokenizer_dir` the policy's tokenizer with a chat template (for
        environments that tokenize on their side), `sampling` OpenAI sampling fields (temperature,
        top_p, max_tokens). A failed episode comes back with reward 0 and its error as evidence."""
        ...
