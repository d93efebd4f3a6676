"""`train.skip_zero_advantage`: completions with advantage 0 skip the training forward and backward, and the
update's gradient is the one the whole minibatch gives."""

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fp32 import U

import feedbackrl.train.grpo as online
import feedbackrl.train.onpolicy as loop
from feedbackrl.config import ConfigError, build_config
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict

GROUP_SIZE = 4


@dataclass
class HalfDead(AdditionTask):
    """One-digit prompts score 0 whatever the completion (their groups have advantage 0); two-digit prompts
    score the share of digits in the completion (their advantages are live)."""

    def sample(self, rng: random.Random) -> Problem:
        return AdditionTask(digits=rng.choice([1, 2])).sample(rng)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        if len(problem.prompt) < 5:  # "3+4=" is one-digit
            return Verdict(0.0, False, "")
        score = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return Verdict(score, score == 1.0, "")


def first_update(model_dir: Path, out: Path, monkeypatch, skip: bool):
    """The first optimizer step's gradients, the rows each training forward saw, the advantages, step 1's metrics."""
    grads: list[list[torch.Tensor]] = []
    forwards: list[int] = []
    advantages: list[torch.Tensor] = []
    make, real_logprobs, real_prepare = loop.make_optimizer, online.sequence_logprobs, online.GroupRelative.prepare

    def spying(model, *args, **kwargs):
        logprobs, entropy = real_logprobs(model, *args, **kwargs)
        if logprobs.requires_grad and not grads:
            forwards.append(logprobs.shape[0])
        return logprobs, entropy

    def recording(model, cfg, modules=None):
        opt = make(model, cfg, modules)
        step = opt.step

        def record(*a, **k):
            grads.append([p.grad.clone() for p in model.parameters()])
            return step(*a, **k)

        opt.step = record
        return opt

    def prepare(self, *a, **k):
        out = real_prepare(self, *a, **k)
        advantages.append(out["advantages"].clone())
        return out

    monkeypatch.setattr(loop, "make_optimizer", recording)
    monkeypatch.setattr(online, "sequence_logprobs", spying)
    monkeypatch.setattr(online.GroupRelative, "prepare", prepare)
    cfg = build_config({
        "rollout": {"prompts_per_step": 6, "group_size": GROUP_SIZE, "max_new_tokens": 6},
        "algo": {"steps": 1, "kl_coef": 0.0, "lr": 1e-2},
        "train": {"seed": 3, "micro_batch_size": 4, "skip_zero_advantage": skip},
    })
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    rows = MemorySink()
    online.train_grpo(cfg, model, tokenizer, HalfDead(), out, rows)
    return grads[0], forwards, advantages[0], rows.by_step[1]


def test_skipping_zero_advantage_rows_keeps_the_gradient(tiny_model_dir, tmp_path, monkeypatch):
    full, full_fwd, adv, _ = first_update(tiny_model_dir, tmp_path / "full", monkeypatch, skip=False)
    monkeypatch.undo()
    got, got_fwd, adv_skip, metrics = first_update(tiny_model_dir, tmp_path / "skip", monkeypatch, skip=True)
    assert torch.equal(adv, adv_skip)  # the same rollout
    live = int(adv.ne(0).sum())
    assert 0 < live < len(adv)  # some groups are dead, some live: the seed gives both
    assert sum(full_fwd) == len(adv) and sum(got_fwd) == live  # only the live rows ran forward
    assert max(g.abs().max().item() for g in full) > 1e-4
    # the dead rows add exact zeros; the live rows' terms are the same, computed in other micro-batches (another
    # batch shape for the matmuls) and summed in another order: float32 rounding of the gradient's terms, bounded
    # here by 2^10 unit roundoffs of the largest gradient element
    scale = max(g.abs().max().item() for g in full)
    for i, (g, f) in enumerate(zip(got, full, strict=True)):
        assert (g - f).abs().max().item() <= 2**10 * U * scale, i
    assert "entropy/mean" in metrics and "loss/policy" in metrics


def test_skip_zero_advantage_is_refused_where_it_cannot_run():
    cfg = build_config({"algo": {"name": "ppo"}, "train": {"skip_zero_advantage": True}})
    with pytest.raises(ConfigError, match="train.skip_zero_advantage: algo.name = 'ppo'"):
        loop.check_capabilities(cfg, "ppo", loop.Capabilities(), world=1)
    grpo = build_config({"train": {"skip_zero_advantage": True}})
    loop.check_capabilities(grpo, "grpo", online.GroupRelative.capabilities, world=1)
    with pytest.raises(ConfigError, match="skip_zero_advantage with torchrun"):
        loop.check_capabilities(grpo, "grpo", online.GroupRelative.capabilities, world=2)
    assert build_config({}).train.skip_zero_advantage is False
