"""The calculator and guessing environments step by step, their demonstrations replayed through
the environment, and the episode statistics on hand-made records."""

from __future__ import annotations

import math
import random

import pytest

from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.envs.multi_turn import EpisodeLimits, EpisodeRecord, Turn, demo_conversation, episode_stats
from feedbackrl.envs.registry import TASKS
from feedbackrl.envs.tools import ToolCall
from feedbackrl.envs.turn_format import MinimalFormat
from feedbackrl.models.tiny import build_tokenizer
from feedbackrl.rewards.verdict import Verdict, fail

MINIMAL = MinimalFormat(build_tokenizer(), lambda messages: "")


def _turn(text: str) -> Turn:
    """A turn parsed as the runner parses it for the tiny model (the minimal format)."""
    return MINIMAL.parse(text, [])


def _calc_env(tools: bool = True, a: int = 4821, b: int = 377):
    task = CalculatorAdditionTask(tools=tools)
    p = task._draw(random.Random(0))
    p = type(p)(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})
    return task, task.make_env(p)


def test_calculator_episode_tool_then_answer() -> None:
    task, env = _calc_env()
    assert env.reset() == [{"role": "user", "content": "4821+377="}]
    r = env.step(_turn("calc(4821+377)"))
    assert (r.done, r.tool_calls, r.tool_errors) == (False, 1, 0)
    assert r.observation == [{"role": "tool", "content": "5198"}]
    assert task.render(r.observation) == "=5198\n"
    end = env.step(_turn("5198"))
    assert end.done and end.verdict.passed and end.verdict.score == 1.0


@pytest.mark.parametrize("turn, error", [
    ("calc(4821+", "error: malformed tool call"),
    ("python(1)", "error: unknown tool python; tools: calc"),
    ("calc(9**9**9)", "error: calc failed: ValueError"),
    ("calc(x)", "error: calc failed: ValueError"),
], ids=["malformed", "unknown", "power-tower", "name"])
def test_calculator_bad_calls_are_observations(turn: str, error: str) -> None:
    _, env = _calc_env()
    r = env.step(_turn(turn))
    assert not r.done and (r.tool_calls, r.tool_errors) == (1, 1)
    assert r.observation[0]["role"] == "tool" and r.observation[0]["content"].startswith(error)
    assert env.step(_turn("5198")).verdict.passed  # the episode goes on


@pytest.mark.parametrize("answer, passed", [
    ("5198", True), (" 5198 ", True), ("05198", False), ("5198.0", False), ("5199", False), ("", False),
    ("5198 5198", False), ("-5198", False), ("=5198", False), ("5 198", False),
], ids=["exact", "spaces", "leading-zero", "float", "off-by-one", "empty", "twice", "negative", "copied-prefix",
        "split"])
def test_calculator_final_answers(answer: str, passed: bool) -> None:
    _, env = _calc_env()
    r = env.step(_turn(answer))
    assert r.done and r.verdict.passed is passed and r.verdict.score == float(passed)


def test_no_tool_arm_refuses_the_calculator() -> None:
    _, env = _calc_env(tools=False)
    r = env.step(_turn("calc(4821+377)"))
    assert r.observation[0]["content"] == "error: unknown tool calc; tools: none" and r.tool_errors == 1


def test_calculator_demonstrations_replay_through_the_env() -> None:
    task, rng = CalculatorAdditionTask(demo_noise=0.5), random.Random(3)
    kinds = set()
    for _ in range(40):
        p = task.sample(rng)
        demo = task.demonstrate(p, rng)
        env = task.make_env(p)
        if len(demo) == 1:  # the sloppy teacher guessed without the tool
            kinds.add("guess")
            assert demo == [{"role": "assistant", "content": str(p.meta["a"])}]
            continue
        kinds.add("tool")
        call, result, answer = demo
        turn = MINIMAL.write([], call)
        assert turn == f"calc({p.meta['a']}+{p.meta['b']})"
        r = env.step(_turn(turn))
        assert [result] == r.observation  # the observation the environment gives, then the copied answer
        assert answer == {"role": "assistant", "content": p.answer}
        assert env.step(_turn(answer["content"])).verdict.passed
    assert kinds == {"guess", "tool"}


