"""bf16 autocast with float32 master weights: the updates are those of float32 training within
tolerance, where pure bf16 weights lose most of them to rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_checkpoint_resume import ShapedAddition  # same directory

from feedbackrl.config import build_config
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.policy import PrecisionError, bf16_supported, check_precision, train_autocast
from feedbackrl.train.grpo import train_grpo

needs_bf16 = pytest.mark.skipif(not bf16_supported(torch.device("cpu")), reason="this CPU has no bf16 support")


def one_step(model_dir: Path, out: Path, precision: str) -> tuple[dict, dict]:
    """Parameters before and after one GRPO step (the rollout is float32 in both precisions: the same batch)."""
    cfg = build_config({"rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
                        "algo": {"steps": 1, "lr": 1e-3}, "train": {"seed": 3, "precision": precision}})
    model, tok = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = MemorySink()
    train_grpo(cfg, model, tok, ShapedAddition(), out, rows)
    return before, {k: v.clone() for k, v in model.state_dict().items()}


@needs_bf16
def test_bf16_autocast_updates_match_fp32(tiny_model_dir: Path, tmp_path: Path):
    before, fp32 = one_step(tiny_model_dir, tmp_path / "fp32", "fp32")
    _, bf16 = one_step(tiny_model_dir, tmp_path / "bf16", "bf16")
    assert all(v.dtype == torch.float32 for v in bf16.values())  # master weights stay float32
    d32 = torch.cat([(fp32[k] - before[k]).flatten() for k in before])
    d16 = torch.cat([(bf16[k] - before[k]).flatten() for k in before])
    changed32, changed16 = (d32 != 0).float().mean().item(), (d16 != 0).float().mean().item()
    cos = torch.nn.functional.cosine_similarity(d32, d16, dim=0).item()
    ratio = (d16.norm() / d32.norm()).item()
    # AdamW's first step moves every weight with a gradient by ~lr: bf16 rounding of the gradients only
    # flips the signs of the tiniest ones
    assert changed16 >= 0.98 * changed32 and changed32 > 0.5, (changed32, changed16)
    assert cos > 0.98 and 0.98 < ratio < 1.02, f"cosine {cos:.4f}, norm ratio {ratio:.4f}"


@needs_bf16
def test_pure_bf16_weights_lose_small_updates(tiny_model_dir: Path):
    # the failure the autocast path avoids: an update of 1e-5 on bf16 weights of magnitude ~0.02 rounds away
    model = load_policy(str(tiny_model_dir))
    w32 = model.model.layers[0].mlp.down_proj.weight.detach()
    w16 = w32.to(torch.bfloat16)
    moved16 = ((w16 - 1e-5).float() != w16.float()).float().mean().item()
    moved32 = ((w32 - 1e-5) != w32).float().mean().item()
    assert moved32 == 1.0 and moved16 < 0.2, (moved32, moved16)


def test_fp32_autocast_is_a_no_op_and_unsupported_bf16_is_an_error(monkeypatch):
    with train_autocast("fp32", torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(PrecisionError, match="train.precision = 'bf16' but this cpu has no bf16 support"):
        check_precision("bf16", torch.device("cpu"))
    check_precision("fp32", torch.device("cpu"))
