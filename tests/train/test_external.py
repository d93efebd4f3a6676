"""The collect step for external tasks, with a stand-in environment that plays two-turn episodes
against the live policy endpoint (vLLM's token-in/token-out route, as verifiers' training client
calls it): rows split at the policy's first token, the loss mask is the environment's sampled-token
mask, the recorded log-probs equal the training forward's, and the environment's tokens get no gradient."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from transformers import AutoTokenizer  # noqa: E402

from feedbackrl.algos.advantages import group_advantages  # noqa: E402
from feedbackrl.algos.aggregate import token_mean  # noqa: E402
from feedbackrl.algos.policy_gradient import clipped_pg_loss  # noqa: E402
from feedbackrl.config import RolloutConfig  # noqa: E402
from feedbackrl.envs.external import ExternalEpisode, ExternalTask  # noqa: E402
from feedbackrl.envs.multi_turn import EpisodeRecord  # noqa: E402
from feedbackrl.episodes.external import policy_endpoint  # noqa: E402
from feedbackrl.episodes.kinds import collect  # noqa: E402
from feedbackrl.models.chat import MINIMAL_CHAT_TEMPLATE  # noqa: E402
from feedbackrl.models.logprobs import sequence_logprobs  # noqa: E402
from feedbackrl.models.tiny import build_model  # noqa: E402
from feedbackrl.rewards.verdict import Problem, Verdict  # noqa: E402

FEEDBACK = "=ok\n"  # the environment's message between the two turns


@dataclass
class TwoTurnEnv(ExternalTask):
    """Each episode: the policy answers the prompt, the environment says FEEDBACK, the policy answers
    again; reward = (i mod 3)^2 / 10 for the call's i-th episode (no group's advantage is 0)."""

    tokenizer: Any = None
    name: str = "two_turn"
    seen: list[str] = field(default_factory=list)

    def sample(self, rng: random.Random) -> Problem:
        return Problem(f"{rng.choice('abc')}{rng.choice('abc')}=", None, {})

    def heldout(self, n: int) -> list[Problem]:
        return [Problem("ab=", None, {})] * n

    def verify(self, problem: Problem, completion: str) -> Verdict:
        raise NotImplementedError

    def play(self, endpoint: str, tokenizer_dir: str, problems: Sequence[Problem],
             sampling: dict[str, Any]) -> list[ExternalEpisode]:
        self.seen.append(AutoTokenizer.from_pretrained(tokenizer_dir).chat_template)
        out = []
        for i, p in enumerate(problems):
            ids = self.tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
            sampled, lps = [False] * len(ids), [0.0] * len(ids)
            for turn in range(2):
                r = httpx.post(f"{endpoint}/inference/v1/generate", timeout=60,
                               json={"token_ids": ids, "sampling_params": {**sampling, "max_tokens": 4}}).json()
                choice = r["choices"][0]
                ids = ids + choice["token_ids"]
                sampled += [True] * len(choice["token_ids"])
                lps += [c["logprob"] for c in choice["logprobs"]["content"]]
                if turn == 0:
                    obs = self.tokenizer(FEEDBACK, add_special_tokens=False)["input_ids"]
                    ids, sampled, lps = ids + obs, sampled + [False] * len(obs), lps + [0.0] * len(obs)
            reward = (i % 3) ** 2 / 10
            record = EpisodeRecord(prompt=p.prompt, turn_rewards=[0.0, 0.0], end="answered",
                                   verdict=Verdict(reward, False, "stand-in"), reward=reward)
            out.append(ExternalEpisode(ids, sampled, lps, reward, record))
        return out


def test_endpoint_serves_the_model_and_a_tokenizer_with_a_template(tokenizer) -> None:
    model = build_model(tokenizer, "tiny", seed=0)
    with policy_endpoint(model, tokenizer) as (url, tok_dir):
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "policy"
        assert AutoTokenizer.from_pretrained(tok_dir).chat_template == MINIMAL_CHAT_TEMPLATE
    with pytest.raises(httpx.TransportError):  # stopped after the block
        httpx.get(f"{url}/v1/models", timeout=2)


def test_external_episodes_become_rows_with_the_loss_on_policy_tokens_only(tokenizer) -> None:
    model = build_model(tokenizer, "tiny", seed=0)
    task = TwoTurnEnv(tokenizer=tokenizer)
    cfg = RolloutConfig(prompts_per_step=2, group_size=3, max_new_tokens=4, temperature=1.0)
    batch = collect(model, tokenizer, task, None, cfg, random.Random(0), torch.Generator().manual_seed(0))
    assert task.seen == [MINIMAL_CHAT_TEMPLATE]
    assert batch.rewards.tolist() == pytest.approx([0.0, 0.1, 0.4] * 2)
    assert len(batch.episodes) == 6 and batch.metrics["reward/mean"] == pytest.approx(0.5 / 3)
    obs = tokenizer(FEEDBACK, add_special_tokens=False)["input_ids"]
    for i in range(6):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        assert prompt == tokenizer(batch.problems[i].prompt, add_special_tokens=False)["input_ids"]
        comp, mask = batch.completion_ids[i].tolist(), batch.completion_mask[i].tolist()
        first = mask.index(0)  # the first turn's tokens, then the environment's message, unmasked
        assert comp[first:first + len(obs)] == obs and mask[first:first + len(obs)] == [0] * len(obs)
        assert sum(mask) >= 2 and set(mask[:first]) == {1}
    # the log-probs recorded through the endpoint are the training forward's
    assert batch.metrics["rollout/logprob_gap_max"] < 1e-4
    # GRPO's loss: gradient on the policy's tokens, exactly none on the environment's or padding
    logprobs, _ = sequence_logprobs(model, *batch.tensors)
    logprobs.retain_grad()
    mask = batch.completion_mask.float()
    pg, _ = clipped_pg_loss(logprobs, logprobs.detach(), group_advantages(batch.rewards, 3), mask)
    token_mean(pg, mask).backward()
    assert (logprobs.grad[mask == 0] == 0).all() and (logprobs.grad[mask == 1] != 0).all()


def test_a_task_that_returns_too_few_episodes_fails_the_step(tokenizer) -> None:
    class Short(TwoTurnEnv):
        def play(self, endpoint, tokenizer_dir, problems, sampling):
            return super().play(endpoint, tokenizer_dir, problems, sampling)[:-1]

    cfg = RolloutConfig(prompts_per_step=1, group_size=2, max_new_tokens=4)
    with pytest.raises(RuntimeError, match="played 1 episodes for 2 problems"):
        collect(build_model(tokenizer, "tiny", seed=0), tokenizer, Short(tokenizer=tokenizer), None, cfg,
                random.Random(0), torch.Generator().manual_seed(0))


def test_a_task_is_played_by_the_kind_it_declares() -> None:
    """collect, evaluate and the run path look a task's kind up by the name it declares (`Task.kind`), never by
    the methods it has: a task with `play` that declares "single_turn" stays in process, and an `ExternalTask`
    subclass is played by the external kind."""
    from feedbackrl.envs.procedural.addition import AdditionTask
    from feedbackrl.episodes.external import External
    from feedbackrl.episodes.kinds import task_kind
    from feedbackrl.episodes.single_turn import SingleTurn

    assert AdditionTask().kind == "single_turn" and isinstance(task_kind(AdditionTask()), SingleTurn)
    assert TwoTurnEnv().kind == "external" and isinstance(task_kind(TwoTurnEnv()), External)

    class PlaysButSingleTurn(AdditionTask):
        play = TwoTurnEnv.play

    assert isinstance(task_kind(PlaysButSingleTurn()), SingleTurn)