def test_calculator_answers_every_call_of_a_turn_and_checks_json_arguments() -> None:
    _, env = _calc_env()
    turn = Turn("two calls", (ToolCall("calc", {"expression": "1+2"}), ToolCall("calc", {"expression": 3}),
                              ToolCall("calc", {"expr": "1"}), ToolCall("calc", {})))
    r = env.step(turn)
    assert not r.done and (r.tool_calls, r.tool_errors) == (4, 3)
    assert [m["content"] for m in r.observation] == [
        "3", "error: calc argument 'expression' must be a string, got int",
        "error: calc got unexpected argument(s) ['expr']; it takes 'expression' only",
        "error: calc needs the argument 'expression'"]
    r = env.step(Turn('<tool_call>{"name": "calc"', error="malformed tool call: not valid JSON"))
    assert r.observation == [{"role": "tool", "content": "error: malformed tool call: not valid JSON"}]
    assert env.step(_turn("5198")).verdict.passed  # the episode goes on


def test_calculator_heldout_is_disjoint_and_stable() -> None:
    task = CalculatorAdditionTask()
    held = task.heldout(50)
    assert held == task.heldout(50) and len({p.prompt for p in held}) == 50
    rng = random.Random(0)
    train = {task.sample(rng).prompt for _ in range(3000)}
    assert not train & {p.prompt for p in held}
    assert all(100 <= p.meta["a"] <= 9999 and 100 <= p.meta["b"] <= 9999 for p in held)


def test_guess_game_feedback_and_per_turn_rewards() -> None:
    task = GuessNumberTask(hi=31)
    env = task.make_env(task._problem(20))
    assert env.reset() == [{"role": "user", "content": "guess 1-31:"}]
    # per-turn reward: minus the share of the numbers still possible that the worse answer would leave
    moves = [("16", "higher", -15 / 31),  # 1..31: 1..15 or 17..31 left, 15 of 31
             ("24", "lower", -7 / 15),  # 17..31: 17..23 or 25..31 left, 7 of 15
             ("30", "lower", -1.0),  # contradicts "lower" at 24: all of 17..23 stay possible
             ("abc", "invalid", -1.0), ("99", "invalid", -1.0),
             ("20", None, -3 / 7)]  # 17..23: 17..19 or 21..23 would be left, 3 of 7
    for move, feedback, reward in moves:
        r = env.step(_turn(move))
        assert r.reward == reward, move
        if feedback is None:
            assert r.done and r.verdict.passed and r.verdict.details == {"moves": 6}
        else:
            assert not r.done and r.observation == [{"role": "user", "content": feedback}]


def test_guess_move_reward_prefers_bisection_and_the_last_number_scores_zero() -> None:
    env = GuessNumberTask(hi=31).make_env(GuessNumberTask(hi=31)._problem(5))
    assert [env.move_reward(g) for g in (16, 8, 1, 31)] == [-15 / 31, -23 / 31, -30 / 31, -30 / 31]
    env.step(Turn("6"))  # lower: 1..5 left
    env.step(Turn("4"))  # higher: 5 left
    assert (env.low, env.high) == (5, 5)
    assert env.move_reward(5) == 0.0 and env.move_reward(4) == -1.0


def test_guess_episode_budget_fits_max_turns_moves() -> None:
    # each move: up to turn_tokens (4) for the guess, then "invalid\n" (8 characters)
    assert GuessNumberTask(hi=31, max_turns=8).limits.max_tokens == 8 * (4 + 8)
    assert GuessNumberTask(hi=31, max_turns=6).limits.max_tokens == 72
    assert GuessNumberTask(hi=31, max_turns=3, max_tokens=400).limits.max_tokens == 400  # e.g. for chat templates


