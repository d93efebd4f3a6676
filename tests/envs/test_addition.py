import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sft_step import first_sft_loss

from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.envs.procedural.addition import AdditionTask, no_carry_sum
from feedbackrl.rewards.verdict import Problem

# 37 + 85 = 122
GOLD = Problem("37+85=", "122", {"a": 37, "b": 85})


@pytest.mark.parametrize("completion", [
    pytest.param("122", id="gold"),
    pytest.param(" 122", id="leading-space"),
    pytest.param("122 \n", id="trailing-whitespace"),
])
def test_accepts(completion):
    v = AdditionTask().verify(GOLD, completion)
    assert (v.score, v.passed) == (1.0, True)


@pytest.mark.parametrize("completion, reason", [
    pytest.param("121", "wrong sum", id="off-by-one"),
    pytest.param("12", "wrong sum", id="no-carry-into-hundreds"),
    pytest.param("0122", "wrong sum", id="leading-zero"),
    pytest.param("221", "wrong sum", id="reversed-digits"),
    pytest.param("-122", "wrong sum", id="negative"),
    pytest.param("1 22", "not a bare integer", id="inner-space"),
    pytest.param("122.0", "not a bare integer", id="decimal"),
    pytest.param("+122", "not a bare integer", id="plus-sign"),
    pytest.param("122=122", "not a bare integer", id="restated"),
    pytest.param("37+85=122", "not a bare integer", id="whole-equation"),
    pytest.param("one hundred twenty-two", "not a bare integer", id="words"),
    pytest.param("122\n122", "not a bare integer", id="twice"),
    pytest.param("\uff11\uff12\uff12", "wrong sum", id="fullwidth-digits"),
    pytest.param("", "empty completion", id="empty"),
    pytest.param(" \n\t", "empty completion", id="whitespace-only"),
])
def test_rejects_with_a_reason(completion, reason):
    v = AdditionTask().verify(GOLD, completion)
    assert (v.score, v.passed) == (0.0, False)
    assert reason in v.reason
    assert v.details["expected"] == "122"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_verify_never_raises_and_passes_only_the_gold(text):
    v = AdditionTask().verify(GOLD, text)
    assert v.passed == (text.strip() == "122") and v.score == float(v.passed)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 9), st.booleans())
def test_gold_answer_always_passes(seed, digits, reverse):
    task = AdditionTask(digits=digits, reverse=reverse)
    problem = task.sample(random.Random(seed))
    assert task.verify(problem, problem.answer).passed
    assert int(problem.answer[::-1] if reverse else problem.answer) == problem.meta["a"] + problem.meta["b"]


def test_prompt_and_answer_format():
    rng = random.Random(0)
    for _ in range(200):
        p = AdditionTask(digits=2).sample(rng)
        a, b = p.meta["a"], p.meta["b"]
        assert p.prompt == f"{a}+{b}=" and p.answer == str(a + b)


def test_reverse_writes_the_sum_least_significant_digit_first():
    # 37+85 = 122 -> "221";  50+50 = 100 -> "001" (the reversed form keeps its zeros)
    task = AdditionTask(reverse=True)
    problems = {(p.meta["a"], p.meta["b"]): p for p in (task.sample(random.Random(s)) for s in range(3000))}
    assert problems[(37, 85)].answer == "221" and problems[(37, 85)].prompt == "37+85="
    hundred = problems[(50, 50)]
    assert hundred.answer == "001"
    assert task.verify(hundred, "001").passed
    assert not task.verify(hundred, "1").passed and not task.verify(hundred, "100").passed


def test_pad_operands_gives_fixed_width_prompts():
    rng = random.Random(0)
    task = AdditionTask(digits=3, pad_operands=True)
    prompts = [task.sample(rng).prompt for _ in range(300)] + [p.prompt for p in task.heldout(50)]
    assert all(re.fullmatch(r"\d{3}\+\d{3}=", p) for p in prompts)
    assert any(p.startswith("00") for p in prompts)  # some operands below 10 were padded
    # the answer is not padded: 5 + 7 = "12"
    p = next(p for p in (task.sample(random.Random(s)) for s in range(20000)) if p.meta["a"] < 10)
    assert p.prompt.startswith(f"00{p.meta['a']}+") and p.answer == str(p.meta["a"] + p.meta["b"])


def test_heldout_is_never_sampled_for_training():
    task = AdditionTask(digits=2)
    rng = random.Random(0)
    train = {task.sample(rng).prompt for _ in range(20_000)}
    held = {p.prompt for p in task.heldout(400)}
    assert len(held) == 400 and not train & held
    assert len(train) > 7500  # most of the ~9,000 training problems were drawn at least once


