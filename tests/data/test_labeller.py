"""The simulated labeller: the gold score by hand, Bradley-Terry choice probabilities, noise-free
choices, Plackett-Luce rankings, the accuracy ceiling, and rows the preference loaders accept."""

import math
import random

import pytest
import torch

from feedbackrl.data.labeller import (
    SimulatedLabeller,
    choice_probability,
    gold_cost_for,
    gold_score_for,
    label_ceiling,
    label_rows,
    reverse_gold,
    reverse_harm,
    sample_candidates,
)
from feedbackrl.data.preferences import load_preference_pairs, load_rankings
from feedbackrl.data.rows import write_jsonl
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.rewards.verdict import Problem

WORD = ReverseTask._problem("abcde")  # answer "edcba"


@pytest.mark.parametrize("completion, expected", [
    pytest.param("edcba", 1.0, id="exact"),
    pytest.param(" edcba\n", 1.0, id="surrounding-space"),
    # copy: only the middle letter matches -> 0.8 * (1/5) = 0.16
    pytest.param("abcde", 0.16, id="copied"),
    # one wrong letter: 4/5 -> 0.8 * 0.8 = 0.64
    pytest.param("edcbx", 0.64, id="one-letter-wrong"),
    # one letter too many: 5/5 - 0.1 * 1 = 0.9 -> 0.72
    pytest.param("edcbaa", 0.72, id="one-too-long"),
    # two letters short: 3/5 - 0.1 * 2 = 0.4 -> 0.32
    pytest.param("edc", 0.32, id="two-short"),
    pytest.param("", 0.0, id="empty"),
    pytest.param("zzzzzzzzzzzzzz", 0.0, id="junk-clipped-at-0"),
])
def test_reverse_gold_by_hand(completion, expected):
    assert reverse_gold(WORD, completion) == pytest.approx(expected, abs=1e-12)


def test_gold_of_other_tasks_is_the_verifier_score():
    task = AdditionTask(digits=1)
    problem = Problem("2+3=", "5", {})
    gold = gold_score_for(task)
    assert gold(problem, "5") == 1.0 and gold(problem, "6") == 0.0
    assert gold_score_for(ReverseTask()) is reverse_gold


def test_verifier_gold_is_pass_fail_even_where_the_task_grades():
    reverse = ReverseTask()
    problem = Problem("reverse: abcd", "dcba", {"word": "abcd"})
    graded, binary = gold_score_for(reverse), gold_score_for(reverse, "verifier")
    assert graded(problem, "dcbb") == pytest.approx(0.6)  # 3 of 4 letters: partial credit
    assert binary(problem, "dcbb") == 0.0 and binary(problem, "dcba") == 1.0
    with pytest.raises(ValueError, match="'task' or 'verifier'"):
        gold_score_for(reverse, "graded")


def test_choice_probability_by_hand():
    # (0.8 - 0.2) / 0.1 = 6 -> sigmoid(6) = 1 / (1 + e^-6) = 0.9975274
    assert choice_probability(0.8, 0.2, 0.1) == pytest.approx(0.9975274, abs=1e-7)
    # (0.3 - 0.4) / 0.1 = -1 -> sigmoid(-1) = 0.2689414
    assert choice_probability(0.3, 0.4, 0.1) == pytest.approx(0.2689414, abs=1e-7)
    assert choice_probability(0.5, 0.5, 0.1) == 0.5
    assert (choice_probability(0.2, 0.1, 0.0), choice_probability(0.1, 0.2, 0.0)) == (1.0, 0.0)
    assert choice_probability(0.1, 0.1, 0.0) == 0.5


def test_noise_free_labeller_always_picks_the_gold_better():
    labeller = SimulatedLabeller(reverse_gold, temperature=0.0, seed=0)
    for a, b in [("edcba", "abcde"), ("edcbx", "edc"), ("edcbaa", "edcbx"), ("abcde", "")]:
        better, worse = (a, b) if reverse_gold(WORD, a) > reverse_gold(WORD, b) else (b, a)
        for _ in range(50):
            assert labeller.choose(WORD, a, b) == (better, worse)
            assert labeller.choose(WORD, b, a) == (better, worse)