def test_guess_demonstrations_replay_and_binary_search_is_short() -> None:
    rng = random.Random(1)
    slow = 0
    for noise, worst in ((0.0, 5), (1.0, 6)):
        task = GuessNumberTask(hi=31, demo_noise=noise, max_turns=6)
        for secret in range(1, 32):
            p = task._problem(secret)
            demo = task.demonstrate(p, rng)
            env, n = task.make_env(p), 0
            for i, message in enumerate(demo):
                if message["role"] != "assistant":
                    continue
                r = env.step(_turn(message["content"]))
                n += 1
                if i + 1 < len(demo):
                    assert demo[i + 1 : i + 1 + len(r.observation)] == r.observation  # the game's real feedback
            assert n <= worst
            if noise == 0.0:
                assert r.done and r.verdict.passed  # binary search always wins within 5 moves
            else:
                slow += not r.done  # the cautious player runs out of turns on some numbers
    assert slow == 7, slow  # quarter-point search on 1..31 needs more than 6 moves for 7 secrets


def test_guess_eval_plays_every_secret_and_training_draws_them_uniformly() -> None:
    task, rng = GuessNumberTask(hi=31), random.Random(0)
    assert [int(p.answer) for p in task.heldout(33)] == [*range(1, 32), 1, 2]
    counts = [0] * 32
    for _ in range(31_000):
        counts[int(task.sample(rng).answer)] += 1
    assert counts[0] == 0 and min(counts[1:]) > 850 and max(counts[1:]) < 1150  # ~1000 each (sd ~31)


def test_episode_stats_hand_made() -> None:
    win = Verdict(1.0, True, "ok")
    recs = [EpisodeRecord("p", turn_rewards=[0, 0], tool_calls=1, tool_errors=0, end="answered", verdict=win),
            EpisodeRecord("p", turn_rewards=[0, 0, 0, 0], tool_calls=3, tool_errors=2, end="answered", verdict=win,
                          parse_errors=1),
            EpisodeRecord("p", turn_rewards=[0, 0, 0], tool_calls=0, end="out_of_turns", verdict=fail("x")),
            EpisodeRecord("p", turn_rewards=[0], tool_calls=0, end="error", verdict=fail("y"))]
    s = episode_stats(recs)
    assert s["episode/success_rate"] == 0.5
    assert s["episode/turns_mean"] == 10 / 4 and s["episode/turns_per_success"] == 3.0
    assert s["episode/tool_calls_mean"] == 1.0 and s["episode/tool_error_rate"] == 0.5
    assert s["episode/parse_errors_mean"] == 0.25  # one malformed call in four episodes
    assert (s["episode/end/answered"], s["episode/end/out_of_turns"], s["episode/end/error"],
            s["episode/end/truncated"]) == (0.5, 0.25, 0.25, 0.0)
    assert math.isnan(episode_stats(recs[2:])["episode/turns_per_success"])


def test_limits_and_transcript_helpers_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeLimits(max_turns=0)
    with pytest.raises(ValueError, match="tool_timeout_s"):
        EpisodeLimits(tool_timeout_s=0)
    with pytest.raises(ValueError, match="2 turns need 1"):
        demo_conversation(["a", "b"], [])
    assert TASKS["calculator_addition"] is CalculatorAdditionTask and TASKS["guess_number"] is GuessNumberTask


def test_transcripts_written_before_parse_errors_read_as_zero() -> None:
    rec = EpisodeRecord("p", turn_rewards=[0.0], tool_calls=1, tool_errors=1, end="answered", verdict=fail("x"),
                        parse_errors=1)
    d = rec.to_dict()
    assert d["parse_errors"] == 1 and EpisodeRecord.from_dict(d).to_dict() == d
    del d["parse_errors"]  # an episodes.jsonl line from before the field existed
    assert EpisodeRecord.from_dict(d).parse_errors == 0
