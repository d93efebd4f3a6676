"""`feedbackrl.train(...)`: the Python API runs a few GRPO steps on the tiny model with a reward function and a
task object from the calling code, returns the report, and refuses what it cannot run with a clear error."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import feedbackrl
from feedbackrl.config import ConfigError
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.base import Task
from feedbackrl.rewards.python_fn import RewardFunctionError
from feedbackrl.rewards.verdict import Problem, Verdict

TOY = {"task": {"name": "reverse", "options": {"min_len": 3, "max_len": 4, "alphabet_size": 5}, "heldout_size": 4},
       "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
       "algo": {"steps": 2}, "eval": {"pass_k": 0}, "train": {"threads": 1}, "monitors": {"enabled": False}}


class Mirror(Task):
    """Write the three letters backwards."""

    name = "mirror"

    def sample(self, rng: random.Random) -> Problem:
        w = "".join(rng.choice("abc") for _ in range(3))
        return Problem(w + "=", w[::-1])

    def heldout(self, n: int) -> list[Problem]:
        return [self.sample(random.Random(i)) for i in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        ok = completion.strip() == problem.answer
        return Verdict(float(ok), ok, "mirror")


def test_train_with_a_reward_function_and_a_task_object(tmp_path: Path) -> None:
    seen: list[float] = []

    def first_letter(problem: Problem, completion: str) -> float:
        seen.append(float(completion[:1] == problem.answer[:1]))
        return seen[-1]

    report = feedbackrl.train(TOY, out=tmp_path / "run", reward=first_letter, task=Mirror(),
                              overrides={"algo.lr": 1e-3})
    assert report["task"] == "mirror" and report["reward"] == "python" and report["algo"] == "grpo"
    assert report["eval_after"] is not None and json.loads((tmp_path / "run" / "report.json").read_text()) == report
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"]["name"] == "mirror" and config["algo"]["lr"] == 1e-3
    assert len(seen) == 8  # 2 steps x 2 prompts x 2 samples
    steps = [r["reward/mean"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert steps == pytest.approx([sum(seen[:4]) / 4, sum(seen[4:]) / 4], abs=1e-6)


def test_a_trl_function_with_its_options_and_string_overrides(tmp_path: Path) -> None:
    def accuracy_reward(completions: list[str], prompts: list[str], answer: list[str], **kwargs) -> list[float]:
        return [1.0 if c.strip() == a else -1.0 for c, a in zip(completions, answer, strict=True)]

    report = feedbackrl.train(TOY, out=tmp_path / "run", overrides=["algo.steps=1"],
                              reward={"function": accuracy_reward, "signature": "trl", "score_range": [-1, 1]})
    assert report["reward"] == "python"
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r] == [1]


def test_a_reward_function_that_raises_names_itself(tmp_path: Path) -> None:
    def needs_meta(problem: Problem, completion: str) -> float:
        return problem.meta["difficulty"]

    with pytest.raises(RewardFunctionError, match=r"^reward function '.*needs_meta' \(the reward argument\) raised"):
        feedbackrl.train(TOY, out=tmp_path / "run", reward=needs_meta)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"reward": lambda p, c: 0.0, "overrides": {"reward.source": "math"}}, "given as an argument and in the recipe"),
    ({"reward": {"signature": "batch"}}, "a dict of options needs 'function'"),
    ({"reward": {"function": len, "range": [0, 2]}}, "unknown option(s) ['range']"),
    ({"task": Mirror}, "got the class Mirror, expected a task object"),
    ({"task": object()}, "a object without ['name', 'sample'"),
    ({"overrides": {"algo.stpes": 3}}, "algo.stpes: unknown key"),
    ({"task": Mirror(), "overrides": {"scale.rollout_workers": 1}}, "runs in this process: set scale.rollout_workers"),
])
def test_mistakes_are_config_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        feedbackrl.train(TOY, out=tmp_path / "run", **kwargs)
    assert message in str(e.value)
    assert not (tmp_path / "run").exists()  # refused before any work
