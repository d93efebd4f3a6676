"""Adaptive difficulty: the pure level rule, the windowed controller, and the task wrapper."""

from __future__ import annotations

import random

import pytest

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.adaptive import (
    AdaptiveTask,
    DifficultyController,
    adaptive_addition,
    adaptive_reasoning_gym,
    next_level,
)
from feedbackrl.envs.base import Task
from feedbackrl.envs.registry import make_task
from feedbackrl.rewards.verdict import Problem, Verdict


@pytest.mark.parametrize("level, rate, expected", [
    (3, 0.9, 4),   # above the band: harder
    (3, 0.1, 2),   # below the band: easier
    (3, 0.5, 3),   # inside: stay
    (3, 0.7, 3),   # on the edges: stay (the band is closed)
    (3, 0.3, 3),
    (5, 1.0, 5),   # already hardest
    (1, 0.0, 1),   # already easiest
], ids=["up", "down", "inside", "at-high", "at-low", "max", "min"])
def test_next_level(level: int, rate: float, expected: int) -> None:
    assert next_level(level, rate, low=0.3, high=0.7, min_level=1, max_level=5) == expected


def controller(**kw: object) -> DifficultyController:
    return DifficultyController(**{"min_level": 1, "max_level": 5, "level": 2, "window": 4, **kw})


def test_controller_waits_for_a_full_window() -> None:
    c = controller()
    assert c.update([True, True, True]) == 2 and c.pass_rate is None  # 3 of 4: no decision yet
    assert c.update([True]) == 3  # 4/4 = 1.0 > 0.7


def test_controller_restarts_the_window_after_a_move() -> None:
    c = controller()
    c.update([True] * 4)
    assert c.level == 3 and c.pass_rate is None
    assert c.update([False] * 3) == 3  # only 3 results at the new level
    assert c.update([False]) == 2


def test_controller_window_slides_while_inside_the_band() -> None:
    c = controller()
    assert c.update([True, False, True, False]) == 2  # 0.5
    assert c.update([True]) == 2  # window [F, T, F, T] = 0.5
    assert c.update([True]) == 3  # window [T, F, T, T] = 0.75 > 0.7


def test_controller_stays_within_bounds() -> None:
    c = controller(level=5)
    for _ in range(3):
        c.update([True] * 4)
    assert c.level == 5
    for _ in range(10):
        c.update([False] * 4)
    assert c.level == 1


def test_controller_state_round_trip() -> None:
    a = controller()
    a.update([True, False, True])
    b = controller()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == {"level": 2, "recent": [True, False, True]}
    for batch in ([True], [True, True, True, True], [False, False], [False, False]):
        assert a.update(batch) == b.update(batch)


