"""What a task is: where prompts come from and how completions are judged.

A `Task` hands out training problems from its own seeded stream, a fixed held-out set for
evaluation, and a verdict for each completion. Tasks subclass the protocol to inherit the defaults
of its optional parts, so the training loop calls every method on every task (no capability
checks):

- `verify_batch`: one `verify` per completion; a task with a parallel verifier (code: many
  sandboxes at once) overrides it.
- `observe`: a training batch's verdicts; adaptive tasks move their difficulty, others ignore it.
- `difficulty`: the current difficulty level, or None for tasks without one.
- `state_dict` / `load_state_dict`: internal state a checkpoint must carry (None = none).
- `demonstrate`: a (possibly noisy) demonstration for SFT warm starts; the default writes none
  (`CannotDemonstrate`, which SFT reports as the fix: set sft.steps = 0).
- `kind`: how its problems are rolled out: "single_turn" (one completion per prompt, the default),
  "episodic" (`envs/multi_turn.py:EpisodicTask`) or "external" (`envs/external.py:ExternalTask`). The
  loops look the kind up in `feedbackrl.episodes.kinds.TASK_KINDS`, which brings its own collect step
  and evaluation; nothing asks which class a task is.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from feedbackrl.rewards.verdict import Problem, Verdict


class CannotDemonstrate(TypeError):
    """The task writes no demonstrations, which an SFT warm start needs."""


@runtime_checkable
class Task(Protocol):
    name: str
    kind: str = "single_turn"  # the task kind its rollouts and evaluation come from (see the module docstring)

    def sample(self, rng: random.Random) -> Problem:
        """One training problem drawn with `rng` (never one of the held-out problems)."""
        ...

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` held-out problems; the same list on every call."""
        ...

    def verify(self, problem: Problem, completion: str) -> Verdict:
        """Judge a completion. Never raises on malformed completions."""
        ...

    def verify_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """Judge many completions; the same verdicts as `verify` on each, possibly in parallel."""
        return [self.verify(p, c) for p, c in zip(problems, completions, strict=True)]

    def observe(self, problems: Sequence[Problem], verdicts: Sequence[Verdict]) -> None:
        """Feed back the verdicts of a training batch (adaptive difficulty uses pass rates)."""
        return None

    @property
    def difficulty(self) -> int | None:
        """The difficulty level training problems are drawn at now; None for tasks without levels."""
        return None

    def state_dict(self) -> dict[str, Any] | None:
        """State a checkpoint must carry to resume the task exactly; None for stateless tasks."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            raise ValueError(f"task {self.name!r} has no state to restore, got {sorted(state)}")


    def demonstrate(self, problem: Problem, rng: random.Random) -> str | list[dict[str, Any]]:
        """A demonstration for SFT warm starts: a completion string, or for episodic tasks the conversation
        after the prompt (`envs/multi_turn.py:demo_conversation`). The default writes none."""
        raise CannotDemonstrate(f"task {self.name!r} cannot write demonstrations; set sft.steps = 0")