def test_noise_free_ties_are_coin_flips():
    labeller = SimulatedLabeller(reverse_gold, temperature=0.0, seed=0)
    firsts = [labeller.choose(WORD, "edcbx", "xdcba")[0] for _ in range(400)]  # both 0.64
    assert 150 < firsts.count("edcbx") < 250, firsts.count("edcbx")


def test_judge_says_tie_within_the_margin_and_otherwise_picks_a_side():
    # gold: edcbx 0.64, xdcba 0.64, edcbaa 0.72, edcba 1.0
    never = SimulatedLabeller(reverse_gold, temperature=0.0, seed=0)
    assert {never.judge(WORD, "edcbx", "xdcba") for _ in range(50)} == {"a", "b"}  # no margin: coin flips
    exact = SimulatedLabeller(reverse_gold, temperature=0.0, seed=0, tie_margin=0.0)
    assert exact.judge(WORD, "edcbx", "xdcba") == "tie"
    assert (exact.judge(WORD, "edcbx", "edcbaa"), exact.judge(WORD, "edcba", "edcbx")) == ("b", "a")
    wide = SimulatedLabeller(reverse_gold, temperature=0.0, seed=0, tie_margin=0.1)
    assert wide.judge(WORD, "edcbx", "edcbaa") == "tie" and wide.judge(WORD, "edcba", "edcbaa") == "a"
    with pytest.raises(ValueError, match="tie_margin must be >= 0"):
        SimulatedLabeller(reverse_gold, tie_margin=-0.1)


def test_noisy_choice_frequency_matches_bradley_terry():
    # gold 0.64 vs 0.72 at T = 0.1: P(edcbaa chosen) = sigmoid(0.8) = 0.6899745.
    # 4000 draws: std sqrt(p(1-p)/n) = 0.0073, so +-0.03 is over 4 sigma.
    labeller = SimulatedLabeller(reverse_gold, temperature=0.1, seed=1)
    n = 4000
    wins = sum(labeller.choose(WORD, "edcbx", "edcbaa")[0] == "edcbaa" for _ in range(n))
    assert abs(wins / n - 0.6899745) < 0.03, wins / n


def test_rankings_are_plackett_luce_draws():
    # Noise-free: sorted by gold. Two responses: the first place follows Bradley-Terry.
    exact = SimulatedLabeller(reverse_gold, temperature=0.0)
    assert exact.rank(WORD, ["abcde", "edcba", "edc", "edcbx"]) == ["edcba", "edcbx", "edc", "abcde"]
    noisy = SimulatedLabeller(reverse_gold, temperature=0.1, seed=2)
    n = 4000
    wins = sum(noisy.rank(WORD, ["edcbx", "edcbaa"])[0] == "edcbaa" for _ in range(n))
    assert abs(wins / n - 0.6899745) < 0.03, wins / n


def test_labeller_is_deterministic_given_its_seed():
    a, b = SimulatedLabeller(reverse_gold, 0.2, seed=5), SimulatedLabeller(reverse_gold, 0.2, seed=5)
    pairs = [("edcbx", "edcbaa"), ("edc", "abcde")] * 20
    assert [a.choose(WORD, x, y) for x, y in pairs] == [b.choose(WORD, x, y) for x, y in pairs]


def test_label_ceiling_by_hand():
    # p_chosen 0.9 -> 0.9; p_chosen 0.2 (label against gold) -> 0.8; tie 0.5 -> 0.5: expected (0.9+0.8+0.5)/3.
    # realised: agrees, disagrees, tie -> (1 + 0 + 0.5) / 3 = 0.5.
    rows = [{"gold_chosen": 0.6, "gold_rejected": 0.3, "p_chosen": 0.9},
            {"gold_chosen": 0.1, "gold_rejected": 0.4, "p_chosen": 0.2},
            {"gold_chosen": 0.5, "gold_rejected": 0.5, "p_chosen": 0.5}]
    got = label_ceiling(rows)
    assert got["expected"] == pytest.approx(2.2 / 3) and got["realised"] == pytest.approx(0.5) and got["pairs"] == 3
    assert label_ceiling([]) == {}


