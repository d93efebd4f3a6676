"""Judges against a real OpenAI-compatible HTTP server on loopback (FastAPI + uvicorn), through the
`openai` client: strict parsing, the retry, position swap, the cache, timeouts, accounting, hybrids."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from feedbackrl.feedback.judge_server import RuleJudge, chat_app, tag  # noqa: E402
from feedbackrl.feedback.server import LiveServer  # noqa: E402
from feedbackrl.rewards.judge import (  # noqa: E402
    Criterion,
    Hybrid,
    PairwiseJudge,
    ParseError,
    PointwiseJudge,
    Rubric,
    parse_scores,
    parse_winner,
)
from feedbackrl.rewards.judge_backends import CachedChat, OpenAIChat  # noqa: E402
from feedbackrl.rewards.verdict import Problem, Verdict  # noqa: E402

RUBRIC = Rubric((Criterion("correct", 3, "is it right"), Criterion("style", 1, "is it tidy")), low=1, high=5)
PROBLEM = Problem("abc=", "cba")


def good(correct: int = 5, style: int = 1) -> str:
    return json.dumps({"rationale": "fine", "scores": {"correct": correct, "style": style}})


# --- strict parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, why", [
    ("I'd give it a 4.", "not a JSON object"),
    ('Sure! {"scores": {"correct": 5, "style": 1}}', "not a JSON object"),  # prose around the JSON
    ("[5, 1]", "expected a JSON object"),
    ('{"rationale": "x"}', 'missing "scores"'),
    ('{"scores": {"correct": 5}}', "expected exactly"),
    ('{"scores": {"correct": 5, "style": 1, "extra": 3}}', "expected exactly"),
    ('{"scores": {"correct": 4.5, "style": 1}}', "not an integer"),
    ('{"scores": {"correct": true, "style": 1}}', "not an integer"),
    ('{"scores": {"correct": 6, "style": 1}}', "not an integer in 1..5"),
    ('{"scores": {"correct": "5", "style": 1}}', "not an integer"),
    ('{"scores": {"correct": 5, "style": 1}, "rationale": 7}', "rationale must be a string"),
], ids=["prose", "prose-around-json", "array", "no-scores", "missing", "extra", "float", "bool", "range", "string",
        "bad-rationale"])
def test_parse_scores_rejects(text, why):
    with pytest.raises(ParseError, match=why):
        parse_scores(text, RUBRIC)


def test_parse_scores_accepts_exact_and_fenced_and_normalises():
    assert parse_scores(good(4, 2), RUBRIC) == ({"correct": 4, "style": 2}, "fine")
    assert parse_scores("```json\n" + good(4, 2) + "\n```", RUBRIC)[0] == {"correct": 4, "style": 2}
    # (3 * (4-1)/4 + 1 * (2-1)/4) / 4 = (2.25 + 0.25) / 4
    assert RUBRIC.normalise({"correct": 4, "style": 2}) == pytest.approx(0.625)
    assert parse_winner('{"winner": "tie", "rationale": ""}') == ("tie", "")
    with pytest.raises(ParseError):
        parse_winner('{"winner": "C"}')


# --- the loopback server -----------------------------------------------------------------------------------
def judge_for(app, **kw) -> tuple[PointwiseJudge, LiveServer]:
    server = LiveServer(app).__enter__()
    chat = CachedChat(OpenAIChat("scripted", base_url=server.url + "/v1", timeout=kw.pop("timeout", 10.0)),
                      usd_per_mtok=kw.pop("price", (0.0, 0.0)))
    return PointwiseJudge(chat, RUBRIC, **kw), server


def test_retry_after_a_malformed_answer_then_a_verdict_with_the_rationale():
    replies = lambda msgs: good(5, 3) if "could not be parsed" in msgs[-1]["content"] else "Looks right to me: 5/5"
    app = chat_app(replies)
    judge, server = judge_for(app)
    try:
        v = judge(PROBLEM, "cba")
    finally:
        server.__exit__()
    assert v.score == pytest.approx((3 * 1 + 1 * 0.5) / 4) and v.passed and v.reason == "fine"
    assert v.details["attempts"] == 2 and v.details["scores"] == {"correct": 5, "style": 3}
    retry = app.state.requests[1]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[2]["content"] == "Looks right to me: 5/5" and "not a JSON object" in retry[3]["content"]


def test_unparsable_twice_gives_a_zero_verdict_that_says_so_and_is_not_cached():
    app = chat_app(lambda msgs: '{"scores": {"correct": 9, "style": 1}}')
    judge, server = judge_for(app)
    try:
        v = judge(PROBLEM, "cba")
        again = judge(PROBLEM, "cba")
    finally:
        server.__exit__()
    assert (v.score, v.passed, v.details["unparsable"]) == (0.0, False, True)
    assert v.reason.startswith("judge answer unparsable after 2 attempts: score correct=9")
    assert again.score == 0.0 and len(app.state.requests) == 4  # the bad answer was never served from cache
    assert judge.chat.pop_metrics()["judge/unparsable"] == 2


def test_cache_accounting_and_cost():
    app = chat_app(lambda msgs: good(5, 5))
    judge, server = judge_for(app, price=(1.0, 2.0))
    try:
        first, second = judge(PROBLEM, "cba"), judge(PROBLEM, "cba")
        other = judge(PROBLEM, "abc")
    finally:
        server.__exit__()
    assert first == second and other.score == 1.0 and len(app.state.requests) == 2
    m = judge.chat.pop_metrics()
    prompt_words = sum(len(x["content"].split()) for x in judge.messages(PROBLEM, "cba"))
    completion_words = len(good(5, 5).split())
    assert (m["judge/calls"], m["judge/cache_hits"]) == (2, 1)
    assert m["judge/prompt_tokens"] == 2 * prompt_words and m["judge/completion_tokens"] == 2 * completion_words
    assert m["judge/cost_usd"] == pytest.approx((2 * prompt_words * 1.0 + 2 * completion_words * 2.0) / 1e6)
    assert judge.chat.pop_metrics()["judge/calls"] == 0  # reset per step


def test_reference_guided_prompt_and_concurrent_batch_keeps_order():
    rule = RuleJudge(lambda task, resp: 1.0 if resp == task[:-1][::-1] else 0.0, ("correct", "style"), 1, 5)
    app = chat_app(rule)
    judge, server = judge_for(app, reference=True, concurrency=4)
    words = ["abc", "hgf", "dd", "ji", "cab", "efg"]
    problems = [Problem(f"{w}=", w[::-1]) for w in words]
    answers = [w[::-1] if i % 2 == 0 else w for i, w in enumerate(words)]
    try:
        verdicts = judge.verify_batch(problems, answers)
    finally:
        server.__exit__()
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # "dd" reversed is "dd"
    assert all(tag(r[1]["content"], "reference") is not None for r in app.state.requests)


def test_dead_endpoint_and_timeout_give_unavailable_verdicts():
    app = chat_app(lambda msgs: good(), delay_s=3.0)
    judge, server = judge_for(app, timeout=0.2)
    try:
        slow = judge(PROBLEM, "cba")
    finally:
        server.__exit__()
    assert slow.score == 0.0 and slow.reason == "judge unavailable: timeout after 0.2s"
    dead = PointwiseJudge(CachedChat(OpenAIChat("x", base_url=server.url + "/v1", timeout=2.0)), RUBRIC)
    v = dead(PROBLEM, "cba")  # the server is gone: connection refused
    assert v.score == 0.0 and v.reason.startswith("judge unavailable: APIConnectionError")
    assert dead.chat.pop_metrics()["judge/unavailable"] == 1


# --- pairwise: the swap cancels position bias ---------------------------------------------------------------
def pair_judge(rule: RuleJudge) -> tuple[PairwiseJudge, LiveServer, object]:
    app = chat_app(rule)
    server = LiveServer(app).__enter__()
    return PairwiseJudge(CachedChat(OpenAIChat("pair", base_url=server.url + "/v1"))), server, app


def gold(task: str, resp: str) -> float:
    return 1.0 if resp == task[:-1][::-1] else 0.0


def test_position_swap_cancels_a_judge_that_always_says_a():
    judge, server, app = pair_judge(RuleJudge(gold, position_bias=1.0))
    try:
        r = judge.compare(PROBLEM, "cba", "abc")
    finally:
        server.__exit__()
    assert (r.p_first, r.consistent) == (0.5, False)  # A both times: first wins once, loses once
    firsts = [tag(m[1]["content"], "response_a") for m in app.state.requests]
    assert firsts == ["cba", "abc"]  # asked in both orders


def test_unbiased_comparison_and_group_scores():
    judge, server, _ = pair_judge(RuleJudge(gold))
    try:
        r = judge.compare(PROBLEM, "abc", "cba")
        scores = judge.group_scores(PROBLEM, ["cba", "abc", "cba", "bca"])
    finally:
        server.__exit__()
    assert (r.p_first, r.consistent) == (0.0, True)
    # "cba" beats both wrong ones (2 wins) and ties its twin (0.5): 2.5 / 3; wrong ones tie each other: 0.5 / 3
    assert scores == pytest.approx([2.5 / 3, 0.5 / 3, 2.5 / 3, 0.5 / 3])


def test_hybrid_rules_gate_the_judge():
    app = chat_app(lambda msgs: good(5, 5))
    judge, server = judge_for(app)
    letters = lambda p, c: Verdict(float(sorted(c) == sorted(p.answer)), sorted(c) == sorted(p.answer), "letters")
    hybrid = Hybrid({"letters": letters}, judge)
    try:
        bad, ok = hybrid(PROBLEM, "xyz"), hybrid(PROBLEM, "bca")
    finally:
        server.__exit__()
    assert bad.score == 0.0 and "hard constraint failed" in bad.reason and len(app.state.requests) == 1
    assert ok.score == 1.0 and ok.details["parts"]["judge"]["details"]["scores"] == {"correct": 5, "style": 5}


def test_judge_quality_command_on_a_perfect_and_a_position_biased_scripted_judge():
    from typer.testing import CliRunner

    from feedbackrl.cli import app

    def run(*extra: str) -> dict:
        out = CliRunner().invoke(app, ["judge", "quality", "--base-url", "scripted", "--pairs", "20", *extra])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    perfect = run()
    assert (perfect["pairs"], perfect["agreement"], perfect["position_bias_rate"], perfect["self_consistency"]) == (
        20, 1.0, 0.0, 1.0)
    biased = run("--position-bias", "1.0")  # always "A": every pair flips with the order, agreement is chance
    assert (biased["agreement"], biased["position_bias_rate"]) == (0.5, 1.0)


def test_a_recipe_reward_section_builds_the_judge_from_the_registry():
    from feedbackrl.config import build_config
    from feedbackrl.rewards.registry import build_reward

    app = chat_app(RuleJudge(gold, ("right",), 1, 5))
    with LiveServer(app) as server:
        cfg = build_config({"reward": {"source": "judge", "judge_model": "scripted", "base_url": server.url + "/v1",
                                       "criteria": {"right": "the word backwards"}, "low": 1, "high": 5}})
        reward = build_reward(cfg.reward, lambda problems, completions: [])
        verdicts = reward([PROBLEM, PROBLEM], ["cba", "abc"])
    assert [(v.score, v.passed) for v in verdicts] == [(1.0, True), (0.0, False)]
    assert "the word backwards" in app.state.requests[0][0]["content"]


def test_a_local_hf_model_as_judge_goes_through_the_same_parsing(tiny_model_dir):
    from feedbackrl.rewards.judge_backends import HFChat

    chat = CachedChat(HFChat(str(tiny_model_dir), max_new_tokens=8))
    v = PointwiseJudge(chat, RUBRIC)(PROBLEM, "cba")
    # an untrained 1M-parameter model writes characters, not the JSON object: retried once, then said so
    assert (v.score, v.passed, v.details["unparsable"]) == (0.0, False, True)
    m = chat.pop_metrics()
    assert (m["judge/calls"], m["judge/unparsable"], m["judge/completion_tokens"]) == (2, 1, 16)
    assert chat.backend.name == f"hf:{tiny_model_dir}"


def test_groupwise_reward_scores_each_group_by_its_round_robin():
    from feedbackrl.rewards.judge import groupwise_reward

    judge, server, app = pair_judge(RuleJudge(gold))
    other = Problem("xyz=", "zyx")
    problems = [PROBLEM] * 3 + [other] * 2  # two groups: rows 0-2 and 3-4
    try:
        verdicts = groupwise_reward(judge)(problems, ["cba", "abc", "bca", "zyx", "zyx"])
    finally:
        server.__exit__()
    # group 1: "cba" beats both (2 / 2), the wrong ones tie each other (0.5 / 2); group 2: identical, 0.5 each
    assert [v.score for v in verdicts] == [1.0, 0.25, 0.25, 0.5, 0.5]
    assert [v.passed for v in verdicts] == [True, False, False, False, False]
    assert len(app.state.requests) == 6  # 3 pairs x 2 orders; identical completions are not asked about


def test_judge_quality_with_a_local_model_reports_an_unreadable_judge_as_chance(tiny_model_dir):
    from typer.testing import CliRunner

    from feedbackrl.cli import app

    # the tiny random model writes no verdict the judge can parse: every comparison is a tie (0.5 both ways, so
    # no position bias), and greedy decoding repeats itself exactly (self-consistency 1)
    out = CliRunner().invoke(app, ["judge", "quality", "--local-model", str(tiny_model_dir), "--pairs", "4",
                                   "--max-new-tokens", "6"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["local_model"] == str(tiny_model_dir)
    assert (report["pairs"], report["agreement"], report["position_bias_rate"], report["self_consistency"]) == (
        4, 0.5, 0.0, 1.0)
    both = CliRunner().invoke(app, ["judge", "quality", "--local-model", str(tiny_model_dir), "--base-url", "scripted"])
    assert both.exit_code != 0 and "exactly one of --base-url" in both.output
    neither = CliRunner().invoke(app, ["judge", "quality"])
    assert neither.exit_code != 0 and "exactly one of --base-url" in neither.output
