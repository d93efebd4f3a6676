"""Log-prob judges: decisions hand-computed from given log-probs, the local model's choice log-probs against a
float64 copy of it, the gold-checked addition pairs, and `feedbackrl judge quality --scoring logprob`."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

import pytest
import torch
from fp32 import decoder_logprob_tolerance, float64_copy

from feedbackrl.envs.procedural.addition import wrong_sum
from feedbackrl.feedback.judge_server import tag
from feedbackrl.rewards.judge import LogprobPairwiseJudge, LogprobPointwiseJudge
from feedbackrl.rewards.judge_quality import gold_pairs, judge_quality
from feedbackrl.rewards.verdict import Problem

PROBLEM = Problem("37+85=", "122", {"a": 37, "b": 85})


@dataclass
class TableScorer:
    """Log-probs of the two choices looked up by what the judge is shown: (response_a, response_b) for a
    comparison, the response for a pointwise question."""

    table: dict
    name: str = "table"
    asked: list = field(default_factory=list)

    def choice_logprobs(self, messages, choices):
        user = messages[-1]["content"]
        key = tag(user, "response") or (tag(user, "response_a"), tag(user, "response_b"))
        self.asked.append((key, tuple(choices)))
        return list(self.table[key])


def test_pairwise_logprob_judge_averages_both_orders_by_hand():
    # (log P(A), log P(B)) per order shown. Pair 1: right first, margin 1.7; wrong first, margin 0.7 (the judge
    # leans to "A" either way) -> first's score (1.7 - 0.7) / 2 = 0.5 > 0: right wins, the orders disagree.
    # Pair 2: margins -0.4 and 0.9, both for "112" -> (-0.4 - 0.9) / 2 = -0.65: wrong wins, consistently.
    # Pair 3: margins 0.3 and 0.3 -> exactly 0: a tie (half a point), the orders disagree.
    scorer = TableScorer({("122", "12"): (-0.2, -1.9), ("12", "122"): (-0.5, -1.2),
                          ("122", "112"): (-1.0, -0.6), ("112", "122"): (-0.3, -1.2),
                          ("122", "132"): (-0.5, -0.8), ("132", "122"): (-0.5, -0.8)})
    judge = LogprobPairwiseJudge(scorer, "the sum is right")
    r1, r2, r3 = (judge.compare(PROBLEM, "122", w) for w in ("12", "112", "132"))
    assert (r1.p_first, r1.consistent) == (1.0, False)
    assert (r2.p_first, r2.consistent) == (0.0, True)
    assert (r3.p_first, r3.consistent) == (0.5, False)
    assert scorer.asked[:2] == [(("122", "12"), ("A", "B")), (("12", "122"), ("A", "B"))]
    pairs = [(PROBLEM, "122", "12"), (PROBLEM, "112", "122"), (PROBLEM, "122", "132")]
    pointwise = LogprobPointwiseJudge(TableScorer({"122": (-1.0, -1.0 - math.log(3)), "12": (-2.0, -2.0),
                                                   "112": (-3.0, -1.0), "132": (-0.5, -4.0)}), "the sum is right")
    report = judge_quality(judge, pointwise, pairs, lambda p, c: float(c == p.answer), concurrency=1)
    # pair 2 given wrong-first: the judge now prefers its first response (0.65 > 0), still the wrong one, so
    # agreement (1 + 0 + 0.5) / 3. Pointwise, P(Yes) / (P(Yes) + P(No)): "122" 0.75 beats "12" 0.5 and "112" 0.12,
    # loses to "132" 0.97: 2 / 3
    assert report == {"pairs": 3, "agreement": 0.5,
                      "position_bias_rate": pytest.approx(2 / 3, abs=1e-15), "self_consistency": 1.0,
                      "pointwise_agreement": pytest.approx(2 / 3, abs=1e-15)}


def test_log_prob_judges_show_the_reference_only_when_asked():
    scorer = TableScorer({"12": (-1.0, -2.0), ("12", "122"): (-1.0, -2.0), ("122", "12"): (-1.0, -2.0)})
    for reference in (False, True):
        LogprobPointwiseJudge(scorer, "the sum is right", reference=reference)(PROBLEM, "12")
        LogprobPairwiseJudge(scorer, "the sum is right", reference=reference).compare(PROBLEM, "12", "122")
    msgs = [LogprobPointwiseJudge(scorer, "c", reference=r).messages(PROBLEM, "12")[-1]["content"] for r in (0, 1)]
    assert "<reference>" not in msgs[0] and "<reference>\n122\n</reference>" in msgs[1]


def test_pointwise_logprob_judge_scores_p_yes_over_p_yes_plus_p_no():
    scorer = TableScorer({"122": (-1.0, -1.0 - math.log(3)), "12": (-2.0, -2.0), "112": (-3.0, -1.0)})
    judge = LogprobPointwiseJudge(scorer, "the sum is right")
    right, even, wrong = (judge(PROBLEM, c) for c in ("122", "12", "112"))
    assert right.score == pytest.approx(0.75, abs=1e-15) and right.passed  # P(Yes) : P(No) = 3 : 1
    assert even.score == 0.5 and even.passed  # passes at >= pass_score
    assert wrong.score == pytest.approx(1 / (1 + math.e**2), abs=1e-15) and not wrong.passed
    assert right.details == {"judge": "table", "logprob_yes": -1.0, "logprob_no": -1.0 - math.log(3)}
    assert scorer.asked[0] == ("122", ("Yes", "No"))
    assert [v.score for v in judge.verify_batch([PROBLEM] * 2, ["12", "12"])] == [0.5, 0.5]


def test_local_choice_logprobs_match_a_float64_copy_token_by_token(tiny_model_dir):
    from feedbackrl.rewards.judge_backends import HFChoiceLogprobs

    scorer = HFChoiceLogprobs(str(tiny_model_dir))
    msgs = [{"role": "system", "content": "Answer A or B."}, {"role": "user", "content": "ab= or ba="}]
    prompt = scorer.prompt_ids(msgs)
    tok = scorer._tok
    model64 = float64_copy(scorer._model)
    for choices in (("A", "B"), ("Yes", "No")):  # one token each (one forward), several (one per choice)
        got = scorer.choice_logprobs(msgs, choices)
        assert got == scorer.choice_logprobs(msgs, choices)  # deterministic
        for choice, value in zip(choices, got, strict=True):
            ids = tok(choice, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(choice)  # the tiny tokenizer spells letters: "Yes" is three tokens
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                lp = torch.log_softmax(model64(full).logits[0], dim=-1)
            truth = sum(lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids))
            tol = len(ids) * decoder_logprob_tolerance(model64, full, torch.ones_like(full))
            assert abs(value - truth) <= tol, (choice, value, truth, tol)
    with pytest.raises(ValueError, match="at least one token"):
        scorer.choice_logprobs(msgs, ("A", ""))


def test_addition_pairs_hold_the_true_sum_and_a_plausible_wrong_one():
    from feedbackrl.envs.procedural.addition import AdditionTask

    task = AdditionTask(digits=2)
    pairs = gold_pairs(task.heldout(60), wrong_sum)
    firsts = 0
    for p, a, b in pairs:
        gold = [task.verify(p, x).score for x in (a, b)]
        assert sorted(gold) == [0.0, 1.0], (p, a, b)
        wrong, total = int(b if gold[0] else a), p.meta["a"] + p.meta["b"]
        assert wrong >= 0 and (wrong - total in (-10, -1, 1, 10) or str(wrong) == no_carry(p)), (p, wrong)
        firsts += gold[0] == 1.0
    assert 15 < firsts < 45  # the right answer is shown first about half the time
    # 37 + 85 = 122; without carries 3+8 -> 1, 7+5 -> 2: "12"
    assert {wrong_sum(PROBLEM, random.Random(s)) for s in range(40)} == {"12", "112", "121", "123", "132"}


def no_carry(p: Problem) -> str:
    from feedbackrl.envs.procedural.addition import no_carry_sum

    return str(no_carry_sum(p.meta["a"], p.meta["b"]))


def test_judge_quality_cli_with_logprob_scoring(tiny_model_dir):
    from typer.testing import CliRunner

    from feedbackrl.cli import app

    out = CliRunner().invoke(app, ["judge", "quality", "--local-model", str(tiny_model_dir), "--scoring", "logprob",
                                   "--task", "addition", "--pairs", "6"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert (report["local_model"], report["scoring"], report["task"], report["pairs"]) == (
        str(tiny_model_dir), "logprob", "addition", 6)
    assert report["self_consistency"] == 1.0  # a forward pass gives the same numbers twice
    assert report["agreement"] * 12 == round(report["agreement"] * 12)  # wins, losses and exact ties only
    assert report["reference"] is False
    ref = CliRunner().invoke(app, ["judge", "quality", "--local-model", str(tiny_model_dir), "--scoring", "logprob",
                                   "--task", "addition", "--pairs", "2", "--reference"])
    assert ref.exit_code == 0 and json.loads(ref.output)["reference"] is True, ref.output
    bad = CliRunner().invoke(app, ["judge", "quality", "--base-url", "scripted", "--scoring", "logprob"])
    assert bad.exit_code != 0 and "logprob needs --local-model" in bad.output
    bad = CliRunner().invoke(app, ["judge", "quality", "--base-url", "scripted", "--task", "sorting"])
    assert bad.exit_code != 0 and "--task must be one of" in bad.output
