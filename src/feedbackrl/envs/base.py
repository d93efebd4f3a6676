"""What a task is: where prompts come from and how completions are judged.

A `Task` hands out training problems from its own seeded stream, a fixed held-out set for
evaluation, and a verdict for each completion. Procedural tasks can also write (possibly noisy)
demonstrations for SFT warm starts. Tasks with internal state (adaptive difficulty) expose
`state_dict`/`load_state_dict` so a checkpoint can resume them exactly.
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

from feedbackrl.rewards.verdict import Problem, Verdict


@runtime_checkable
class Task(Protocol):
    name: str

    def sample(self, rng: random.Random) -> Problem:
        """One training problem drawn with `rng` (never one of the held-out problems)."""
        ...

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` held-out problems; the same list on every call."""
        ...

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Judge a completion. Never raises on malformed completions."""
        ...


@runtime_checkable
class Demonstrates(Protocol):
    """Tasks that can write a demonstration (used for SFT warm starts)."""

    def demonstrate(self, problem: Problem, rng: random.Random) -> str: ...


@runtime_checkable
class Stateful(Protocol):
    """Tasks whose state must be checkpointed (e.g. adaptive difficulty)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def observe(self, problems: list[Problem], verdicts: list[Verdict]) -> None:
        """Feed back the verdicts of a training batch (adaptive difficulty uses pass rates)."""
        ...
