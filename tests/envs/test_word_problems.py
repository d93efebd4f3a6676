"""Word problems: every template's answer is its story's arithmetic, held-out questions never train, bad options
are refused."""

from __future__ import annotations

import random
import re

import pytest

from feedbackrl.config import load_config
from feedbackrl.envs.procedural.word_problems import TEMPLATES, WordProblemTask, _t_buy_give, _t_packs_left
from feedbackrl.envs.reasoning_gym import is_heldout
from feedbackrl.envs.registry import make_task


def _numbers(question: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", question)]


def test_answers_follow_the_story_hand_checked():
    # "has a, buys b more, gives c": a + b - c, whatever the numbers drawn
    q, ans = _t_buy_give(random.Random(3), 20)
    a, b, c = _numbers(q)
    assert ans == a + b - c and f"buys {b} more" in q
    # "has own, buys packs of per each, gives c": own + packs * per - c
    q, ans = _t_packs_left(random.Random(5), 20)
    own, packs, per, c = _numbers(q)
    assert ans == own + packs * per - c


def test_every_template_gives_a_nonnegative_integer_within_bounds():
    rng = random.Random(0)
    for t in TEMPLATES:
        for _ in range(200):
            q, ans = t.make(rng, 20)
            assert isinstance(ans, int) and ans >= 0, (t.make.__name__, q, ans)
            assert q.endswith("?")


def test_steps_select_templates_and_heldout_is_disjoint_and_fixed():
    task = WordProblemTask(steps=[1])
    rng = random.Random(0)
    train = [task.sample(rng) for _ in range(300)]
    assert {p.meta["steps"] for p in train} == {1}
    held = task.heldout(50)
    assert len({p.prompt for p in held}) == 50 and all(is_heldout(p.prompt, 0.1) for p in held)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert [p.prompt for p in WordProblemTask(steps=[1]).heldout(50)] == [p.prompt for p in held]
    assert task.heldout(10) == held[:10]


def test_verdicts_read_the_final_number():
    task = WordProblemTask()
    p = task.heldout(1)[0]
    wrong = str(int(p.answer) + 1)
    assert task.verify(p, f"First 2 + 3 = 5. The answer is {p.answer}.").passed
    assert not task.verify(p, f"The answer is {wrong}.").passed
    assert not task.verify(p, "").passed
    assert task.verify(p, task.demonstrate(p, random.Random(0))).passed


@pytest.mark.parametrize("options", [{"steps": []}, {"steps": [4]}, {"steps": [True]}, {"max_number": 4},
                                     {"heldout_fraction": 0.0}])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match="word_problems"):
        WordProblemTask(**options)


def test_recipe_builds_the_task():
    cfg = load_config("recipes/smollm2_word_grpo.toml")
    task = make_task(cfg.task)
    assert isinstance(task, WordProblemTask) and task.steps == (1, 2, 3) and task.max_number == 20