@pytest.mark.parametrize("kw, match", [
    ({"min_level": 4, "max_level": 2, "level": 3}, "min_level=4 must be <= max_level=2"),
    ({"level": 9}, r"start level 9 must be in \[1, 5\]"),
    ({"low": 0.8, "high": 0.7}, "low < high"),
    ({"window": 0}, "window must be >= 1"),
], ids=["range", "start", "band", "window"])
def test_controller_rejects_bad_settings(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        controller(**kw)


def test_load_rejects_a_level_out_of_range() -> None:
    with pytest.raises(ValueError, match="saved level 7"):
        controller().load_state_dict({"level": 7, "recent": []})


# --- the task wrapper ----------------------------------------------------------------------------


def verdicts(passed: bool, n: int) -> list[Verdict]:
    return [Verdict(float(passed), passed, "test")] * n


def test_adaptive_addition_is_a_stateful_task() -> None:
    task = adaptive_addition(eval_level=3, max_level=4, window=8)
    assert isinstance(task, Task) and task.state_dict() is not None
    assert task.difficulty == 1


def test_adaptive_addition_levels_are_digits_and_move_with_pass_rate() -> None:
    task = adaptive_addition(eval_level=3, max_level=4, window=8)
    rng = random.Random(0)
    batch = [task.sample(rng) for _ in range(8)]
    assert all(p.meta["level"] == 1 and p.meta["a"] < 10 and p.meta["b"] < 10 for p in batch)
    task.observe(batch, verdicts(True, 8))
    assert task.difficulty == 2
    batch = [task.sample(rng) for _ in range(8)]
    assert all(p.meta["level"] == 2 and p.meta["a"] < 100 for p in batch)
    assert any(p.meta["a"] >= 10 for p in batch)
    task.observe(batch, verdicts(False, 8))
    assert task.difficulty == 1


def test_stale_problems_do_not_count_at_the_new_level() -> None:
    task = adaptive_addition(eval_level=2, max_level=3, window=4)
    old = [task.sample(random.Random(i)) for i in range(4)]
    task.observe(old, verdicts(True, 4))
    assert task.difficulty == 2
    task.observe(old, verdicts(False, 4))  # level-1 results arriving late: ignored
    assert task.difficulty == 2 and task.controller.pass_rate is None


def test_heldout_stays_at_eval_level() -> None:
    task = adaptive_addition(eval_level=3, max_level=4, window=4)
    before = task.heldout(20)
    task.observe([task.sample(random.Random(0)) for _ in range(4)], verdicts(True, 4))
    assert task.difficulty == 2
    assert task.heldout(20) == before
    assert all(p.meta["level"] == 3 for p in before) and max(p.meta["a"] for p in before) >= 100


def test_verify_uses_the_problems_level_and_reports_it() -> None:
    task = adaptive_addition(eval_level=2, max_level=3, window=4)
    p = task.sample(random.Random(0))
    v = task.verify(p, task.demonstrate(p, random.Random(0)))
    assert v.passed and v.details["level"] == 1
    assert not task.verify(p, "x").passed


def test_task_state_round_trip_resumes_exactly() -> None:
    a = adaptive_addition(eval_level=2, max_level=4, window=4)
    a.observe([a.sample(random.Random(0)) for _ in range(4)], verdicts(True, 4))
    a.observe([a.sample(random.Random(1)) for _ in range(2)], verdicts(False, 2))
    b = adaptive_addition(eval_level=2, max_level=4, window=4)
    b.load_state_dict(a.state_dict())
    assert b.difficulty == a.difficulty == 2 and b.state_dict() == a.state_dict()
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert [a.sample(rng_a) for _ in range(5)] == [b.sample(rng_b) for _ in range(5)]


def test_levels_must_be_consecutive_and_cover_eval_level() -> None:
    c = DifficultyController(1, 2, 1)
    with pytest.raises(ValueError, match="consecutive"):
        AdaptiveTask({1: adaptive_addition(eval_level=1).levels[1], 3: adaptive_addition(eval_level=1).levels[1]},
                     c, eval_level=1)
    with pytest.raises(ValueError, match="eval_level=7"):
        adaptive_addition(eval_level=7, max_level=4)


def test_demonstrate_needs_an_inner_task_that_demonstrates() -> None:
    class Plain(Task):
        name = "plain"

        def sample(self, rng: random.Random) -> Problem:
            return Problem("q", "a")

        def heldout(self, n: int) -> list[Problem]:
            return []

        def verify(self, problem: Problem, completion: str) -> Verdict:
            return Verdict(0.0, False, "no")

    task = AdaptiveTask({0: Plain()}, DifficultyController(0, 0, 0), eval_level=0)
    with pytest.raises(TypeError, match="'plain' cannot write demonstrations; set sft.steps = 0"):
        task.demonstrate(task.sample(random.Random(0)), random.Random(0))


SUMS = {"min_terms": 2, "max_terms": 2, "operators": ["+"], "allow_parentheses": False, "allow_negation": False}


def test_adaptive_reasoning_gym_levels_are_config_overrides() -> None:
    task = adaptive_reasoning_gym(dataset="basic_arithmetic", config=SUMS, eval_level=1, window=4,
                                  levels=[{"max_digits": 1}, {"min_digits": 3, "max_digits": 3}])
    rng = random.Random(0)
    easy = [task.sample(rng) for _ in range(4)]
    assert all(int(p.answer) <= 20 for p in easy)
    task.observe(easy, verdicts(True, 4))
    assert task.difficulty == 1
    hard = [task.sample(rng) for _ in range(4)]
    assert all(int(p.answer) >= 100 for p in hard) and all(p.meta["level"] == 1 for p in hard)
    assert all(int(p.answer) >= 100 for p in task.heldout(5))
    assert task.verify(hard[0], hard[0].answer).passed


def test_registry_builds_adaptive_tasks_and_checks_options() -> None:
    t = make_task(TaskConfig(name="adaptive_addition", options={"eval_level": 2, "max_level": 3}))
    assert isinstance(t, AdaptiveTask) and t.name == "adaptive_addition"
    t = make_task(TaskConfig(name="adaptive_reasoning_gym", options={
        "dataset": "basic_arithmetic", "config": SUMS, "levels": [{"max_digits": 1}, {"max_digits": 2}],
        "eval_level": 1}))
    assert isinstance(t, AdaptiveTask) and t.controller.max_level == 1
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['digits'\].*allowed: .*eval_level"):
        make_task(TaskConfig(name="adaptive_addition", options={"eval_level": 2, "digits": 3}))
    with pytest.raises(ConfigError, match="eval_level"):
        make_task(TaskConfig(name="adaptive_addition", options={}))
    with pytest.raises(ConfigError, match="non-empty list of config dicts"):
        make_task(TaskConfig(name="adaptive_reasoning_gym", options={"dataset": "basic_arithmetic", "levels": [],
                                                                       "eval_level": 0}))
