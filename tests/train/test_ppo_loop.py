"""PPO in the one on-policy loop gets what GRPO gets: micro-batches (gradient accumulation equal to the whole
minibatch's gradient within float32 rounding), bf16 autocast, train.save_optimizer, episodes with transcripts and
turn credit, and the capability checks that refuse what it does not run with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fp32 import assert_within, probabilistic_gamma, reduction_length
from test_checkpoint_resume import ShapedAddition  # same directory
from test_micro_batch import DigitShare

import feedbackrl.train.onpolicy as onpolicy
from feedbackrl.algos.ppo import gae, kl_penalised_rewards, whiten
from feedbackrl.config import ConfigError, build_config
from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.episodes.contracts import Batch
from feedbackrl.episodes.multi_turn import read_transcripts
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.policy import bf16_supported
from feedbackrl.models.tiny import build_model
from feedbackrl.train.checkpoint import latest_checkpoint, load_trainer_state
from feedbackrl.train.onpolicy import check_capabilities, train_on_policy
from feedbackrl.train.ppo import PPO, train_ppo


def ppo_config(micro: int = 0, **train):
    # no gradient clipping in effect (a scale of exactly 1): the recorded gradients are the loss's
    return build_config({
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6},
        "algo": {"name": "ppo", "steps": 1, "epochs": 2, "minibatches": 2, "kl_coef": 0.1, "lr": 1e-2,
                 "max_grad_norm": 1e9},
        "train": {"seed": 5, "micro_batch_size": micro, **train},
    })


def first_update(model_dir: Path, out: Path, monkeypatch, micro: int):
    """The first optimizer step's gradients (policy and value head), step 1's metrics, the sizes of the first
    minibatch's micro-batches, and what the float64 check needs: the objective, the first minibatch's rows."""
    grads: list[list[torch.Tensor]] = []
    make = onpolicy.make_optimizer

    def recording(model, cfg, modules=None):
        opt = make(model, cfg, modules)
        step = opt.step

        def record(*a, **k):
            if not grads:
                grads.append([p.grad.clone() for g in opt.param_groups for p in g["params"]])
            return step(*a, **k)

        opt.step = record
        return opt

    monkeypatch.setattr(onpolicy, "make_optimizer", recording)
    cfg = ppo_config(micro)
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    objective = PPO.build(cfg, model)
    calls: list[tuple] = []
    loss = objective.loss

    def recorded_loss(model, mb, rows, norm, kl_coef):
        if len(calls) < 8 and (not calls or calls[-1][3] == norm):  # the first minibatch's micro-batches
            calls.append(([t.clone() for t in mb], {k: v.clone() for k, v in rows.items()}, kl_coef, norm))
        return loss(model, mb, rows, norm, kl_coef)

    objective.loss = recorded_loss
    rows = MemorySink()
    train_on_policy(cfg, objective, model, tokenizer, DigitShare(), out, rows)
    return grads[0], rows.by_step[1], calls


def float64_gradients(model_dir: Path, cfg, calls):
    """The first minibatch's gradient in float64, row by row: (the gradient, the sum of the rows' absolute
    gradients), for every parameter the optimizer holds (policy, then value head)."""
    model = load_policy(str(model_dir)).double()
    objective = PPO.build(cfg, model)
    objective.value_head.double()
    params = [p for p in model.parameters() if p.requires_grad] + list(objective.value_head.parameters())
    total = [torch.zeros_like(p) for p in params]
    magnitude = [torch.zeros_like(p) for p in params]
    for mb, rows, kl_coef, norm in calls:
        for r in range(mb[0].shape[0]):
            row_rows = {k: v[r:r + 1].double() for k, v in rows.items()}
            model.zero_grad(set_to_none=True)
            objective.value_head.zero_grad(set_to_none=True)
            objective.loss(model, [t[r:r + 1] for t in mb], row_rows, norm, kl_coef).loss.backward()
            for t, m, p in zip(total, magnitude, params, strict=True):
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                t += g
                m += g.abs()
    return total, magnitude, model.config, mb[0].shape[1] + mb[2].shape[1], sum(len(c[0][0]) for c in calls)


def test_ppo_micro_batches_give_the_whole_minibatch_gradient(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    full, full_metrics, full_calls = first_update(tiny_model_dir, tmp_path / "full", monkeypatch, 0)
    acc, acc_metrics, acc_calls = first_update(tiny_model_dir, tmp_path / "micro", monkeypatch, 3)
    assert [len(c[0][0]) for c in full_calls] == [8] and [len(c[0][0]) for c in acc_calls] == [3, 3, 2]
    truth, magnitude, config, seq_len, rows = float64_gradients(tiny_model_dir, ppo_config(), full_calls)
    assert max(g.abs().max().item() for g in truth) > 1e-3  # the gradient is not trivially zero
    # each float32 gradient element is a sum over the rows' contributions, each the end of a chain of float32
    # sums (forward and backward through the decoder): within probabilistic_gamma(n) of the sum of the rows'
    # absolute contributions, n = both chains' reduction lengths plus the rows' tokens (tests/fp32.py)
    n = 2 * reduction_length(config, seq_len) + rows * seq_len
    for name, side in (("whole minibatch", full), ("micro-batches", acc)):
        for got, want, mag in zip(side, truth, magnitude, strict=True):
            assert_within(got, want, probabilistic_gamma(n) * mag + 1e-30, name)
    # the bound can fail: a loop that dropped the last micro-batch (2 rows) would be outside it
    last, _, _, _, _ = float64_gradients(tiny_model_dir, ppo_config(), acc_calls[-1:])
    assert max(((g.abs() - probabilistic_gamma(n) * m).max().item() for g, m in zip(last, magnitude, strict=True))) > 0
    # the same rollout, and statistics over whole minibatches
    assert acc_metrics["reward/mean"] == full_metrics["reward/mean"]
    assert acc_metrics["kl/mean"] == full_metrics["kl/mean"]
    for key in ("loss/policy", "loss/value", "entropy/mean", "value/mean", "policy/approx_kl"):
        assert acc_metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


needs_bf16 = pytest.mark.skipif(not bf16_supported(torch.device("cpu")), reason="this CPU has no bf16 support")


@needs_bf16
def test_ppo_bf16_autocast_updates_match_fp32(tiny_model_dir: Path, tmp_path: Path):
    def one_step(precision: str):
        cfg = build_config({"rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
                            "algo": {"name": "ppo", "steps": 1, "epochs": 1, "minibatches": 1, "lr": 1e-3},
                            "train": {"seed": 3, "precision": precision}})
        model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        train_ppo(cfg, model, tok, ShapedAddition(), tmp_path / precision, MemorySink())
        return before, {k: v.clone() for k, v in model.state_dict().items()}

    before, fp32 = one_step("fp32")
    _, bf16 = one_step("bf16")
    assert all(v.dtype == torch.float32 for v in bf16.values())  # master weights stay float32
    d32 = torch.cat([(fp32[k] - before[k]).flatten() for k in before])
    d16 = torch.cat([(bf16[k] - before[k]).flatten() for k in before])
    cos = torch.nn.functional.cosine_similarity(d32, d16, dim=0).item()
    ratio = (d16.norm() / d32.norm()).item()
    assert cos > 0.98 and 0.98 < ratio < 1.02, f"cosine {cos:.4f}, norm ratio {ratio:.4f}"


def test_ppo_honours_save_optimizer(tiny_model_dir: Path, tmp_path: Path):
    for keep in (True, False):
        cfg = ppo_config(save_optimizer=keep)
        model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
        train_ppo(cfg, model, tok, ShapedAddition(), tmp_path / str(keep), MemorySink())
        ckpt = latest_checkpoint(tmp_path / str(keep))
        assert (load_trainer_state(ckpt).optimizer is not None) is keep
        assert (ckpt / "value_head.pt").is_file()


def test_ppo_on_episodes_writes_transcripts(tokenizer, tmp_path: Path):
    cfg = build_config({"task": {"name": "calculator_addition"}, "rollout": {"prompts_per_step": 2, "group_size": 2},
                        "algo": {"name": "ppo", "steps": 2, "lr": 1e-3, "minibatches": 1}})
    sink = MemorySink()
    train_ppo(cfg, build_model(tokenizer, "tiny", seed=0), tokenizer, CalculatorAdditionTask(), tmp_path, sink)
    back = read_transcripts(tmp_path / "episodes.jsonl")
    assert [s for s, _ in back] == [1] * 4 + [2] * 4  # every episode of both steps
    for step in (1, 2):
        assert sink.by_step[step]["episode/success_rate"] == sum(r.verdict.passed for s, r in back if s == step) / 4


def test_ppo_adds_turn_credit_to_gae_before_whitening(tiny_model_dir: Path):
    cfg = ppo_config()
    model = load_policy(str(tiny_model_dir))
    objective = PPO.build(cfg, model)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    turn = torch.tensor([[0.5, 0.5, -1.0], [0.0, 2.0, 0.0]])
    old_lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.1, 0.0]])
    batch = Batch([], torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(2, 3), mask, ["", ""], [],
                  torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.bool), turn_advantages=turn)

    def rollout_pass(fn):  # the loop's no-grad pass, given: old log-probs, values, entropy
        return old_lp, values, torch.zeros(2, 3)

    got = objective.prepare(batch, model, rollout_pass, None, kl_coef=0.1)
    a = cfg.algo
    want, returns = gae(kl_penalised_rewards(batch.rewards, old_lp, old_lp, mask, 0.1), values, mask, a.gamma, a.lam)
    assert torch.equal(got["advantages"], whiten(want + turn, mask))
    assert torch.equal(got["returns"], returns)  # the value targets are GAE's, without the turn credit
    assert batch.metrics["kl/mean"] == 0.0  # no reference: the rollout policy is its own


@pytest.mark.parametrize(("section", "message"), [
    ({"rollout": {"backend": "vllm"}}, "rollout.backend = 'vllm': algo.name = 'ppo' does not run with it so far"),
    ({"scale": {"rollout_workers": 1}}, "scale.rollout_workers / scale.reward_workers: algo.name = 'ppo'"),
])
def test_what_ppo_does_not_run_with_is_refused_naming_it(section, message):
    cfg = build_config({"algo": {"name": "ppo"}, **section})
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_capabilities(cfg, "ppo", PPO.capabilities, world=1)
    with pytest.raises(ConfigError, match="torchrun"):
        check_capabilities(build_config({"algo": {"name": "ppo"}}), "ppo", PPO.capabilities, world=2)
    check_capabilities(build_config({"algo": {"name": "ppo"}}), "ppo", PPO.capabilities, world=1)  # plain: runs