def test_rows_load_with_the_preference_loaders(tmp_path):
    task = ReverseTask()
    problems = [task.sample(random.Random(i)) for i in range(3)]
    cands = [[p.answer, p.meta["word"], p.answer[:-1]] for p in problems]
    cands[1] = cands[1][:1]  # one candidate only: skipped
    pairs = label_rows(SimulatedLabeller(reverse_gold, temperature=0.05, seed=0), problems, cands, k=2)
    loaded, dropped = load_preference_pairs(write_jsonl(pairs, tmp_path / "pairs.jsonl"))
    assert not dropped and [x.prompt for x in loaded] == [problems[0].prompt, problems[2].prompt]
    for problem, item in zip([problems[0], problems[2]], loaded, strict=True):
        assert {item.chosen, item.rejected} == {problem.answer, problem.meta["word"]}
        assert item.meta["gold_chosen"] == reverse_gold(problem, item.chosen)
        assert math.isclose(item.meta["p_chosen"], choice_probability(item.meta["gold_chosen"],
                                                                       item.meta["gold_rejected"], 0.05))
    ranks = label_rows(SimulatedLabeller(reverse_gold, temperature=0.0), problems, cands, k=3)
    loaded, _ = load_rankings(write_jsonl(ranks, tmp_path / "ranks.jsonl"))
    assert [r.responses[0] for r in loaded] == [problems[0].answer, problems[2].answer]  # T = 0: gold order
    assert all(r.meta["gold"] == sorted(r.meta["gold"], reverse=True) for r in loaded)


@pytest.mark.parametrize("completion, expected", [
    pytest.param("edcba", 1.0, id="one-a"),
    pytest.param(" aab\n", 2.0, id="two-a-surrounding-space"),
    pytest.param("bcd", 0.0, id="safe"),
    pytest.param("A", 0.0, id="upper-case-is-another-letter"),
    pytest.param("", 0.0, id="empty"),
])
def test_reverse_harm_counts_the_letter_a(completion, expected):
    assert reverse_harm(WORD, completion) == expected


def test_gold_cost_exists_for_reverse_only():
    assert gold_cost_for(ReverseTask()) is reverse_harm
    with pytest.raises(ValueError, match="no cost rule for task 'addition'.*prefs.path"):
        gold_cost_for(AdditionTask(digits=1))


def test_safety_labeller_rows_put_the_costlier_first_with_safe_unsafe_labels(tmp_path):
    # "edcba" (1 a), "aedcba" (2 a), "edcb" (0 a): noise-free, the costlier one is `chosen`
    problems = [WORD, WORD, WORD]
    cands = [["edcb", "edcba"], ["aedcba", "edcba"], ["edcb", "bcde"]]
    labeller = SimulatedLabeller(reverse_harm, temperature=0.0, seed=0, kind="cost")
    rows = label_rows(labeller, problems, cands, k=2)
    assert [(r["chosen"], r["rejected"]) for r in rows[:2]] == [("edcba", "edcb"), ("aedcba", "edcba")]
    assert [(r["chosen_unsafe"], r["rejected_unsafe"]) for r in rows] == [(True, False), (True, True),
                                                                          (False, False)]
    assert rows[2]["p_chosen"] == 0.5  # equal cost: a coin flip, as for rewards
    loaded, dropped = load_preference_pairs(write_jsonl(rows, tmp_path / "cost.jsonl"))
    assert not dropped and loaded[0].meta["chosen_unsafe"] is True
    with pytest.raises(ValueError, match="kind"):
        SimulatedLabeller(reverse_harm, kind="harm")


def test_sample_candidates_are_distinct_and_non_empty(peaked_lm, tokenizer):
    problems = [ReverseTask().sample(random.Random(i)) for i in range(6)]
    cands = sample_candidates(peaked_lm, tokenizer, problems, k=3, max_new_tokens=6, temperature=1.0,
                              generator=torch.Generator().manual_seed(0))
    assert len(cands) == 6
    for c in cands:
        assert 1 <= len(c) <= 3 and len(set(c)) == len(c) and all(t.strip() for t in c)
