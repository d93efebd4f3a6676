"""What a monitor sees of one training step: completions, verdicts and the step's metrics.

A `StepRecord` is built live from a loop's rollout batch (`from_batch`, every completion) or,
when replaying a finished run, from the rows of `samples.jsonl` (`from_samples`, the few
completions logged per step). Detectors are pure functions of records and metric rows, so the
same code runs in both places.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from feedbackrl.rewards.verdict import Problem, Verdict

DETAIL_CHARS = 2000  # a sample's verdict details are cut to this many characters of JSON


class RolloutBatch(Protocol):
    """The part of a loop's batch a monitor reads (N = B * G rows, G consecutive rows per problem)."""

    problems: list[Problem]  # (N,)
    texts: list[str]  # (N,)
    verdicts: list[Verdict]  # (N,)


@dataclass
class StepRecord:
    """One step's completions. Rows i*G .. i*G + G - 1 answer the same problem (G = `group_size`)."""

    step: int
    texts: list[str]  # (N,)
    rewards: list[float]  # (N,)
    passed: list[bool]  # (N,)
    reasons: list[str]  # (N,)
    details: list[dict[str, Any]]  # (N,) each verdict's evidence
    group_size: int = 1
    gold: list[float | None] = field(default_factory=list)  # (N,) or empty: gold scores where computed
    prompts: list[str] = field(default_factory=list)  # (N,) or empty (a replay of logs without them)

    @classmethod
    def from_batch(cls, step: int, batch: RolloutBatch) -> StepRecord:
        v = batch.verdicts
        return cls(step, list(batch.texts), [float(x.score) for x in v], [bool(x.passed) for x in v],
                   [x.reason for x in v], [x.details for x in v], group_size(batch.problems),
                   prompts=[p.prompt for p in batch.problems])

    @classmethod
    def from_samples(cls, step: int, rows: Sequence[dict[str, Any]]) -> StepRecord:
        """Rows of `samples.jsonl` for one step (keys as written by `sample_rows`)."""
        return cls(step, [r.get("text", "") for r in rows], [float(r.get("reward", 0.0)) for r in rows],
                   [bool(r.get("passed", False)) for r in rows], [r.get("reason", "") for r in rows],
                   [r.get("details") or {} for r in rows], 1, [r.get("gold") for r in rows],
                   [r["prompt"] for r in rows] if all(isinstance(r.get("prompt"), str) for r in rows) else [])

    def __len__(self) -> int:
        return len(self.texts)


def group_size(problems: Sequence[Problem]) -> int:
    """G: the length of the first run of rows answering the same problem object (1 if none)."""
    if not problems:
        return 1
    g = 1
    while g < len(problems) and problems[g] is problems[0]:
        g += 1
    return g


def spread(n: int, k: int, stride: int) -> list[int]:
    """Up to k row indices out of n: one per group first (rows 0, G, 2G, ...), then the rest in order."""
    first = list(range(0, n, max(stride, 1)))
    rest = [i for i in range(n) if i not in set(first)]
    return (first + rest)[:k]


def _short(details: dict[str, Any]) -> Any:
    text = json.dumps(details, default=str)
    return details if len(text) <= DETAIL_CHARS else {"truncated": text[:DETAIL_CHARS]}


def sample_rows(record: StepRecord, k: int) -> list[dict[str, Any]]:
    """k of the step's completions with their verdicts: the rows `samples.jsonl` holds."""
    rows = []
    for i in spread(len(record), k, record.group_size):
        row = {"step": record.step, "row": i, "prompt": record.prompts[i] if record.prompts else None,
               "text": record.texts[i], "reward": record.rewards[i],
               "passed": record.passed[i], "reason": record.reasons[i], "details": _short(record.details[i])}
        if record.gold and record.gold[i] is not None:
            row["gold"] = record.gold[i]
        rows.append(row)
    return rows
