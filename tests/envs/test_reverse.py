"""Word reversal's symbol sets: letters by default, digits on request, and a clear error for anything else."""

from __future__ import annotations

import random

import pytest

from feedbackrl.envs.procedural.reverse import ReverseTask


def test_digit_words_use_the_first_digits_and_reverse_the_same_way():
    task = ReverseTask(alphabet_size=4, symbols="digits", demo_noise=1.0, sloppy_from=5)
    rng = random.Random(0)
    words = [task.sample(rng).meta["word"] for _ in range(200)] + [p.meta["word"] for p in task.heldout(20)]
    assert set("".join(words)) == set("0123")
    p = task.heldout(1)[0]
    assert p.prompt == p.meta["word"] + "=" and p.answer == p.meta["word"][::-1]
    assert task.verify(p, p.answer).passed and not task.verify(p, p.answer + "0").passed
    for q in (task.sample(rng) for _ in range(50)):  # the sloppy annotator copies long words (demo_noise 1)
        assert task.demonstrate(q, rng) == (q.meta["word"] if len(q.meta["word"]) >= 5 else q.answer)


def test_letters_stay_the_default():
    words = {ReverseTask().sample(random.Random(s)).meta["word"] for s in range(50)}
    assert set("".join(words)) <= set("abcdefghij")


@pytest.mark.parametrize(("options", "message"), [
    ({"symbols": "emoji"}, r"reverse.symbols must be one of \['digits', 'letters'\], got 'emoji'"),
    ({"symbols": "digits", "alphabet_size": 11}, r"alphabet_size must be in \[2, 10\] with symbols = 'digits', got 11"),
    ({"alphabet_size": 27}, r"alphabet_size must be in \[2, 26\] with symbols = 'letters', got 27"),
])
def test_bad_options_are_errors_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        ReverseTask(**options)
