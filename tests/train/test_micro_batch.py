"""`train.micro_batch_size`: gradient accumulation over chunks of a minibatch gives the minibatch's gradient."""

import math
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fp32 import U, assert_within, probabilistic_gamma, reduction_length

import feedbackrl.train.grpo as online
import feedbackrl.train.onpolicy as loop
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


GROUP_SIZE, KL_COEF = 4, 0.1


def first_update(model_dir: Path, out: Path, monkeypatch, micro: int, aggregation: str):
    """Gradients of the first optimizer step, step 1's metrics, and the first step's training forwards: for each
    (micro-)batch its `sequence_logprobs` arguments, log-probs and the loss's gradient w.r.t. them (`w`)."""
    grads: list[list[torch.Tensor]] = []
    forwards: list[dict] = []
    make = loop.make_optimizer  # the one on-policy loop builds the optimizer
    real_logprobs = online.sequence_logprobs

    def spying(model, *args, **kwargs):
        logprobs, entropy = real_logprobs(model, *args, **kwargs)
        if logprobs.requires_grad and not grads:  # a training forward before the first optimizer step
            rec = {"args": [a.clone() for a in args[:4]], "temperature": args[4], "logprobs": logprobs.detach()}
            logprobs.register_hook(lambda g, rec=rec: rec.__setitem__("w", g.clone()))
            forwards.append(rec)
        return logprobs, entropy

    def recording(model, cfg, modules=None):
        opt = make(model, cfg, modules)
        step = opt.step

        def record(*a, **k):
            grads.append([p.grad.clone() for p in model.parameters()])
            return step(*a, **k)

        opt.step = record
        return opt

    monkeypatch.setattr(loop, "make_optimizer", recording)
    monkeypatch.setattr(online, "sequence_logprobs", spying)
    cfg = build_config({
        "rollout": {"prompts_per_step": 4, "group_size": GROUP_SIZE, "max_new_tokens": 6},
        "algo": {"steps": 1, "epochs": 2, "minibatches": 2, "kl_coef": KL_COEF, "lr": 1e-2,
                 "aggregation": aggregation},
        "train": {"seed": 5, "micro_batch_size": micro},
    })
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    rows = MemorySink()
    online.train_grpo(cfg, model, tokenizer, DigitShare(), out, rows)
    assert forwards and all("w" in rec for rec in forwards)
    return grads[0], rows.by_step[1], forwards


def float64_gradient(model_dir: Path, forwards: list[dict], max_grad_norm: float = 1.0):
    """The first update's gradient in float64, J^T w (J: the log-probs' Jacobian in float64 at the run's initial
    weights, w: the run's own loss gradient w.r.t. its log-probs), clipped as the loop clips it, and an elementwise
    bound on a float32 run's error.

    A parameter's gradient is a sum over the minibatch's tokens of w_t times the gradient of log-prob t, each of
    which has gone through the forward's chain of sums and the backward's (as long again). As in
    `decoder_logprob_tolerance` (tests/fp32.py), the error is probabilistic_gamma(n) times the terms in magnitude,
    sum_t |w_t| |grad log-prob_t|, n = twice the decoder's reduction length plus the number of tokens summed;
    whether they are summed in one batch or over micro-batches and `.grad` accumulation changes only the order.
    The clipping factor adds the error of the norm, a sum over every parameter element, and three roundings.
    """
    model64 = load_policy(str(model_dir)).double().train()
    params = list(model64.parameters())
    truth = [torch.zeros_like(p) for p in params]
    scale = [torch.zeros_like(p) for p in params]
    tokens, length = 0, 0
    for rec in forwards:
        logprobs, _ = real_sequence_logprobs(model64, *rec["args"], rec["temperature"])
        w = rec["w"].double()
        for acc, g in zip(truth, torch.autograd.grad((logprobs * w).sum(), params, retain_graph=True), strict=True):
            acc += g
        for r, t in w.nonzero().tolist():
            for acc, g in zip(scale, torch.autograd.grad(logprobs[r, t], params, retain_graph=True), strict=True):
                acc += abs(w[r, t].item()) * g.abs()
        tokens += int(w.ne(0).sum())
        length = rec["args"][0].shape[1] + rec["args"][2].shape[1]
    norm = math.sqrt(sum(float((g * g).sum()) for g in truth))
    clip = min(1.0, max_grad_norm / (norm + 1e-6))
    n = 2 * reduction_length(model64.config, length) + tokens
    clip_err = probabilistic_gamma(sum(p.numel() for p in params)) + 3 * U if clip < 1 else 0.0
    bounds = [probabilistic_gamma(n) * clip * s + clip_err * clip * g.abs() for g, s in zip(truth, scale, strict=True)]
    return [clip * g for g in truth], bounds


