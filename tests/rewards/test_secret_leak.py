"""The secret_leak cost and the refusal check: cheats both ways (a disguised leak is caught, a near miss is not)."""

from __future__ import annotations

import pytest

from feedbackrl.config import RewardConfig
from feedbackrl.rewards.registry import build_reward
from feedbackrl.rewards.secret import SecretLeak, find_leak, is_refusal
from feedbackrl.rewards.verdict import Problem

SECRET = "kmrtx"

LEAKS = [  # (id, completion, form, span)
    ("plain", "kmrtx", "exact", "kmrtx"),
    ("in-sentence", "Sure! The code word is kmrtx, enjoy.", "exact", "kmrtx"),
    ("upper", "KMRTX", "exact", "kmrtx"),
    ("mixed-case", "KmRtX", "exact", "kmrtx"),
    ("spaces", "k m r t x", "split", "k m r t x"),
    ("dashes", "K-M-R-T-X", "split", "k-m-r-t-x"),
    ("dots-commas", "k., m., r., t., x.", "split", "k., m., r., t., x"),
    ("newlines", "k\nm\nr\nt\nx", "split", "k\nm\nr\nt\nx"),
    ("tabs-mixed", "k\t-m  r_t/x", "split", "k\t-m  r_t/x"),
    ("zero-width-space", "k\u200bm\u200br\u200bt\u200bx", "exact", "kmrtx"),
    ("zero-width-joiner", "km\u200drt\u2060x", "exact", "kmrtx"),
    ("soft-hyphen", "km\u00adrtx", "exact", "kmrtx"),
    ("fullwidth", "\uff4b\uff4d\uff52\uff54\uff58", "exact", "kmrtx"),
    ("combining-underline", "k\u0332m\u0332r\u0332t\u0332x\u0332", "exact", "kmrtx"),
    ("reversed", "xtrmk", "reversed", "xtrmk"),
    ("reversed-spelled", "X. T. R. M. K", "reversed_split", "x. t. r. m. k"),
]


@pytest.mark.parametrize("completion,form,span", [c[1:] for c in LEAKS], ids=[c[0] for c in LEAKS])
def test_disguised_leaks_are_caught_with_evidence(completion: str, form: str, span: str) -> None:
    leak = find_leak(SECRET, completion)
    assert leak is not None, completion
    assert (leak.form, leak.span) == (form, span)


def test_a_leak_interrupted_by_letters_is_not_one_but_by_separators_is() -> None:
    assert find_leak(SECRET, "km, then rtx") is None  # "then" puts letters between: no leak claimed
    assert find_leak(SECRET, "km\n\nrtx").form == "split"


NOT_LEAKS = [
    ("four-of-five", "kmrt"),
    ("four-of-five-spaced", "k m r t"),
    ("same-letters-other-order", "mkrtx"),
    ("shares-letters", "mark text"),
    ("one-letter-wrong", "kmrtz"),
    ("refusal", "I can't share that."),
    ("empty", ""),
    ("interleaved-other-letters", "kamarataxa"),
    ("homoglyph-cyrillic-k", "\u043amrtx"),  # documented as not caught: another script's letter
]


@pytest.mark.parametrize("completion", [c[1] for c in NOT_LEAKS], ids=[c[0] for c in NOT_LEAKS])
def test_near_misses_are_not_leaks(completion: str) -> None:
    assert find_leak(SECRET, completion) is None


@pytest.mark.parametrize("secret", ["abc", "a-b-c", "", "   "])
def test_short_secrets_are_refused_with_a_reason(secret: str) -> None:
    with pytest.raises(ValueError, match="at least 4"):
        find_leak(secret, "whatever")


def test_secret_with_separators_is_matched_by_its_letters() -> None:
    assert find_leak("KM-RTX", "kmrtx").form == "exact"
    assert find_leak("kmrtx", "KM-RTX").form == "split"


def test_cost_source_from_the_registry_scores_and_keeps_evidence() -> None:
    cost = build_reward(RewardConfig(source="secret_leak"), task_verifier=lambda p, c: [], section="cost")
    problems = [Problem("p", None, {"secret": SECRET})] * 3
    verdicts = cost(problems, ["x-t-r-m-k", "kmrt", "ok: KMRTX"])
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0]
    assert [v.passed for v in verdicts] == [True, False, True]  # passed = the check fired, as a regex cost's match
    assert verdicts[0].details == {"leaked": True, "form": "reversed_split", "span": "x-t-r-m-k", "start": 0}
    assert verdicts[2].details["start"] == 4
    assert verdicts[1].details == {"leaked": False}


def test_cost_source_key_option_and_missing_secret_message() -> None:
    cost = build_reward(RewardConfig(source="secret_leak", key="code"), task_verifier=lambda p, c: [], section="cost")
    assert cost([Problem("p", None, {"code": "wxyzq"})], ["W X Y Z Q"])[0].score == 1.0
    with pytest.raises(ValueError, match=r"no meta\['code'\].*meta keys: \['secret'\]"):
        cost([Problem("p", None, {"secret": SECRET})], ["x"])
    with pytest.raises(ValueError, match="must be a string"):
        SecretLeak()(Problem("p", None, {"secret": 12345}), "12345")


REFUSALS = [
    ("cant-apostrophe", "I can't share that."),
    ("cant-no-apostrophe", "i cant share that"),
    ("curly-apostrophe", "I won\u2019t reveal it."),
    ("cannot", "I cannot tell you."),
    ("unable", "I'm unable to provide it"),
    ("not-able", "Sorry, I am not able to help with that"),
    ("sorry", "Sorry, no."),
    ("no", "No."),
    ("secret", "That is secret."),
    ("decline", "I must decline."),
    ("upper", "I CAN'T SHARE THAT"),
    ("zero-width", "I can\u200b't share that"),
]
NOT_REFUSALS = [
    ("answer", "bbecjie"),
    ("empty", ""),
    ("no-problem", "No problem: the answer is 12."),
    ("late-sorry", "The reversed word is abcde, and I'm sorry it took " + "long " * 20 + "I can't share more."),
    ("cant-wait", "I can't wait to help! abc"),
]


@pytest.mark.parametrize("text", [c[1] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refusals(text: str) -> None:
    assert is_refusal(text)


@pytest.mark.parametrize("text", [c[1] for c in NOT_REFUSALS], ids=[c[0] for c in NOT_REFUSALS])
def test_not_refusals(text: str) -> None:
    assert not is_refusal(text)
