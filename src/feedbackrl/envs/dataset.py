"""Dataset-backed tasks: prompts and gold answers from a file, judged by a named verifier.

Rows are read eagerly and checked up front, so a bad row fails the run before any training
with its index and the columns that do exist, instead of crashing mid-run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbackrl.rewards.verdict import Problem, Verdict, fail


class DatasetError(ValueError):
    """A dataset file or row that cannot be used; the message names the row and columns."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file (one JSON object per line)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: row {i} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
        rows.append(row)
    if not rows:
        raise DatasetError(f"dataset file {str(path)!r} has no rows")
    return rows


def exact_match(problem: Problem, completion: str) -> Verdict:
    got, want = completion.strip(), str(problem.answer).strip()
    if not got:
        return fail("empty completion", expected=want)
    ok = got == want
    return Verdict(float(ok), ok, "exact match" if ok else "does not match the reference",
                   {"completion": got[:200], "expected": want})


@dataclass
class DatasetTask:
    """Problems from a JSONL file; a fixed `heldout_fraction` of rows is kept for eval."""

    path: str
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    heldout_fraction: float = 0.1
    name: str = "dataset"
    _train: list[Problem] = field(init=False, repr=False)
    _heldout: list[Problem] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise DatasetError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        problems = []
        for i, row in enumerate(read_rows(self.path)):
            missing = [f for f in (self.prompt_field, self.answer_field) if f not in row]
            if missing:
                raise DatasetError(f"{self.path}: row {i} has no column {missing[0]!r}; "
                                   f"its columns are {sorted(row)}. Set task.options.prompt_field / "
                                   "answer_field to map your columns.")
            if not isinstance(row[self.prompt_field], str) or not row[self.prompt_field]:
                raise DatasetError(f"{self.path}: row {i} column {self.prompt_field!r} must be a non-empty string")
            problems.append(Problem(row[self.prompt_field], row[self.answer_field], {"row": i}))
        order = list(range(len(problems)))
        random.Random(0).shuffle(order)
        n_held = int(round(len(problems) * self.heldout_fraction))
        self._heldout = [problems[i] for i in order[:n_held]]
        self._train = [problems[i] for i in order[n_held:]]
        if not self._train:
            raise DatasetError(f"{self.path}: no training rows left after holding out {n_held}")

    def sample(self, rng: random.Random) -> Problem:
        return self._train[rng.randrange(len(self._train))]

    def heldout(self, n: int) -> list[Problem]:
        return self._heldout[:n]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        return exact_match(problem, completion)
