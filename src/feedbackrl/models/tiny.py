"""Tiny causal LMs built locally, in Hugging Face format, so everything runs without a download.

The tokenizer is character level (one token per character, spaces included), built with the
`tokenizers` library and wrapped in `PreTrainedTokenizerFast`; the model is a randomly
initialised `LlamaForCausalLM`. Both are written with `save_pretrained`, so
`AutoTokenizer.from_pretrained(dir)` / `AutoModelForCausalLM.from_pretrained(dir)` reload them
exactly like any hub model.

Why Llama rather than Qwen2: with transformers 5.x, `AutoTokenizer` on a directory whose config
says `qwen2` rebuilds a byte-level BPE tokenizer over our vocabulary and silently drops spaces.
`llama` keeps the saved tokenizer as is; `check_roundtrip` guards this.

The sizes match the TRL CPU baseline scripts that benchmarks/ compares against, so benchmarks
compare like with like.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=512),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                  intermediate_size=1536),
}


def char_vocab() -> dict[str, int]:
    """Specials, digits, arithmetic symbols, letters and punctuation: 82 entries."""
    chars = [PAD, BOS, EOS, UNK, *string.digits, *"+-*=/ ", *string.ascii_lowercase,
             *string.ascii_uppercase, *".,:;?!'()\n"]
    return {c: i for i, c in enumerate(dict.fromkeys(chars))}


def build_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per char
    tok.decoder = decoders.Fuse()  # join characters back with no separator
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        padding_side="left", model_max_length=512,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, size: str = "tiny", seed: int = 0) -> LlamaForCausalLM:
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, use_cache=True, **SIZES[size],
    )
    model = LlamaForCausalLM(cfg)
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = (
        tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
    return model


def check_roundtrip(tokenizer: PreTrainedTokenizerFast, texts: tuple[str, ...] = ("12+35=47", "a b, C!")) -> None:
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids)
        if back != text or len(ids) != len(text):
            raise RuntimeError(f"tokenizer round trip failed: {text!r} -> {ids} -> {back!r}")


def make_tiny(out: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Build and save a tiny model + tokenizer to `out`; returns the directory."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    check_roundtrip(tok)
    model = build_model(tok, size, seed)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    return out
