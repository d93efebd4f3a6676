"""The `verifiers` task without the verifiers virtualenv: options are checked, a missing interpreter
fails with what to do, the driver's episodes become rows, verdicts and transcripts exactly, and the
minimal chat template renders what the endpoint renders for a model without one."""

from __future__ import annotations

import json
import random

import pytest

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.external import ExternalEpisode, ExternalTask
from feedbackrl.envs.registry import make_task
from feedbackrl.envs.verifiers_env import VerifiersError, VerifiersTask
from feedbackrl.models.chat import MINIMAL_CHAT_TEMPLATE
from feedbackrl.rewards.verdict import Problem

pytest.importorskip("fastapi")
from feedbackrl.serve.openai_api import render_messages  # noqa: E402


def _task(**kw) -> VerifiersTask:
    task = VerifiersTask(env="tiny_reverse", python="/nonexistent/python", **kw)
    task._tasks = [{"idx": i, "prompt": p, "system_prompt": None, "answer": p[:-1][::-1]}
                   for i, p in enumerate(["ab=", "bca=", "cc=", "abc=", "ba="])]
    return task


def _driver_episode(**kw) -> dict:
    e = {"idx": 0, "ok": True, "errors": [], "reward": 0.5, "rewards": {"similarity": 0.5},
         "token_ids": [5, 6, 7, 8, 9, 2], "sampled_mask": [False, False, False, True, True, True],
         "logprobs": [0.0, 0.0, 0.0, -0.5, -1.0, -0.25],
         "messages": [{"role": "user", "content": "ab="}, {"role": "assistant", "content": "ba"}],
         "stop_condition": "agent_completed", "is_truncated": False, "branches": 1}
    return {**e, **kw}


def test_registry_builds_it_and_rejects_unknown_options() -> None:
    task = make_task(TaskConfig(name="verifiers", options={"env": "tiny_reverse", "heldout_tasks": 2}))
    assert isinstance(task, VerifiersTask) and isinstance(task, ExternalTask) and task.harness == "null"
    with pytest.raises(ConfigError, match="unknown option"):
        make_task(TaskConfig(name="verifiers", options={"env": "x", "heldout": 2}))
    with pytest.raises(ConfigError, match="options.env"):
        make_task(TaskConfig(name="verifiers", options={}))


def test_a_missing_virtualenv_says_how_to_make_it() -> None:
    task = VerifiersTask(env="tiny_reverse", python="/nonexistent/python")
    with pytest.raises(VerifiersError, match="make verifiers-venv"):
        task.sample(random.Random(0))


def test_training_never_draws_the_heldout_tasks() -> None:
    task = _task(heldout_tasks=2)
    drawn = {task.sample(random.Random(s)).meta["idx"] for s in range(200)}
    assert drawn == {0, 1, 2}
    assert [p.prompt for p in task.heldout(2)] == ["abc=", "ba="]
    with pytest.raises(ValueError, match="heldout_tasks = 2"):
        task.heldout(3)


def test_demonstrations_are_the_answer_field() -> None:
    task = _task()
    p = task.sample(random.Random(1))
    assert task.demonstrate(p, random.Random(0)) == p.prompt[:-1][::-1]
    with pytest.raises(ValueError, match="string `answer`"):
        task.demonstrate(Problem("x=", None, {"idx": 9, "system_prompt": None, "messages": False}), random.Random(0))


def test_a_driver_episode_becomes_an_external_episode() -> None:
    task = _task(pass_threshold=0.5)
    p = task.sample(random.Random(0))
    ep = task._episode(p, _driver_episode())
    assert ep.prompt_len == 3 and ep.reward == 0.5
    assert ep.record.verdict.passed and ep.record.verdict.score == 0.5 and ep.record.end == "answered"
    assert ep.record.verdict.details["rewards"] == {"similarity": 0.5} and ep.record.turns == 1

    over = task._episode(p, _driver_episode(reward=2.5, is_truncated=True))
    assert over.reward == 2.5 and over.record.verdict.score == 1.0 and over.record.end == "truncated"
    assert over.record.verdict.details["raw_reward"] == 2.5

    failed = task._episode(p, _driver_episode(ok=False, errors=["HarnessError: boom"], reward=0.9))
    assert failed.reward == 0.0 and not failed.record.verdict.passed and failed.record.end == "error"
    assert "HarnessError: boom" in failed.record.verdict.reason


def test_misaligned_episode_is_rejected() -> None:
    with pytest.raises(ValueError, match="must align"):
        ExternalEpisode([1, 2, 3], [False, True], [0.0, -1.0, -1.0], 0.0, None)  # type: ignore[arg-type]


def test_verify_of_a_bare_completion_is_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="whole traces"):
        _task().verify(Problem("ab=", "ba"), "ba")


def test_minimal_template_renders_what_the_endpoint_renders(tokenizer) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"input": "12+3"}}}
    msgs = [{"role": "user", "content": "12+3="}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "15"}, {"role": "assistant", "content": "15"},
            {"role": "user", "content": "ok"}]
    wire_call = {**call, "function": {**call["function"], "arguments": json.dumps({"input": "12+3"})}}
    wire = [{**m, "tool_calls": [wire_call]} if "tool_calls" in m else m for m in msgs]
    expected = "12+3=calc(12+3)<eos>=15\n15<eos>ok"
    assert render_messages(tokenizer, wire, None) == expected
    tokenizer.chat_template = MINIMAL_CHAT_TEMPLATE
    try:
        assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == expected
    finally:
        tokenizer.chat_template = None  # the session's tokenizer keeps no template


def test_a_relative_interpreter_becomes_absolute_without_leaving_its_virtualenv(tmp_path, monkeypatch) -> None:
    base = tmp_path / "base-python"
    base.write_text("")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(base)  # a virtualenv's python links to the base one
    monkeypatch.chdir(tmp_path)
    task = VerifiersTask(env="tiny_reverse", python="venv/bin/python")
    assert task._python() == str(tmp_path / "venv" / "bin" / "python")
