"""LoRA runs: adapters train, a run resumes bit-exactly from an adapter checkpoint, the checkpoint
evaluates and exports (merged or not), and the fast decoder decodes with the adapters merged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from fp32 import assert_logits_within_fp32, assert_logprobs_within_fp32
from test_checkpoint_resume import ShapedAddition, assert_same_parameters  # same directory
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import RunConfig, build_config
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.logprobs import fast_path_ok, sequence_logprobs, train_fast_path_ok
from feedbackrl.models.lora import export_model, is_lora
from feedbackrl.models.policy import setup_policy
from feedbackrl.rollout import generate as generate_mod
from feedbackrl.rollout.generate import generate
from feedbackrl.train.checkpoint import load_trainer_state, resolve_resume
from feedbackrl.train.grpo import train_grpo

pytest.importorskip("peft", reason="the lora extra is not installed")


def config(steps: int) -> RunConfig:
    # kl_coef > 0: the reference is the base with adapters disabled; 2 epochs x 2 minibatches: old log-probs
    return build_config({
        "lora": {"rank": 4, "alpha": 8},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "algo": {"steps": steps, "epochs": 2, "minibatches": 2, "kl_coef": 0.1, "lr": 3e-2},
        "train": {"seed": 3, "checkpoint_every": 2},
    })


def train(model_dir: Path, out: Path, steps: int, sink, resume_from: Path | None = None):
    cfg = config(steps)
    model = setup_policy(load_policy(str(model_dir)), cfg.lora, cfg.train)
    train_grpo(cfg, model, load_tokenizer(str(model_dir)), ShapedAddition(), out, sink, resume_from=resume_from)
    return model


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory):
    full, half = tmp_path_factory.mktemp("lora_full"), tmp_path_factory.mktemp("lora_half")
    rows = MemorySink()
    model = train(tiny_model_dir, full, 4, rows)
    train(tiny_model_dir, half, 2, MemorySink())
    return {k: v.clone() for k, v in model.state_dict().items()}, rows.by_step, full, half


def test_a_lora_run_trains_the_adapters_only(runs, tiny_model_dir):
    want, rows, full, _ = runs
    base = load_policy(str(tiny_model_dir)).state_dict()
    lora_keys = [k for k in want if "lora_" in k]
    assert lora_keys and all(k.replace("base_model.model.", "").replace(".base_layer", "") in base
                             for k in want if "lora_" not in k)
    moved = max((want[k] - 0).abs().max().item() for k in lora_keys if "lora_B" in k)  # B starts at zero
    assert moved > 1e-3, moved
    for k, v in want.items():
        if "lora_" not in k:
            assert torch.equal(v, base[k.replace("base_model.model.", "").replace(".base_layer", "")]), k
    assert all(rows[s]["kl/mean"] > 0 for s in (2, 3, 4)), rows  # the adapters-off reference differs from the policy
    ckpt = full / "checkpoints" / "step_000004"
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "config.json").exists()
    assert not (full / "reference").exists()  # no second copy of the weights
    n_trainable = sum(v.numel() for k, v in want.items() if "lora_" in k)
    assert sum(t.numel() for s in load_trainer_state(ckpt).optimizer["state"].values()
               for t in s.values() if t.dim()) == 2 * n_trainable  # AdamW moments for the adapters only


def test_a_lora_run_resumes_bit_exactly(runs, tmp_path):
    want, full_rows, _, half = runs
    run = shutil.copytree(half, tmp_path / "run")
    ckpt = resolve_resume(run)
    assert ckpt.name == "step_000002"
    torch.manual_seed(12345)
    rows = MemorySink()
    model = train(ckpt, run, 4, rows, resume_from=ckpt)  # base + adapters reloaded from the checkpoint
    assert is_lora(model)
    assert_same_parameters(model.state_dict(), want)
    for step in (3, 4):
        assert rows.by_step[step]["loss/policy"] == full_rows[step]["loss/policy"]


def test_the_fast_decoder_merges_the_adapters(runs, monkeypatch):
    _, _, full, _ = runs
    model = load_policy(str(full / "checkpoints" / "step_000004"))
    tok = load_tokenizer(str(full / "checkpoints" / "step_000004"))
    assert fast_path_ok(model) and not train_fast_path_ok(model)
    prompts = ["12+3=", "7+85=", "1+1=", "99+99="]
    fast = generate(model, tok, prompts, 6, greedy=True)
    # the same greedy tokens and log-probs as peft's own forward (adapters applied per layer)
    gen = torch.Generator().manual_seed(0)
    ro = generate(model, tok, prompts * 2, 6, temperature=1.0, generator=gen)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, *(ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask))
    # the decoder's float32 weights with the adapters merged and peft's per-layer adapters: each within float32
    # rounding of the adapters merged in float64 (tests/fp32.py)
    assert_logprobs_within_fp32(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                {"fast decoder": ro.logprobs, "peft forward": lp})
    monkeypatch.setattr(generate_mod, "fast_path_ok", lambda m: False)  # peft's forward, through HF's decoder
    slow = generate(model, tok, prompts, 6, greedy=True)
    assert torch.equal(fast.completion_ids, slow.completion_ids)


def test_the_adapter_checkpoint_evaluates_and_exports(runs, tmp_path):
    _, _, full, _ = runs
    ckpt = full / "checkpoints" / "step_000004"
    res = CliRunner().invoke(app, ["eval", str(ckpt), "--set", "task.heldout_size=8", "--set", "eval.pass_k=2",
                                   "--set", "rollout.max_new_tokens=4", "--set", "train.threads=1"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.output[res.output.index("{"):])
    assert result["n"] == 8 and 0.0 <= result["accuracy"] <= 1.0
    model, tok = load_policy(str(ckpt)), load_tokenizer(str(ckpt))
    merged = load_policy(str(export_model(model, tok, tmp_path / "merged", merged=True)))
    adapter = load_policy(str(export_model(load_policy(str(ckpt)), tok, tmp_path / "adapter", merged=False)))
    assert not is_lora(merged) and is_lora(adapter)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        got, want = merged(ids).logits, model(ids).logits
        assert torch.equal(adapter(ids).logits, want)
    # merged into float32 weights or applied per layer: each within float32 rounding of a float64 merge
    assert_logits_within_fp32(model, ids, {"merged export": got, "adapter checkpoint": want})
