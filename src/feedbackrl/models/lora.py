"""LoRA adapters (Hu et al. 2021, https://arxiv.org/abs/2106.09685) through peft, and what the rest of
feedbackrl needs to keep its fast paths with them.

- `apply_lora(model, cfg)`: wrap a policy with trainable adapters (`[lora]` in a recipe, rank > 0).
- Decoding: the fast decoder copies every weight into its own layout on each call anyway, so it reads
  `effective_weight(linear)` = W + (alpha / r) * B @ A for an adapted layer: the adapters merged into
  the decoder's copy, never into the model (no merge/unmerge rounding drift in W).
- Training runs through peft's forward (base output + the adapter's low-rank path).
- Reference: with `algo.kl_coef > 0` the reference is the base model with the adapters disabled
  (`adapters_disabled`), so no second copy of the weights is kept.
- Checkpoints hold the adapter only (`adapter_config.json`, `adapter_model.safetensors`); `load_adapter_dir`
  loads one onto its base (recorded by path in the adapter config), `export_model` writes it merged or not.

peft is the `lora` extra: importing this module never imports it; `apply_lora` and loading an adapter say
what to install when it is missing.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

ADAPTER_CONFIG = "adapter_config.json"


class LoRAError(ValueError):
    """A LoRA request that cannot be met (peft missing, an adapter dir without its base)."""


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise LoRAError("LoRA needs peft: `pip install 'feedbackrl[lora]'` (or `pip install peft`)") from e
    return peft


def is_lora(model: Any) -> bool:
    """True for a peft model (peft cannot have made one unless it is imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def is_lora_linear(m: nn.Module) -> bool:
    """A peft LoRA layer around an nn.Linear (the layer types the fast decoder can merge)."""
    peft = sys.modules.get("peft")
    return (peft is not None and isinstance(m, peft.tuners.lora.Linear)
            and type(m.get_base_layer()) is nn.Linear and not m.merged and not getattr(m, "lora_variant", {}))


def effective_weight(m: nn.Module) -> Tensor:
    """The (out, in) weight the layer applies in eval mode: W, plus every active adapter's delta for LoRA."""
    if not is_lora_linear(m):
        return m.weight
    w = m.get_base_layer().weight
    if m.disable_adapters:
        return w
    deltas = [m.get_delta_weight(a) for a in m.active_adapters if a in m.lora_A]
    return w + sum(deltas) if deltas else w


def decodable(model: Any) -> PreTrainedModel:
    """The model the decoder reads: the transformers model inside a peft wrapper (LoRA layers in place)."""
    return model.get_base_model() if is_lora(model) else model


def merged_weights(model: Any) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every entry of the model's HF checkpoint, with the weights the policy applies.

    A plain model gives its `state_dict()`. A LoRA model gives the names its base model's checkpoint has
    (`...q_proj.weight`, not peft's `...q_proj.base_layer.weight` and `lora_A`/`lora_B`) with each adapted
    layer's `effective_weight`: what an inference engine that loads HF checkpoints (vLLM) needs to run
    the policy, without merging the adapters into the model.
    """
    base = decodable(model)
    adapted = {name: m for name, m in base.named_modules() if is_lora_linear(m)}
    for name, t in base.state_dict().items():
        owner, sep, leaf = name.partition(".base_layer.")
        if sep:
            name = f"{owner}.{leaf}"
            if leaf == "weight" and owner in adapted:  # else merged into the base weight already
                t = effective_weight(adapted[owner])
        elif any(f".{part}." in name for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
                                                  "lora_magnitude_vector")):
            continue
        yield name, t.detach()


def apply_lora(model: PreTrainedModel, cfg: Any, seed: int = 0) -> PreTrainedModel:
    """`model` with LoRA adapters on `cfg.target_modules` (rank, alpha, dropout from `cfg`, a LoRAConfig).

    Only the adapters train; the base weights are frozen. A draws its init from `seed` (B starts at
    zero, so the policy starts as the base): the same seed gives the same adapters, whatever ran
    before, and the global RNG is left as it was. Returns the peft model.
    """
    peft = _peft()
    lcfg = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, lcfg)


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """Run the base model (the KL reference) with the adapters off; a no-op for a plain model."""
    if not is_lora(model):
        yield
        return
    with model.disable_adapter():
        yield


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def load_adapter_dir(path: Path, load_base: Any, trainable: bool = True) -> PreTrainedModel:
    """An adapter checkpoint on its base model (`load_base(name)` loads the base named in the adapter config)."""
    peft = _peft()
    base_name = peft.PeftConfig.from_pretrained(str(path)).base_model_name_or_path
    if not base_name:
        raise LoRAError(f"adapter {str(path)!r} does not record its base model (base_model_name_or_path)")
    try:
        base = load_base(base_name)
    except ValueError as e:
        raise LoRAError(f"adapter {str(path)!r} is for the base model {base_name!r}, which cannot be loaded: "
                        f"{e}") from e
    return peft.PeftModel.from_pretrained(base, str(path), is_trainable=trainable)


def export_model(model: Any, tokenizer: Any, out: Path, merged: bool) -> Path:
    """Write `model` as a plain HF directory (adapters merged into W) or, for LoRA, as the adapter alone.

    Merging works on a copy: peft's `merge_and_unload` rewrites the model it is given.
    """
    if merged and is_lora(model):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
