"""`train.micro_batch_size`: gradient accumulation over chunks of a minibatch gives the minibatch's gradient."""

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import feedbackrl.train.grpo as online
from feedbackrl.config import ConfigError, build_config
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict


@dataclass
class DigitShare(AdditionTask):
    """Partial credit (share of digits in the completion): rewards differ within a group, advantages are live."""

    def sample(self, rng: random.Random) -> Problem:
        return AdditionTask(digits=rng.choice([1, 2])).sample(rng)  # prompts of two lengths: left padding

    def verify(self, problem: Problem, completion: str) -> Verdict:
        score = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return Verdict(score, score == 1.0, "")


def first_update(model_dir: Path, out: Path, monkeypatch, micro: int, aggregation: str):
    """Gradients of the first optimizer step, and step 1's metrics."""
    grads: list[list[torch.Tensor]] = []
    make = online.make_optimizer

    def recording(model, cfg):
        opt = make(model, cfg)
        step = opt.step

        def record(*a, **k):
            grads.append([p.grad.clone() for p in model.parameters()])
            return step(*a, **k)

        opt.step = record
        return opt

    monkeypatch.setattr(online, "make_optimizer", recording)
    cfg = build_config({
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "algo": {"steps": 1, "epochs": 2, "minibatches": 2, "kl_coef": 0.1, "lr": 1e-2, "aggregation": aggregation},
        "train": {"seed": 5, "micro_batch_size": micro},
    })
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    rows = MemorySink()
    online.train_grpo(cfg, model, tokenizer, DigitShare(), out, rows)
    return grads[0], rows.by_step[1]


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "fixed_length_sum"])
def test_accumulated_gradient_equals_the_full_batch_gradient(tiny_model_dir, tmp_path, monkeypatch, aggregation):
    full, full_metrics = first_update(tiny_model_dir, tmp_path / "full", monkeypatch, 0, aggregation)
    acc, acc_metrics = first_update(tiny_model_dir, tmp_path / "micro", monkeypatch, 3, aggregation)  # 3+3+2
    assert max(g.abs().max().item() for g in full) > 1e-4  # the gradient is not trivially zero
    for a, b in zip(acc, full, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the same rollout and stats over whole minibatches: the step's metrics agree too (to the rounding that
    # Adam's first update amplifies: they average all four updates, and lr is large)
    assert acc_metrics["reward/mean"] == full_metrics["reward/mean"]
    for key in ("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "clip_frac"):
        assert acc_metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


def test_micro_batch_size_is_validated():
    with pytest.raises(ConfigError, match="micro_batch_size"):
        build_config({"train": {"micro_batch_size": -1}})
    assert build_config({}).train.micro_batch_size == 0
