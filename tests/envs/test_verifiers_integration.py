"""A real `verifiers` 0.4 environment (tests/envs/verifiers_envs/tiny_reverse, written in its v1 API)
against our policy endpoint, with verifiers in its own virtualenv: loaded by module name, its
clients drive the endpoint (the training client's token-in/token-out route, log-probs equal to the
policy's own; the eval client's streamed chat completions), and `feedbackrl train` runs GRPO steps on
it with verifiers' rewards.

Skipped without the virtualenv: `make verifiers-venv` makes it at .venv-verifiers (or point
FEEDBACKRL_VERIFIERS_PYTHON at another verifiers interpreter).
"""

from __future__ import annotations

import json
import os
import subprocess
from difflib import SequenceMatcher
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from typer.testing import CliRunner  # noqa: E402

from feedbackrl.cli import app  # noqa: E402
from feedbackrl.envs.verifiers_env import VerifiersTask  # noqa: E402
from feedbackrl.models.logprobs import sequence_logprobs  # noqa: E402
from feedbackrl.models.tiny import build_model  # noqa: E402
from feedbackrl.serve import openai_api  # noqa: E402
from feedbackrl.train.episodes import read_transcripts  # noqa: E402
from feedbackrl.train.external import policy_endpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "tests" / "envs" / "verifiers_envs"
PYTHON = Path(os.environ.get("FEEDBACKRL_VERIFIERS_PYTHON", ROOT / ".venv-verifiers" / "bin" / "python"))


def _usable() -> str | None:
    if not PYTHON.is_file():
        return f"no verifiers virtualenv at {PYTHON} (make verifiers-venv, or set FEEDBACKRL_VERIFIERS_PYTHON)"
    probe = subprocess.run([str(PYTHON), "-c", "import verifiers.v1, uv; print(verifiers.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"{PYTHON} cannot import verifiers.v1 and uv (make verifiers-venv): {probe.stderr[-300:]}"
    return None


_REASON = _usable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _task(**kw) -> VerifiersTask:
    return VerifiersTask(env="tiny_reverse", python=str(PYTHON), path=[str(ENVS)], taskset={"num_tasks": 6}, **kw)


def test_the_environment_loads_by_module_name() -> None:
    tasks = _task().tasks
    assert len(tasks) == 6
    for t in tasks:
        assert t["prompt"].endswith("=") and t["answer"] == t["prompt"][:-1][::-1] and t["system_prompt"] is None


@pytest.mark.slow
def test_verifiers_clients_drive_the_endpoint(tokenizer, monkeypatch) -> None:
    model = build_model(tokenizer, "tiny", seed=0)
    task = _task()
    streamed, generated = [], []
    monkeypatch.setattr(openai_api, "_chunks", _spy(openai_api._chunks, streamed))
    monkeypatch.setattr(openai_api, "_generate_tokens", _spy(openai_api._generate_tokens, generated))
    sampling = {"temperature": 1.0, "max_tokens": 6}
    with policy_endpoint(model, tokenizer) as (url, tok_dir):
        req = {"command": "run", "harness": "null", "tasks": [0, 1, 1], "base_url": url, "tokenizer": tok_dir,
               "sampling": sampling}
        trained = task._call({**req, "client": "train"})["episodes"]
        assert len(generated) == 3 and not streamed  # the training client: token ids in, token ids out
        evaluated = task._call({**req, "tasks": [2], "client": "eval"})["episodes"]
        assert len(streamed) == 1 and len(generated) == 3  # the eval client: a streamed chat completion
    answers = {t["idx"]: t["answer"] for t in task.tasks}
    for e in trained + evaluated:
        assert e["ok"], e["errors"]
        reply = e["messages"][-1]["content"] or ""
        assert e["messages"][0] == {"role": "user", "content": task.tasks[e["idx"]]["prompt"]}
        expected = SequenceMatcher(None, reply.strip(), answers[e["idx"]]).ratio()
        assert e["rewards"]["similarity"] == pytest.approx(expected)
    for e in trained:
        k = e["sampled_mask"].index(True)
        prompt, completion = e["token_ids"][:k], e["token_ids"][k:]
        assert prompt == tokenizer(task.tasks[e["idx"]]["prompt"], add_special_tokens=False)["input_ids"]
        assert all(e["sampled_mask"][k:]) and 1 <= len(completion) <= 6
        ours, _ = sequence_logprobs(model, torch.tensor([prompt]), torch.ones(1, k, dtype=torch.long),
                                    torch.tensor([completion]), torch.ones(1, len(completion), dtype=torch.long))
        torch.testing.assert_close(torch.tensor([e["logprobs"][k:]]), ours, atol=2e-4, rtol=0)


def _spy(fn, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return wrapped


@pytest.mark.slow
def test_grpo_steps_through_feedbackrl_train(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = [f"task.options.python={PYTHON}", f'task.options.path=["{ENVS}"]', "algo.steps=2",
            "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=4", "train.threads=1"]
    result = CliRunner().invoke(app, ["train", str(ROOT / "recipes" / "verifiers_grpo.toml"), "--out", str(out),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    rl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in rl if m.get("phase") == "rl"]
    episodes = read_transcripts(out / "episodes.jsonl")
    assert [m["step"] for m in rl] == [1, 2] and [s for s, _ in episodes] == [1] * 8 + [2] * 8
    for m in rl:
        rewards = [r.reward for s, r in episodes if s == m["step"]]
        # the rewards verifiers computed are the ones trained on, and they are its similarity ratio
        assert m["reward/mean"] == pytest.approx(sum(rewards) / 8)
        assert m["rollout/logprob_gap_max"] < 1e-4  # the masked tokens are exactly the ones the policy sampled
        assert 0 < m["rollout/len_mean"] <= 6 and m["episode/end/error"] == 0.0
    for _, r in episodes:
        word = r.prompt[:-1]
        reply = (r.messages[-1]["content"] or "").strip()
        assert r.reward == pytest.approx(SequenceMatcher(None, reply, word[::-1]).ratio())
        assert r.verdict.details["rewards"] == {"similarity": pytest.approx(r.reward)}
    before = json.loads((out / "eval_before.json").read_text())
    assert before["n"] == 4 and 0.0 <= before["accuracy"] <= 1.0
