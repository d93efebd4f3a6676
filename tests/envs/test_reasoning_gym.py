"""reasoning-gym adapter: verdicts from the generator's own scorer, prompts, seeds, held-out split, errors."""

from __future__ import annotations

import math
import random

import pytest
from sft_step import first_sft_loss

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.reasoning_gym import ReasoningGymTask, is_heldout
from feedbackrl.envs.registry import make_task
from feedbackrl.rewards.verdict import Problem

SUMS = {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"], "allow_parentheses": False,
        "allow_negation": False}


@pytest.fixture(scope="module")
def task() -> ReasoningGymTask:
    return ReasoningGymTask("basic_arithmetic", SUMS)


@pytest.fixture(scope="module")
def problem(task: ReasoningGymTask) -> Problem:
    return task.heldout(1)[0]


def test_the_sft_warm_start_trains_on_the_generators_answers(tokenizer, monkeypatch) -> None:
    """SFT (sft.steps > 0) accepts the task and its loss is the policy's on the answers `demonstrate` wrote."""
    got, want, written = first_sft_loss(ReasoningGymTask("basic_arithmetic", SUMS), tokenizer, monkeypatch)
    assert written == 4 and got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("dataset, config", [
    ("basic_arithmetic", SUMS),
    ("chain_sum", {"min_terms": 2, "max_terms": 3, "max_digits": 1}),
    ("spell_backward", {"max_word_len": 5}),
    ("number_sequence", {"max_terms": 5}),
    ("gcd", {"max_value": 50}),
], ids=lambda x: x if isinstance(x, str) else "")
def test_gold_answer_scores_one(dataset: str, config: dict) -> None:
    task = ReasoningGymTask(dataset, config)
    for p in [*task.heldout(5), *(task.sample(random.Random(i)) for i in range(5))]:
        v = task.verify(p, task.demonstrate(p, random.Random(0)))
        assert (v.score, v.passed) == (1.0, True), (p.prompt, p.answer, v)
        assert v.details["dataset"] == dataset and v.details["expected"] == p.answer


def test_prompt_is_the_question(task: ReasoningGymTask, problem: Problem) -> None:
    assert problem.prompt == problem.meta["entry"]["question"]
    assert problem.prompt.startswith("Calculate ") and problem.answer == problem.meta["entry"]["answer"]


def test_prompt_template() -> None:
    t = ReasoningGymTask("basic_arithmetic", SUMS, prompt_template="Q: {question}\nA: ")
    p = t.sample(random.Random(0))
    assert p.prompt == f"Q: {p.meta['entry']['question']}\nA: "


@pytest.mark.parametrize("completion, passed, reason", [
    ("{gold}", True, "accepted"),
    ("  {gold}\n", True, "accepted"),  # surrounding whitespace is not the policy's answer
    ("{wrong}", False, "scored 0"),
    ("x", False, "scored 0"),
    ("", False, "empty completion"),
    ("   \n", False, "empty completion"),
], ids=["gold", "padded", "off-by-one", "junk", "empty", "blank"])
def test_verdict_table(task: ReasoningGymTask, problem: Problem, completion: str, passed: bool, reason: str) -> None:
    v = task.verify(problem, completion.format(gold=problem.answer, wrong=int(problem.answer) + 1))
    assert v.passed is passed and v.score == float(passed)
    assert reason in v.reason


def test_partial_credit_is_the_generators_unless_switched_off() -> None:
    # basic_arithmetic keeps reasoning-gym's base scorer: an answer that contains the gold scores
    # len(gold) / len(answer), so "980" for gold "98" gets 2/3; partial_credit=False keeps only 1.0
    entry = {"question": "Calculate 90 + 8.", "answer": "98", "metadata": {}}
    p = Problem(entry["question"], "98", {"dataset": "basic_arithmetic", "entry": entry})
    lenient = ReasoningGymTask("basic_arithmetic", SUMS)
    strict = ReasoningGymTask("basic_arithmetic", SUMS, partial_credit=False)
    v = lenient.verify(p, "980")
    assert v.score == pytest.approx(2 / 3) and not v.passed and v.details["raw_score"] == pytest.approx(2 / 3)
    assert strict.verify(p, "980").score == 0.0
    assert strict.verify(p, "98").score == 1.0


