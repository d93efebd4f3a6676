"""A real `verifiers` 0.4 environment (examples/verifiers_envs/tiny_reverse, written in its v1 API)
against our policy endpoint, with verifiers in its own virtualenv: loaded by module name, its
clients drive the endpoint (the training client's token-in/token-out route, log-probs equal to the
policy's own; the eval client's streamed chat completions), and `feedbackrl train` runs GRPO steps on
it with verifiers' rewards. The environment's reward pays the exact reversal only: answers that do
not reverse the word (a constant, the prompt echoed, the word itself) score 0.

Skipped without the virtualenv: `make verifiers-venv` makes it at .venv-verifiers (or point
FEEDBACKRL_VERIFIERS_PYTHON at another verifiers interpreter).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from difflib import SequenceMatcher
from pathlib import Path

import pytest
import torch
from fp32 import adapter_terms, assert_logprobs_within_fp32, decoder_logprob_tolerance, float64_copy

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from typer.testing import CliRunner  # noqa: E402

from feedbackrl.cli import app  # noqa: E402
from feedbackrl.envs.verifiers_env import VerifiersError, VerifiersTask  # noqa: E402
from feedbackrl.episodes import external  # noqa: E402
from feedbackrl.episodes.external import policy_endpoint  # noqa: E402
from feedbackrl.episodes.multi_turn import read_transcripts  # noqa: E402
from feedbackrl.models.logprobs import sequence_logprobs  # noqa: E402
from feedbackrl.models.tiny import build_model  # noqa: E402
from feedbackrl.serve import openai_api  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "examples" / "verifiers_envs"
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


@pytest.fixture
def task():
    t = VerifiersTask(env="tiny_reverse", python=str(PYTHON), path=[str(ENVS)], taskset={"num_tasks": 6})
    yield t
    t.close()


def test_the_environment_loads_by_module_name(task) -> None:
    tasks = task.tasks
    assert len(tasks) == 6
    for t in tasks:
        assert t["prompt"].endswith("=") and t["answer"] == t["prompt"][:-1][::-1] and t["system_prompt"] is None


def test_one_driver_process_serves_the_calls_and_a_failed_call_is_reported(task) -> None:
    listed = task.tasks
    proc = task._driver._proc
    assert task._call({"command": "list"})["tasks"] == listed and task._driver._proc is proc
    with pytest.raises(VerifiersError, match="unknown command 'nope'"):
        task._call({"command": "nope"})
    assert task._driver is None and proc.poll() == 0  # closed: it tore down and exited
    assert task._call({"command": "list"})["tasks"] == listed and task._driver._proc is not proc


# Runs in the verifiers virtualenv: every task's own reward hooks (the functions verifiers sums into a
# trace's reward) and metric hooks on a reply, for each of the replies given on stdin.
_SCORE = """
import asyncio, inspect, json, sys, types
import tiny_reverse
from verifiers.v1.utils.loaders import load_environment, resolve_env_config
replies = json.loads(sys.stdin.read())
env = load_environment(resolve_env_config({"taskset": {"id": "tiny_reverse", "num_tasks": 48}}))
async def score(task, reply):
    trace = types.SimpleNamespace(last_reply=reply)
    hooks = {k: getattr(task, k) for k, _ in inspect.getmembers(type(task), inspect.isfunction)}
    return {kind: {k: await f(trace) for k, f in hooks.items() if getattr(f, kind, False)}
            for kind in ("reward", "metric")}