def test_train_and_heldout_partition_one_digit_problems():
    # 1-digit addition has 100 problems; ~10% are held out. 3000 draws see every training problem.
    task = AdditionTask(digits=1)
    rng = random.Random(0)
    train = {task.sample(rng).prompt for _ in range(3000)}
    held = [p.prompt for p in task.heldout(100 - len(train))]
    assert 0 < len(held) < 30
    assert not train & set(held) and len(train | set(held)) == 100
    with pytest.raises(ValueError, match=f"only {len(held)} held-out problems"):
        task.heldout(len(held) + 1)


def test_heldout_is_the_same_list_every_call_and_prefix_stable():
    task = AdditionTask(digits=3)
    assert task.heldout(30) == task.heldout(30)
    assert task.heldout(10) == task.heldout(30)[:10]
    assert len({p.prompt for p in task.heldout(300)}) == 300


def test_sampling_is_determined_by_the_rng():
    task = AdditionTask()
    a = [task.sample(random.Random(5)) for _ in range(3)]
    b = [task.sample(random.Random(5)) for _ in range(3)]
    assert a == b


def test_no_carry_sum_hand_computed():
    # 37+85: 7+5=12 -> 2, 3+8=11 -> 1 -> "12".   999+1: 9+1 -> 0, then 9, 9 -> 990.
    # 123+456 has no carries -> 579.   0+0 -> 0.   5+5 -> 0.
    assert [no_carry_sum(37, 85), no_carry_sum(999, 1), no_carry_sum(123, 456), no_carry_sum(0, 0),
            no_carry_sum(5, 5)] == [12, 990, 579, 0, 0]


@pytest.mark.parametrize("reverse", [False, True])
def test_clean_demonstrations_are_always_correct(reverse):
    task = AdditionTask(digits=3, demo_noise=0.0, reverse=reverse)
    rng = random.Random(0)
    for _ in range(500):
        p = task.sample(rng)
        assert task.verify(p, task.demonstrate(p, rng)).passed


@pytest.mark.parametrize("reverse", [False, True])
def test_fully_noisy_demonstrations_forget_every_carry(reverse):
    task = AdditionTask(digits=3, demo_noise=1.0, reverse=reverse)
    rng = random.Random(0)
    wrong = 0
    for _ in range(500):
        p = task.sample(rng)
        demo = task.demonstrate(p, rng)
        want = str(no_carry_sum(p.meta["a"], p.meta["b"]))
        assert demo == (want[::-1] if reverse else want)
        wrong += not task.verify(p, demo).passed
    assert wrong > 300  # most 3-digit sums carry somewhere


def test_half_noisy_demonstrations_mix_both():
    task = AdditionTask(digits=2, demo_noise=0.5)
    rng = random.Random(0)
    carry = [p for p in (task.sample(rng) for _ in range(4000)) if no_carry_sum(p.meta["a"], p.meta["b"]) !=
             p.meta["a"] + p.meta["b"]]
    wrong = sum(not task.verify(p, task.demonstrate(p, rng)).passed for p in carry) / len(carry)
    assert 0.45 < wrong < 0.55, wrong


@pytest.mark.parametrize("kwargs, match", [
    ({"digits": 0}, "digits must be in \\[1, 9\\], got 0"),
    ({"digits": 10}, "digits must be in \\[1, 9\\], got 10"),
    ({"demo_noise": 1.5}, "demo_noise must be in \\[0, 1\\], got 1.5"),
])
def test_bad_options_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdditionTask(**kwargs)


def test_the_sft_warm_start_trains_on_the_tasks_demonstrations(tokenizer, monkeypatch):
    """SFT (sft.steps > 0) accepts the task and its loss is the policy's on the sums `demonstrate` wrote."""
    got, want, written = first_sft_loss(AdditionTask(digits=2, demo_noise=0.0), tokenizer, monkeypatch)
    assert written == 4 and got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("task", [AdditionTask(digits=2), AdditionTask(digits=4), CalculatorAdditionTask()],
                         ids=["addition-2", "addition-4", "calculator"])
def test_heldout_split_does_not_select_on_the_answer(task):
    """Held-out and training sums end in every digit: a split that depends on the operands' last digits
    only (as a linear hash mod 10 does) would hold out one final digit, which a policy can learn to avoid."""
    held = task.heldout(500)
    rng = random.Random(0)
    train = [task.sample(rng) for _ in range(2000)]
    for name, problems in (("held-out", held), ("training", train)):
        last = Counter((p.meta["a"] + p.meta["b"]) % 10 for p in problems)
        assert sorted(last) == list(range(10)), f"{name} sums end only in {sorted(last)}"
        assert min(last.values()) >= 0.04 * len(problems), f"{name} last digits skewed: {dict(last)}"
    assert not {p.prompt for p in held} & {p.prompt for p in train}
