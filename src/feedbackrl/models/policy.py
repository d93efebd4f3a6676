"""Turning a loaded model into the policy a run trains: LoRA adapters, gradient checkpointing, and the
precision of the training forward (`[lora]`, `train.gradient_checkpointing`, `train.precision`).

bf16 here is autocast with float32 master weights: the weights, their gradients and the optimizer state
stay float32 and only the matmuls run in bf16. Pure bf16 weights lose the updates: an AdamW step of
lr ~1e-5 is below half an ulp of a bf16 weight of magnitude ~0.03 (ulp 2^-13 ~ 1.2e-4), so it rounds
away and the run looks like training while learning almost nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedModel

from feedbackrl.models.lora import apply_lora, is_lora


class PrecisionError(ValueError):
    """A precision the device cannot run."""


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_precision(precision: str, device: torch.device) -> None:
    if precision == "bf16" and not bf16_supported(device):
        raise PrecisionError(f"train.precision = 'bf16' but this {device.type} has no bf16 support "
                             "(on a CPU: AVX512-BF16 or AMX); use 'fp32'")


@contextlib.contextmanager
def train_autocast(precision: str, device: torch.device) -> Iterator[None]:
    """The training forward's precision: fp32 as is, bf16 under autocast (float32 weights and gradients)."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device.type, dtype=torch.bfloat16):
        yield


def setup_policy(model: PreTrainedModel, lora: Any, train: Any) -> PreTrainedModel:
    """Apply `[lora]` (rank > 0) and `train.gradient_checkpointing`; check `train.precision`. Returns the policy.

    Call once on a freshly loaded model, before building the optimizer; a model loaded from an adapter
    checkpoint already carries its adapters and only gets the checkpointing.
    """
    check_precision(train.precision, model.device)
    if lora.rank and not is_lora(model):
        model = apply_lora(model, lora, seed=train.seed)
    if train.gradient_checkpointing:
        # non-reentrant checkpointing needs no input-grad hook; the fast decoder ignores that hook anyway
        # transformers 5.2x renamed gradient_checkpointing_enable (now a deprecated alias) to activation_...
        kwargs = {"use_reentrant": False}
        if hasattr(type(model), "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model
