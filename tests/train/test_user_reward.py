"""GRPO from a recipe whose reward is the user's own function (`[reward] source = "python"`), in a module the
test writes: per completion and per batch, sync and async, float and Verdict, and a TRL reward function as
TRL's docs write it. The logged training reward is the mean of what the function returned, step by step; a
function that raises stops `feedbackrl train` with exit 2 and a message naming it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from short_run import short_recipe
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.data.rows import read_jsonl

# Each function appends what it returned (in its own units) to the file $REWARD_LOG names, so the test can
# recompute the logged reward from the function's own answers.
USER_CODE = '''
import asyncio, json, os
from feedbackrl.rewards.verdict import Verdict

def _log(values):
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps(values) + "\\n")
    return values

def starts_like_answer(problem, completion):  # per completion, sync, float
    return _log([float(completion[:1] == problem.answer[:1])])[0]

async def starts_like_answer_async(problem, completion):  # per completion, async, Verdict
    await asyncio.sleep(0)
    ok = completion[:1] == problem.answer[:1]
    _log([float(ok)])
    return Verdict(float(ok), ok, "first letter")

def shortness(problems, completions):  # per batch, sync, float
    return _log([1.0 - min(len(c), 4) / 4 for c in completions])

def accuracy_reward(completions, prompts, **kwargs):  # TRL's signature, a reward in [-1, 1]
    return _log([1.0 if c.strip() == p.split("=")[0][::-1] else -1.0 for c, p in zip(completions, prompts)])

def broken(problem, completion):
    raise KeyError("answer_column")
'''

TASK = 'name = "reverse"\noptions = { min_len = 3, max_len = 4, alphabet_size = 5 }'

# (function, extra [reward] lines, how a returned value maps onto the [0, 1] reward)
CASES = {
    "completion_sync_float": ("my_rewards.py:starts_like_answer", "", lambda x: x),
    "completion_async_verdict": ("my_rewards:starts_like_answer_async", "", lambda x: x),
    "batch_sync_float": ("my_rewards:shortness", 'signature = "batch"', lambda x: x),
    "trl": ("my_rewards:accuracy_reward", 'signature = "trl"\nscore_range = [-1, 1]', lambda x: (x + 1) / 2),
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("REWARD_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.delitem(__import__("sys").modules, "my_rewards", raising=False)
    return tmp_path


def train(workdir: Path, function: str, options: str) -> tuple[int, str]:
    (workdir / "recipe.toml").write_text(short_recipe(TASK, f'source = "python"\nfunction = "{function}"\n{options}'))
    res = CliRunner().invoke(app, ["train", "recipe.toml", "--out", "run"])
    return res.exit_code, res.output


@pytest.mark.parametrize("case", CASES)
def test_grpo_trains_on_the_users_function(workdir: Path, case: str) -> None:
    function, options, to_unit = CASES[case]
    code, output = train(workdir, function, options)
    assert code == 0, output
    returned = [x for call in read_jsonl(workdir / "calls.jsonl") for x in call]
    assert len(returned) == 2 * 2 * 2  # steps x prompts x group: the function scored every training completion
    steps = [r for r in read_jsonl(workdir / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r, chunk in zip(steps, (returned[:4], returned[4:]), strict=True):
        assert r["reward/mean"] == pytest.approx(sum(map(to_unit, chunk)) / 4, abs=1e-6)
    report = json.loads((workdir / "run" / "report.json").read_text())
    assert report["reward"] == "python" and "reward/gold_mean" in steps[0]  # judged by the task's gold beside it


def test_a_raising_function_stops_the_run_naming_it(workdir: Path) -> None:
    code, output = train(workdir, "my_rewards:broken", "")
    assert code == 2
    assert "error: reward function 'my_rewards:broken' (reward.function) raised on completion 0" in output
    assert "KeyError: 'answer_column'" in output and 'raise KeyError("answer_column")' in output


def test_a_missing_function_fails_before_any_work(workdir: Path) -> None:
    code, output = train(workdir, "my_rewards:nope", "")
    assert code == 2 and "reward.function = 'my_rewards:nope': 'my_rewards' has no attribute 'nope'" in output
    assert not (workdir / "run").exists()