out = [[asyncio.run(score(t, r.replace("{word}", t.data.prompt[:-1]))) for r in replies] for t in env.taskset]
words = [t.data.prompt[:-1] for t in env.taskset]
print(json.dumps({"words": words, "scores": out}))
"""


def test_answers_that_do_not_reverse_the_word_score_zero() -> None:
    replies = ["bcb", "ab", "{word}=", "{word}", " {word} "]
    proc = subprocess.run([str(PYTHON), "-c", _SCORE], input=json.dumps(replies), capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ENVS)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    words, scores = out["words"], out["scores"]
    assert len(words) == 48 and len(scores) == 48
    palindromes = sum(w == w[::-1] for w in words)
    assert 0 < palindromes < 48  # the word echoed scores on palindromes only
    for word, per_reply in zip(words, scores, strict=True):
        (const3, const2, echoed, same, spaced) = [s["reward"] for s in per_reply]
        assert all(set(s) == {"exact"} for s in (const3, const2, echoed, same, spaced))  # the only reward
        assert const3["exact"] == float(word == "bcb") and const2["exact"] == float(word == "ba")
        assert echoed["exact"] == 0.0
        assert same["exact"] == spaced["exact"] == float(word == word[::-1])
        # partial similarity is recorded as a metric, never paid: the constant "bcb" is close to most reversals
        metric = per_reply[0]["metric"]["similarity"]
        assert metric == pytest.approx(SequenceMatcher(None, "bcb", word[::-1]).ratio())
    assert sum(per_reply[0]["metric"]["similarity"] >= 0.5 for per_reply in scores) >= 16  # 22 of the 48
    assert sum(per_reply[0]["reward"]["exact"] for per_reply in scores) <= 2


@pytest.mark.slow
def test_verifiers_clients_drive_the_endpoint(tokenizer, monkeypatch, task) -> None:
    model = build_model(tokenizer, "tiny", seed=0)
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
        assert e["rewards"] == {"exact": float(reply.strip() == answers[e["idx"]])}
        assert e["metrics"]["similarity"] == pytest.approx(SequenceMatcher(None, reply.strip(),
                                                                           answers[e["idx"]]).ratio())
    for e in trained:
        k = e["sampled_mask"].index(True)
        prompt, completion = e["token_ids"][:k], e["token_ids"][k:]
        assert prompt == tokenizer(task.tasks[e["idx"]]["prompt"], add_special_tokens=False)["input_ids"]
        assert all(e["sampled_mask"][k:]) and 1 <= len(completion) <= 6
        ours, _ = sequence_logprobs(model, torch.tensor([prompt]), torch.ones(1, k, dtype=torch.long),
                                    torch.tensor([completion]), torch.ones(1, len(completion), dtype=torch.long))
        # the endpoint's sampling log-probs (through verifiers and JSON: float32 values round trip exactly) and
        # the training forward's, each within float32 rounding of a float64 run of the model (tests/fp32.py)
        c_ids = torch.tensor([completion])
        assert_logprobs_within_fp32(model, torch.tensor([prompt]), torch.ones(1, k, dtype=torch.long), c_ids,
                                    torch.ones_like(c_ids), {"sampled": torch.tensor([e["logprobs"][k:]]),
                                                             "training forward": ours})


def _gap_bounds(monkeypatch) -> list[float]:
    """Each collect step's bound on `rollout/logprob_gap_max`, in step order.

    The gap is the largest difference between the endpoint's sampling log-probs and the training forward's on
    the same tokens, two float32 runs of the policy at that step: each within `decoder_logprob_tolerance` of a
    float64 copy of it (tests/fp32.py), so their gap within twice that, whatever the CPU."""
    bounds: list[float] = []
    real = external.sequence_logprobs

    def recording(model, p_ids, p_mask, c_ids, c_mask, temperature=1.0, **kw):
        ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, torch.ones_like(c_mask)], 1)
        tol = decoder_logprob_tolerance(float64_copy(model), ids, mask, adapter_terms(model)) / temperature
        assert 0 < tol < 1e-2, tol  # far below the log-prob gap of a token the policy did not sample (order 1)
        bounds.append(2 * tol)
        return real(model, p_ids, p_mask, c_ids, c_mask, temperature, **kw)

    monkeypatch.setattr(external, "sequence_logprobs", recording)
    return bounds


def _spy(fn, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return wrapped


@pytest.mark.slow
def test_grpo_steps_through_feedbackrl_train(tmp_path: Path, monkeypatch) -> None:
    bounds = _gap_bounds(monkeypatch)
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
    assert len(bounds) == 2
    for m, bound in zip(rl, bounds, strict=True):
        rewards = [r.reward for s, r in episodes if s == m["step"]]
        # the rewards verifiers computed are the ones trained on: 1 for the exact reversal, else 0
        assert m["reward/mean"] == pytest.approx(sum(rewards) / 8)
        assert m["rollout/logprob_gap_max"] <= bound  # the masked tokens are exactly the ones the policy sampled
        assert 0 < m["rollout/len_mean"] <= 6 and m["episode/end/error"] == 0.0
    for _, r in episodes:
        word = r.prompt[:-1]
        reply = (r.messages[-1]["content"] or "").strip()
        assert r.reward == float(reply == word[::-1])
        assert r.verdict.details["rewards"] == {"exact": r.reward}
        assert r.verdict.details["metrics"] == {"similarity": pytest.approx(SequenceMatcher(None, reply,
                                                                                           word[::-1]).ratio())}
    before = json.loads((out / "eval_before.json").read_text())
    assert before["n"] == 4 and 0.0 <= before["accuracy"] <= 1.0


# Third-party-style environments (tests/envs/verifiers_envs): their own `Env` subclass with an agent seat
# named `player`, played turn by turn with `agents.player.interaction(task)`, and a variant whose tasks
# launch a calculator `vf.Toolset` per rollout. Verifiers resolves their config; we only set each seat's
# runtime (local subprocess).
THIRD_PARTY = ROOT / "tests" / "envs" / "verifiers_envs"
TOOLS_RENDERER = '{ name = "default", tool_parser = "qwen3" }'  # a renderer that takes tools


# Runs in the verifiers virtualenv: the config the driver builds for an environment, as verifiers resolved it.
_RESOLVED = """
import json, sys
import verifiers_driver
env = verifiers_driver._env({"env": sys.argv[1], "taskset": {"num_tasks": 3}, "harness": "bash", "max_turns": 5})
seat = env.config.player
print(json.dumps({"env": type(env).__name__, "config": type(env.config).__name__, "runtime": seat.runtime.type,
                  "harness": seat.harness.id, "max_turns": seat.max_turns, "tasks": len(list(env.taskset)),
                  "agent": "agent" in type(env.config).model_fields}))
