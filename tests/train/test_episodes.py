"""The episode runner: masks on the policy's own tokens only, zero gradient on environment
tokens, sampling log-probs equal to the training forward across turns, episode limits and ends,
a broken environment, transcripts round trip, and a GRPO smoke run on the calculator task."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from fp32 import assert_logprobs_within_fp32

import feedbackrl.episodes.multi_turn as runner
from feedbackrl.algos.policy_gradient import clipped_pg_loss
from feedbackrl.config import RolloutConfig, build_config
from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.envs.multi_turn import (
    EpisodeLimits,
    EpisodicTask,
    Message,
    StepResult,
    Turn,
    episode_stats,
    render_plain,
)
from feedbackrl.episodes.kinds import collect
from feedbackrl.episodes.multi_turn import read_transcripts, run_episodes, write_transcripts
from feedbackrl.log import MemorySink
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.models.tiny import build_model
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.grpo import train_grpo


class EchoEnv:
    """Never ends by itself: answers every turn with "seen N", or raises on turn `raise_at`."""

    def __init__(self, problem: Problem, raise_at: int | None) -> None:
        self.problem, self.n, self.raise_at = problem, 0, raise_at

    def reset(self) -> list[Message]:
        return [{"role": "user", "content": self.problem.prompt}]

    def step(self, turn: Turn) -> StepResult:
        self.n += 1
        if self.n == self.raise_at:
            raise RuntimeError("environment bug")
        return StepResult([{"role": "user", "content": f"seen {self.n}"}], False, reward=float(self.n))

    def close(self) -> None:
        return None


@dataclass
class EchoTask(EpisodicTask):
    limits: EpisodeLimits = field(default_factory=lambda: EpisodeLimits(max_turns=3, turn_tokens=5, max_tokens=200))
    raise_at: int | None = None
    tool_call_penalty: float = 0.0
    turn_penalty: float = 0.0
    turn_credit: float = 0.0
    name: str = "echo"

    def sample(self, rng: random.Random) -> Problem:
        return Problem(f"say {rng.randint(0, 9)}:", "")

    def heldout(self, n: int) -> list[Problem]:
        return [Problem(f"say {i % 10}:", "") for i in range(n)]

    def verify(self, problem: Problem, completion: str) -> Verdict:
        return Verdict(0.0, False, "never")

    def make_env(self, problem: Problem) -> EchoEnv:
        return EchoEnv(problem, self.raise_at)

    def render(self, messages: list[Message]) -> str:
        return render_plain(messages)


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(tokenizer, "tiny", seed=0)


def _problems(n: int) -> list[Problem]:
    return EchoTask().heldout(n)


def test_masks_cover_exactly_the_policy_turns(model, tokenizer) -> None:
    task = EchoTask()
    ep = run_episodes(model, tokenizer, task, _problems(6), generator=torch.Generator().manual_seed(0))
    for i, rec in enumerate(ep.records):
        assert rec.end == "out_of_turns" and rec.turns == 3 and rec.turn_rewards == [1.0, 2.0, 3.0]
        assert tokenizer.decode(ep.prompt_ids[i][ep.prompt_mask[i].bool()]) == rec.prompt
        ids, turns = ep.completion_ids[i], ep.token_turn[i]
        assistant = [m["content"] for m in rec.messages if m["role"] == "assistant"]
        for k in range(3):
            toks = ids[turns == k]
            assert 1 <= len(toks) <= task.limits.turn_tokens
            assert tokenizer.decode(toks, skip_special_tokens=True) == assistant[k]
        # everything else before the padding is the environment's text, in order
        real = len(rec.messages)  # prompt + 3 x (turn, observation)
        env_text = tokenizer.decode(ids[(turns < 0) & (ids != tokenizer.pad_token_id)])
        assert env_text == "seen 1\nseen 2\nseen 3\n" and real == 7
        assert torch.equal(ep.completion_mask[i], (turns >= 0).long())


def test_sampling_logprobs_equal_the_training_forward_across_turns(model, tokenizer) -> None:
    ep = run_episodes(model, tokenizer, EchoTask(), _problems(8), generator=torch.Generator().manual_seed(1))
    assert all(r.turns == 3 for r in ep.records)  # three turns each, continued from the exact tokens so far
    lp, _ = sequence_logprobs(model, ep.prompt_ids, ep.prompt_mask, ep.completion_ids, ep.completion_mask)
    # the sampler's and the training forward's float32 log-probs, each within float32 rounding of a float64 run
    assert_logprobs_within_fp32(model, ep.prompt_ids, ep.prompt_mask, ep.completion_ids, ep.completion_mask,
                                {"sampling": ep.logprobs, "training forward": lp})


def test_environment_tokens_get_zero_gradient(model, tokenizer) -> None:
    ep = run_episodes(model, tokenizer, EchoTask(), _problems(4), generator=torch.Generator().manual_seed(2))
    logprobs, _ = sequence_logprobs(model, ep.prompt_ids, ep.prompt_mask, ep.completion_ids, ep.completion_mask)
    logprobs.retain_grad()
    loss, _ = clipped_pg_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0, 0.5, 2.0]),
                              ep.completion_mask.float())
    loss.sum().backward()
    env = (ep.completion_mask == 0)
    assert env.sum() > 0 and torch.count_nonzero(logprobs.grad[env]) == 0
    assert torch.all(logprobs.grad[ep.completion_mask.bool()] != 0)
    model.zero_grad(set_to_none=True)


def test_token_limit_truncates_and_turn_limit_ends(model, tokenizer) -> None:
    task = EchoTask(limits=EpisodeLimits(max_turns=50, turn_tokens=5, max_tokens=14))
    ep = run_episodes(model, tokenizer, task, _problems(5), generator=torch.Generator().manual_seed(3))
    for i, rec in enumerate(ep.records):
        n = int((ep.completion_ids[i] != tokenizer.pad_token_id).sum())
        assert rec.end == "truncated" and n == 14 and not rec.verdict.passed, (rec.end, n)
        assert rec.verdict.reason == "episode ran past 14 tokens"


def test_a_raising_environment_ends_its_episode_only(model, tokenizer) -> None:
    task = EchoTask(raise_at=2)
    ep = run_episodes(model, tokenizer, task, _problems(3), generator=torch.Generator().manual_seed(4))
    for rec in ep.records:
        assert rec.end == "error" and rec.turns == 2 and rec.verdict.score == 0.0
        assert rec.verdict.reason == "environment raised RuntimeError: environment bug"


def test_collect_dispatches_episodes_with_penalties_and_transcripts_round_trip(model, tokenizer,
                                                                                tmp_path: Path) -> None:
    task = CalculatorAdditionTask(tool_call_penalty=0.25, turn_penalty=0.125)
    cfg = RolloutConfig(prompts_per_step=2, group_size=3)
    batch = collect(model, tokenizer, task, None, cfg, random.Random(0), torch.Generator().manual_seed(0))
    assert batch.completion_ids.shape[0] == 6 and batch.episodes is not None and batch.turn_advantages is None
    for rec, r in zip(batch.episodes, batch.rewards.tolist(), strict=True):
        assert r == pytest.approx(rec.verdict.score - 0.25 * rec.tool_calls - 0.125 * rec.turns)
    for key in ("episode/success_rate", "episode/turns_mean", "episode/tool_calls_mean", "episode/tool_error_rate",
                "perf/gen_s", "perf/tool_s", "episode/end/answered"):
        assert key in batch.metrics, key
    path = tmp_path / "episodes.jsonl"
    write_transcripts(path, 1, batch.episodes)
    write_transcripts(path, 2, batch.episodes[:2])
    back = read_transcripts(path)
    assert [s for s, _ in back] == [1] * 6 + [2] * 2
    assert [r.to_dict() for _, r in back] == [r.to_dict() for r in batch.episodes + batch.episodes[:2]]


def test_turn_credit_reaches_the_batch(model, tokenizer) -> None:
    task = EchoTask(turn_credit=0.5)
    batch = collect(model, tokenizer, task, None, RolloutConfig(prompts_per_step=1, group_size=2),
                    random.Random(0), torch.Generator().manual_seed(0))
    # every episode has per-turn rewards 1, 2, 3: equal returns within the group, so no turn credit
    assert batch.turn_advantages is not None and batch.turn_advantages.shape == batch.completion_ids.shape
    assert torch.count_nonzero(batch.turn_advantages) == 0


def test_grpo_smoke_on_episodes_writes_transcripts(tokenizer, tmp_path: Path) -> None:
    cfg = build_config({"task": {"name": "calculator_addition"}, "rollout": {"prompts_per_step": 2, "group_size": 2},
                        "algo": {"steps": 2, "lr": 1e-3}})
    model = build_model(tokenizer, "tiny", seed=0)
    sink = MemorySink()
    train_grpo(cfg, model, tokenizer, CalculatorAdditionTask(), tmp_path, sink)
    back = read_transcripts(tmp_path / "episodes.jsonl")
    assert [s for s, _ in back] == [1] * 4 + [2] * 4  # every episode of both steps
    assert all(r.messages[0]["content"].endswith("=") and r.end in ("answered", "out_of_turns") for _, r in back)
    for step in (1, 2):
        row = sink.by_step[step]
        assert row["episode/success_rate"] == sum(r.verdict.passed for s, r in back if s == step) / 4
        assert row["episode/turns_mean"] == sum(r.turns for s, r in back if s == step) / 4


def test_malformed_calls_are_counted_per_episode(model, tokenizer, monkeypatch) -> None:
    """A turn the format reads as a malformed call (`Turn.error`) counts once per turn in `parse_errors`, and
    `episode/parse_errors_mean` averages them over the episodes."""
    real = runner.turn_format

    class Malformed:
        def __init__(self, fmt) -> None:
            self.fmt, self.name, self.end = fmt, fmt.name, fmt.end

        def __getattr__(self, attr):
            return getattr(self.fmt, attr)

        def parse(self, content: str, conversation) -> Turn:
            return Turn(content, error="malformed tool call: test")

    monkeypatch.setattr(runner, "turn_format", lambda tok, task: Malformed(real(tok, task)))
    task = EchoTask(limits=EpisodeLimits(max_turns=3, turn_tokens=5, max_tokens=200))
    ep = run_episodes(model, tokenizer, task, _problems(4), generator=torch.Generator().manual_seed(5))
    assert [r.parse_errors for r in ep.records] == [r.turns for r in ep.records] == [3] * 4
    assert episode_stats(ep.records)["episode/parse_errors_mean"] == 3.0
