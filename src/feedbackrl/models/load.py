"""Loading policies: any Hugging Face causal LM directory or hub id, through one path."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.gguf import is_gguf, resolve_gguf
from feedbackrl.models.lora import is_adapter_dir, load_adapter_dir


class ModelLoadError(ValueError):
    """A model path or id that cannot be loaded; the message says why and what to do."""


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def resolve_model_path(name: str) -> str:
    """A local directory must hold a config.json; a .gguf file or packaged model name (see `models/gguf.py`)
    converts once to a cached directory; anything else must look like a hub id."""
    if is_gguf(name):
        return resolve_gguf(name)
    path = Path(name).expanduser()
    if path.is_dir() and is_adapter_dir(path):  # a LoRA checkpoint: adapter + tokenizer, base by path
        return str(path)
    if path.exists():
        if not path.is_dir() or not (path / "config.json").exists():
            raise ModelLoadError(
                f"model path {str(path)!r} exists but is not a Hugging Face model directory "
                "(no config.json). Point model.path at a directory written by save_pretrained, "
                "a .gguf file, or use model.path = \"tiny\" to build a tiny local model.")
        return str(path)
    if not _looks_like_hub_id(name):
        raise ModelLoadError(
            f"model path {name!r} does not exist. Give an existing local directory, a hub id such as "
            "'Qwen/Qwen2.5-0.5B' (needs network access), or \"tiny\" to build a tiny local model.")
    return name


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    src = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(src)
    except Exception as e:  # noqa: BLE001 - a corrupt file fails anywhere in transformers' readers: say which dir
        raise ModelLoadError(f"could not load a tokenizer from {name!r}: {_first_line(e)}") from e
    if tok.pad_token is None:  # many causal LMs ship without one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(name: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A causal LM from a directory, hub id, GGUF file, or LoRA checkpoint (its base + the adapters, trainable)."""
    src = resolve_model_path(name)
    if is_adapter_dir(Path(src)):
        return load_adapter_dir(Path(src), lambda base: load_policy(base, dtype))
    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - a corrupt file fails anywhere in transformers' readers: say which dir
        raise ModelLoadError(
            f"could not load a causal LM from {name!r}: {_first_line(e)}. Without network access only local "
            "directories load.") from e
    return model
