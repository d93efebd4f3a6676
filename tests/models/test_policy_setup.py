"""setup_policy: gradient checkpointing keeps the fast decoder and the gradients; LoRA errors are clear."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from feedbackrl.config import build_config
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.logprobs import fast_path_ok, sequence_logprobs, train_fast_path_ok
from feedbackrl.models.lora import LoRAError
from feedbackrl.models.policy import setup_policy
from feedbackrl.rollout.generate import generate


def _grads(model, tok) -> dict[str, torch.Tensor]:
    ro = generate(model, tok, ["12+3=", "7+85=", "1+1="], 5, generator=torch.Generator().manual_seed(0))
    model.train()
    lp, _ = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    lp.sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_keeps_the_fast_decoder_and_the_gradients(tiny_model_dir: Path):
    tok = load_tokenizer(str(tiny_model_dir))
    plain = load_policy(str(tiny_model_dir))
    cfg = build_config({"train": {"gradient_checkpointing": True}})
    ckpt = setup_policy(load_policy(str(tiny_model_dir)), cfg.lora, cfg.train)
    assert fast_path_ok(ckpt) and not train_fast_path_ok(ckpt)  # decoding fast, training through HF's forward
    want, got = _grads(plain, tok), _grads(ckpt, tok)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_adapter_whose_base_is_gone_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path):
    pytest.importorskip("peft")
    base = shutil.copytree(tiny_model_dir, tmp_path / "base")
    cfg = build_config({"lora": {"rank": 2}})
    model = setup_policy(load_policy(str(base)), cfg.lora, cfg.train)
    model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str(base)
    shutil.rmtree(base)
    with pytest.raises(LoRAError, match=r"adapter .* is for the base model .*base.*, which cannot be loaded"):
        load_policy(str(tmp_path / "adapter"))