real_sequence_logprobs = online.sequence_logprobs


def assert_same_upstream_gradient(full: list[dict], acc: list[dict]) -> None:
    """The loss's gradient w.r.t. each token's log-prob is the same whether the minibatch runs whole or in
    micro-batches (the normalisers are the whole minibatch's), up to what the log-probs' own rounding moves it.

    w_t = c_t (-A ratio_t + kl_coef (1 - exp(ref_t - lp_t))), c_t the aggregation's weight of token t (at most
    max(1 / num_tokens, 1 / num_sequences)), |A| <= sqrt(G) for group-normalised advantages; ratio and reference are
    exp(rounding) from 1 at the first update (the same weights). A change dlp of the log-prob moves w_t by at most
    c_max (sqrt(G) + kl_coef) (1 + 1e-3) |dlp|, plus w's own few roundings. A wrong normaliser moves it by a factor.
    """
    (whole,) = full
    w_acc, lp_acc = torch.cat([r["w"] for r in acc]), torch.cat([r["logprobs"] for r in acc])
    for i in range(4):  # the same rows, in order: prompt ids and mask, completion ids and mask
        assert torch.equal(torch.cat([r["args"][i] for r in acc]), whole["args"][i]), i
    mask = whole["args"][3]
    c_max = max(1 / max(float(mask.sum()), 1.0), 1 / mask.shape[0])
    d_lp = (lp_acc.double() - whole["logprobs"].double()).abs()
    bound = c_max * (math.sqrt(GROUP_SIZE) + KL_COEF) * (1 + 1e-3) * d_lp + 8 * U * whole["w"].double().abs()
    assert_within(w_acc, whole["w"].double(), bound, "loss gradient w.r.t. the log-probs")


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "fixed_length_sum"])
def test_accumulated_gradient_equals_the_full_batch_gradient(tiny_model_dir, tmp_path, monkeypatch, aggregation):
    full, full_metrics, full_fwd = first_update(tiny_model_dir, tmp_path / "full", monkeypatch, 0, aggregation)
    acc, acc_metrics, acc_fwd = first_update(tiny_model_dir, tmp_path / "micro", monkeypatch, 3, aggregation)
    assert [len(r["w"]) for r in acc_fwd] == [3, 3, 2] and len(full_fwd) == 1
    assert max(g.abs().max().item() for g in full) > 1e-4  # the gradient is not trivially zero
    # the same upstream gradient on every token, and each run's float32 parameter gradient within float32
    # rounding of the float64 gradient J^T w: accumulation sums the same terms in another order
    assert_same_upstream_gradient(full_fwd, acc_fwd)
    for name, got, fwd in (("full batch", full, full_fwd), ("accumulated", acc, acc_fwd)):
        truth, bounds = float64_gradient(tiny_model_dir, fwd)
        for i, (g, t, b) in enumerate(zip(got, truth, bounds, strict=True)):
            assert b.max() < 1e-2 * t.abs().max() + 1e-12, (name, i)  # far below the gradient itself
            assert_within(g, t, b, f"{name} gradient of parameter {i}")
    # the same rollout and stats over whole minibatches: the step's metrics agree too (to the rounding that
    # Adam's first update amplifies: they average all four updates, and lr is large)
    assert acc_metrics["reward/mean"] == full_metrics["reward/mean"]
    for key in ("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "clip_frac"):
        assert acc_metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


def test_micro_batch_size_is_validated():
    with pytest.raises(ConfigError, match="micro_batch_size"):
        build_config({"train": {"micro_batch_size": -1}})
    assert build_config({}).train.micro_batch_size == 0