"""


@pytest.mark.parametrize(("env", "cls"), [("guess_number", "GuessNumberEnv"), ("guess_number_tools", "GuessToolsEnv")])
def test_the_driver_lets_verifiers_resolve_the_envs_own_config(env: str, cls: str) -> None:
    from feedbackrl.envs.verifiers_env import DRIVER

    path = os.pathsep.join([str(THIRD_PARTY), str(DRIVER.parent)])
    proc = subprocess.run([str(PYTHON), "-c", _RESOLVED, env], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # its own Env class and config, its seat `player` (no `agent` seat added); only the runtime is ours, and the
    # seat's own pinned harness (null) wins over the request's; the turn limit it leaves unset is filled
    assert out == {"env": cls, "config": "GuessNumberEnvConfig", "runtime": "subprocess", "harness": "null",
                   "max_turns": 5, "tasks": 3, "agent": False}


@pytest.mark.slow
@pytest.mark.parametrize("env", ["guess_number", "guess_number_tools"])
def test_grpo_on_a_third_party_env_with_its_own_env_class(tmp_path: Path, env: str, monkeypatch) -> None:
    bounds = _gap_bounds(monkeypatch)
    out = tmp_path / "run"
    sets = [f"task.options.env={env}", f"task.options.python={PYTHON}", f'task.options.path=["{THIRD_PARTY}"]',
            "task.options.taskset={ num_tasks = 8 }", "task.options.heldout_tasks=2", "task.heldout_size=2",
            "sft.steps=2", "sft.batch_size=4", "algo.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "train.threads=1"]
    if env == "guess_number_tools":
        sets.append(f"task.options.renderer={TOOLS_RENDERER}")
    result = CliRunner().invoke(app, ["train", str(ROOT / "recipes" / "verifiers_grpo.toml"), "--out", str(out),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    rl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in rl if m.get("phase") == "rl"]
    episodes = read_transcripts(out / "episodes.jsonl")
    assert [m["step"] for m in rl] == [1, 2] and [s for s, _ in episodes] == [1] * 4 + [2] * 4
    assert len(bounds) == 2
    for m, bound in zip(rl, bounds, strict=True):
        assert m["episode/end/error"] == 0.0  # every episode played to its end by verifiers
        assert m["rollout/logprob_gap_max"] <= bound  # the trained tokens are the ones the policy sampled
        assert m["rollout/len_mean"] > 0 and math.isfinite(m["loss/policy"]) and math.isfinite(m["grad_norm"])
        assert m["reward/mean"] == pytest.approx(sum(r.reward for s, r in episodes if s == m["step"]) / 4)
    for _, r in episodes:
        # the env's own game loop: the prompt, then the player's guesses and the game's answers in turn
        assert r.messages[0]["role"] == "user" and r.messages[0]["content"].startswith("guess 1-3=")
        replies = [(m["content"] or "").strip() for m in r.messages if m["role"] == "assistant"]
        assert 1 <= len(replies) <= 3
        assert r.reward == float(r.verdict.details["rewards"] == {"solved": 1.0})
        assert r.verdict.details["rewards"]["solved"] in (0.0, 1.0)
