"""`[reward] source = "python"`: the user's own function, called as its `signature` says (per completion, per
batch, TRL's), sync or async, floats mapped from `score_range`, and every bad answer a clear error naming it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, RewardConfig, build_config
from feedbackrl.rewards.python_fn import RewardFunctionError
from feedbackrl.rewards.registry import build_reward
from feedbackrl.rewards.verdict import Problem, Verdict

USER_CODE = '''
import asyncio
from feedbackrl.rewards.verdict import Verdict

def exact(problem, completion):
    return float(completion.strip() == problem.answer)

async def exact_async(problem, completion):
    await asyncio.sleep(0)
    ok = completion.strip() == problem.answer
    return Verdict(float(ok), ok, "async exact", {"seen": completion})

def lengths(problems, completions):
    return [len(c) / 10 for c in completions]

async def lengths_async(problems, completions):
    return [len(c) / 10 for c in completions]

def accuracy_reward(completions, solution, **kwargs):  # a TRL reward function, as TRL's docs write them
    return [1.0 if c.strip() == s else -1.0 for c, s in zip(completions, solution)]

def think_format(completions, **kwargs):  # TRL's conversational form: completion[0]["content"]
    return [float(c[0]["content"].startswith("<think>")) for c in completions]

def trl_prompts(prompts, completions, answer, **kwargs):
    return [float(p == "2+2=" and a == "4") for p, a in zip(prompts, answer)]

def boom(problem, completion):
    return 1 / len(completion)

def too_few(problems, completions):
    return [0.5]

def nan(problem, completion):
    return float("nan")

def none(problem, completion):
    return None

def text(problem, completion):
    return "0.5"

def one_number(problems, completions):
    return 0.5

def two_args_needed(problem, completion, extra):
    return 0.0

NOT_A_FUNCTION = 3
'''

P = Problem("2+2=", "4", {"row": 0, "solution": "4", "raw_prompt": "2+2="})


@pytest.fixture
def user_file(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(USER_CODE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("my_rewards", None)


def reward(**options):
    return build_reward(RewardConfig(source="python", **options), lambda p, c: [])


def scores(verdicts: list[Verdict]) -> list[tuple[float, bool]]:
    return [(v.score, v.passed) for v in verdicts]


@pytest.mark.parametrize("ref", ["my_rewards:exact", "my_rewards.py:exact", "{dir}/my_rewards.py:exact"])
def test_a_per_completion_function_by_module_or_file(user_file, ref) -> None:
    fn = reward(function=ref.format(dir=user_file.parent))
    verdicts = fn([P, P, P], ["4", " 4\n", "5"])
    assert scores(verdicts) == [(1.0, True), (1.0, True), (0.0, False)]
    assert verdicts[2].reason == "reward function returned 0" and verdicts[2].details == {"raw": 0.0}


def test_async_per_completion_verdicts_are_taken_as_they_are(user_file) -> None:
    verdicts = reward(function="my_rewards:exact_async")([P, P], ["4", "x"])
    assert scores(verdicts) == [(1.0, True), (0.0, False)] and verdicts[1].details == {"seen": "x"}


@pytest.mark.parametrize("name", ["lengths", "lengths_async"])
def test_batch_functions_sync_and_async(user_file, name) -> None:
    verdicts = reward(function=f"my_rewards:{name}", signature="batch")([P, P, P], ["", "12345", "1234567890"])
    assert scores(verdicts) == [(0.0, False), (0.5, False), (1.0, True)]


def test_a_trl_function_gets_columns_and_its_range_is_mapped(user_file) -> None:
    fn = reward(function="my_rewards:accuracy_reward", signature="trl", score_range=[-1, 1])
    assert scores(fn([P, P], ["4", "3"])) == [(1.0, True), (0.0, False)]
    fn = reward(function="my_rewards:trl_prompts", signature="trl")  # prompts as the task wrote them, and answer
    rendered = Problem("<|user|>2+2=<|end|>", "4", {"raw_prompt": "2+2="})
    assert scores(fn([rendered], ["x"])) == [(1.0, True)]


def test_trl_conversational_completions(user_file) -> None:
    fn = reward(function="my_rewards:think_format", signature="trl", trl_format="conversational")
    assert scores(fn([P, P], ["<think>a</think>4", "4"])) == [(1.0, True), (0.0, False)]


def test_pass_at_in_the_functions_own_units(user_file) -> None:
    fn = reward(function="my_rewards:lengths", signature="batch", score_range=[0, 2], pass_at=0.5)
    assert scores(fn([P, P], ["1234", "12345"])) == [(0.2, False), (0.25, True)]


def test_composes_like_any_source(user_file) -> None:
    cfg = RewardConfig(source="weighted_sum", parts={"mine": {"source": "python", "function": "my_rewards:exact",
                                                              "weight": 3}, "short": {"source": "no_digits"}})
    v = build_reward(cfg, lambda p, c: [])([P], ["4"])[0]
    assert v.score == 0.75 and v.details["parts"]["mine"]["score"] == 1.0


def test_a_raising_function_stops_the_run_with_its_name_and_traceback(user_file) -> None:
    fn = reward(function="my_rewards:boom")
    with pytest.raises(RewardFunctionError) as e:
        fn([P, P], ["4", ""])
    msg = str(e.value)
    assert msg.startswith("reward function 'my_rewards:boom' (reward.function) raised on completion 1 ('')")
    assert "ZeroDivisionError: division by zero" in msg and "return 1 / len(completion)" in msg
    assert not isinstance(e.value, ValueError)  # never mistaken for a malformed completion worth 0


@pytest.mark.parametrize(("name", "options", "message"), [
    ("too_few", {"signature": "batch"}, "returned 1 score(s) for a batch of 2 completions"),
    ("nan", {}, "returned nan, not a finite number (completion 0: '4')"),
    ("none", {}, "returned NoneType None, not a number or a Verdict"),
    ("text", {}, "returned str '0.5', not a number or a Verdict"),
    ("accuracy_reward", {"signature": "trl"}, "returned -1, outside score_range [0, 1]; set score_range"),
    ("one_number", {"signature": "batch"}, "must return a list of 2 scores, one per completion; it returned float"),
])
def test_wrong_answers_are_errors_naming_the_function(user_file, name, options, message) -> None:
    with pytest.raises(RewardFunctionError, match=f"^reward function 'my_rewards:{name}'") as e:
        reward(function=f"my_rewards:{name}", **options)([P, P], ["4", "5"])
    assert message in str(e.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"function": "no_such_module:f"}, "no module named 'no_such_module' on sys.path"),
    ({"function": "my_rewards:missing"}, "'my_rewards' has no attribute 'missing'"),
    ({"function": "nowhere.py:f"}, "no file"),
    ({"function": "my_rewards"}, "expected 'package.module:name' or 'path/to/file.py:name'"),
    ({"function": "my_rewards:NOT_A_FUNCTION"}, "names a int, not a function"),
    ({"function": "my_rewards:two_args_needed"}, "signature = 'completion' calls it as fn(problem, completion)"),
    ({"function": "my_rewards:exact", "signature": "trl"}, "signature = 'trl' calls it as fn(completions="),
    ({"function": "my_rewards:exact", "trl_format": "conversational"}, "applies to signature = 'trl' only"),
    ({"function": "my_rewards:exact", "score_range": [1, 0]}, "finite lo < hi"),
    ({"function": "my_rewards:exact", "pass_at": 2}, "pass_at = 2 lies outside score_range"),
    ({"function": "my_rewards:exact", "signature": "per_batch"}, "reward.signature"),
    ({}, "reward.function: Field required"),
])
def test_mistakes_fail_when_the_recipe_is_read(user_file, options, message) -> None:
    with pytest.raises(ConfigError) as e:
        build_config({"reward": {"source": "python", **options}})
    assert message in str(e.value)


def test_a_module_that_fails_to_import_shows_its_traceback(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken.py").write_text("import json\nraise RuntimeError('no API key set')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        build_config({"reward": {"source": "python", "function": "broken.py:f"}})
    assert "importing it raised RuntimeError: no API key set" in str(e.value) and "line 2" in str(e.value)


def test_a_reference_as_source_points_to_python(user_file) -> None:
    with pytest.raises(ConfigError, match="use source = 'python' with function = 'my_rewards:exact'"):
        build_config({"reward": {"source": "my_rewards:exact"}})
