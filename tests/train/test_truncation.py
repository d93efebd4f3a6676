"""Completions cut off by max_new_tokens: reported by eval, and optionally scored as failed."""

from __future__ import annotations

import json
import math

import torch

from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.episodes.kinds import evaluate
from feedbackrl.episodes.single_turn import fail_truncated
from feedbackrl.rewards.verdict import Verdict


def test_fail_truncated_fails_only_the_cut_off_rows():
    verdicts = [Verdict(1.0, True, "ok"), Verdict(1.0, True, "ok too"), Verdict(0.0, False, "wrong")]
    out = fail_truncated(verdicts, [False, True, True])
    assert out[0] is verdicts[0]
    assert [(v.score, v.passed) for v in out] == [(1.0, True), (0.0, False), (0.0, False)]
    assert out[1].reason == "cut off by max_new_tokens before an end token"
    assert out[1].details["original"] == "ok too"


class _Always(AdditionTask):
    """Every completion passes: what is left to measure is the truncation handling."""

    def verify(self, problem, completion):
        return Verdict(1.0, True, "always")


def test_eval_reports_the_truncation_rate_and_can_fail_truncated_answers(peaked_lm, tokenizer, capsys):
    task = _Always()
    problems = task.heldout(8)
    # 3 new tokens: the peaked model never reaches EOS that soon, so every answer is cut off
    r = evaluate(peaked_lm, tokenizer, task, problems, 3, k=0, warn_truncated=0.5)
    assert (r.truncated_frac, r.accuracy) == (1.0, 1.0) and math.isnan(r.pass_at_k)
    assert "8/8 greedy eval answers hit max_new_tokens=3" in capsys.readouterr().err.replace("\n", " ")
    r = evaluate(peaked_lm, tokenizer, task, problems, 3, k=0, truncated_fails=True)
    assert (r.truncated_frac, r.accuracy) == (1.0, 0.0)
    assert r.to_dict()["truncated_frac"] == 1.0


class _Rollout:
    """What `generate` returns, as far as the evaluation reads it."""

    def __init__(self, texts, truncated):
        self.texts = texts
        self.truncated = torch.tensor(truncated)
        self.completion_mask = torch.ones(len(texts), 3, dtype=torch.long)


class _SaysOk(AdditionTask):
    def verify(self, problem, completion):
        return Verdict(float(completion == "ok"), completion == "ok", "")


def test_eval_reports_accuracy_among_finished_answers(monkeypatch, tokenizer):
    import feedbackrl.episodes.single_turn as single_turn

    texts, cut = ["ok", "no", "ok", "no", "ok"], [False, False, True, True, False]
    monkeypatch.setattr(single_turn, "generate", lambda *a, **kw: _Rollout(texts, cut))
    task = _SaysOk()
    problems = task.heldout(5)
    # 3 finished answers, 2 of them right; the cut-off "ok" counts overall unless truncated_fails
    r = evaluate(None, tokenizer, task, problems, 3, k=0)
    assert (r.accuracy, r.finished_accuracy, r.truncated_frac) == (3 / 5, 2 / 3, 2 / 5)
    r = evaluate(None, tokenizer, task, problems, 3, k=0, truncated_fails=True)
    assert (r.accuracy, r.finished_accuracy) == (2 / 5, 2 / 3)
    assert r.to_dict()["finished_accuracy"] == 2 / 3
    texts, cut = ["ok", "no", "ok", "no", "ok"], [True] * 5
    r = evaluate(None, tokenizer, task, problems, 3, k=0, warn_truncated=1.0)
    assert r.accuracy == 3 / 5 and math.isnan(r.finished_accuracy)  # nothing finished: no reading
    # ... written as null, so report.json stays valid JSON and a report read back equals the one written
    assert r.to_dict()["finished_accuracy"] is None
    assert json.loads(json.dumps(r.to_dict(), allow_nan=False)) == r.to_dict()


def test_an_episode_metric_without_a_reading_is_null_in_the_report():
    from feedbackrl.envs.multi_turn import EpisodeRecord, episode_stats
    from feedbackrl.episodes.contracts import EvalResult

    # no episode succeeded, so turns per success has no reading (NaN in the stats)
    failed = EpisodeRecord("1+1=", turn_rewards=[0.0, 0.0], end="answered", verdict=Verdict(0.0, False, ""))
    stats = episode_stats([failed])
    assert math.isnan(stats["episode/turns_per_success"])
    d = EvalResult(accuracy=0.0, pass_at_k=0.0, k=0, n=1, mean_len=3.0, metrics=stats).to_dict()
    assert d["episode/turns_per_success"] is None and d["episode/turns_mean"] == 2.0
    assert json.loads(json.dumps(d, allow_nan=False)) == d