def test_answer_tag_extraction(problem: Problem) -> None:
    t = ReasoningGymTask("basic_arithmetic", SUMS, extract="answer_tag")
    assert t.demonstrate(problem, random.Random(0)) == f"<answer>{problem.answer}</answer>"
    assert t.verify(problem, f"thinking... <answer> {problem.answer} </answer>").passed
    v = t.verify(problem, problem.answer)  # bare answer without the tag
    assert not v.passed and "no <answer>" in v.reason


@pytest.mark.parametrize("raw, expected", [(1.7, 1.0), (-0.5, 0.0), (0.25, 0.25), (float("nan"), 0.0),
                                           ("0.9", 0.0), (None, 0.0)], ids=str)
def test_score_is_clamped(task: ReasoningGymTask, problem: Problem, monkeypatch: pytest.MonkeyPatch,
                          raw: object, expected: float) -> None:
    monkeypatch.setattr(task._train, "score_answer", lambda answer, entry: raw)
    v = task.verify(problem, "5")
    assert v.score == expected and v.passed is (expected == 1.0)


def test_scorer_that_raises_gives_a_zero_verdict(task: ReasoningGymTask, problem: Problem,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(answer: str, entry: dict) -> float:
        raise KeyError("metadata")

    monkeypatch.setattr(task._train, "score_answer", boom)
    v = task.verify(problem, "5")
    assert v.score == 0.0 and "KeyError" in v.reason


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a, b, c = (ReasoningGymTask("basic_arithmetic", SUMS, seed=s) for s in (0, 0, 1))
    draw = lambda t: [t.sample(random.Random(7)).prompt for _ in range(1)] + [p.prompt for p in t.heldout(20)]
    assert draw(a) == draw(b)
    assert draw(a) != draw(c)


def test_heldout_is_stable_and_disjoint_from_training(task: ReasoningGymTask) -> None:
    held = task.heldout(50)
    assert task.heldout(50) == held and task.heldout(10) == held[:10]
    held_q = {p.prompt for p in held}
    assert len(held_q) == 50  # distinct questions
    rng = random.Random(0)
    train_q = {task.sample(rng).prompt for _ in range(3000)}
    assert not train_q & held_q
    assert all(not is_heldout(q, 0.1) for q in train_q)


def test_too_few_heldout_questions_is_a_clear_error() -> None:
    tiny = {**SUMS, "max_digits": 1, "operators": ["+"]}  # about 121 questions, ~12 held out
    with pytest.raises(ValueError, match="distinct held-out questions.*heldout_size"):
        ReasoningGymTask("basic_arithmetic", tiny, size=2000).heldout(100)


@pytest.mark.parametrize("kwargs, match", [
    ({"dataset": "basic_arithmatic"}, r"dataset 'basic_arithmatic'; did you mean \['basic_arithmetic'"),
    ({"dataset": "zzzz"}, r"unknown reasoning-gym dataset 'zzzz'; \d+ available, e\.g\. \['ab', "),
    ({"dataset": "basic_arithmetic", "config": {"digits": 2}}, r"unknown key\(s\) \['digits'\]; allowed: .*max_digits"),
    ({"dataset": "basic_arithmetic", "config": {"seed": 3}}, r"task\.options\.seed"),
    ({"dataset": "basic_arithmetic", "config": {"min_terms": 5, "max_terms": 2}}, r"invalid: max_terms"),
    ({"dataset": "basic_arithmetic", "prompt_template": "Q:"}, r"\{question\}"),
    ({"dataset": "basic_arithmetic", "extract": "xml"}, r"extract must be one of"),
], ids=["typo", "unknown", "bad-key", "seed-in-config", "invalid-config", "template", "extract"])
def test_errors_name_the_problem(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReasoningGymTask(**kwargs)


def test_registry_builds_it_and_wraps_errors() -> None:
    t = make_task(TaskConfig(name="reasoning_gym", options={"dataset": "basic_arithmetic", "config": SUMS}))
    assert isinstance(t, ReasoningGymTask) and t.dataset == "basic_arithmetic"
    with pytest.raises(ConfigError, match="unknown reasoning-gym dataset"):
        make_task(TaskConfig(name="reasoning_gym", options={"dataset": "nope"}))
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['digits'\]"):
        make_task(TaskConfig(name="reasoning_gym", options={"dataset": "basic_arithmetic", "digits": 2}))


def test_verdict_score_is_finite(task: ReasoningGymTask, problem: Problem) -> None:
    for text in ["1e999", "nan", "-" * 300, "\x00"]:
        assert math.isfinite(task.verify(problem, text).score)
