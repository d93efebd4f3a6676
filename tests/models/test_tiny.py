from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from feedbackrl.models.load import ModelLoadError, load_policy, load_tokenizer
from feedbackrl.models.tiny import EOS, PAD, build_model, build_tokenizer, char_vocab, check_roundtrip

TEXTS = ["12+35=47", "Hello, World! (a b)", "  two  spaces, edges  ", "x\ny", "it's: 3*4/2-1?"]


def test_vocab_is_82_distinct_ids():
    vocab = char_vocab()
    assert len(vocab) == 82
    assert sorted(vocab.values()) == list(range(82))
    assert (vocab[PAD], vocab[EOS], vocab["0"], vocab[" "]) == (0, 2, 4, 19)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip_one_token_per_character(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_unknown_characters_become_unk(tokenizer):
    ids = tokenizer("a\u00e9b", add_special_tokens=False)["input_ids"]
    assert ids[1] == tokenizer.unk_token_id and len(ids) == 3


def test_check_roundtrip_accepts_our_tokenizer(tokenizer):
    check_roundtrip(tokenizer, tuple(TEXTS))


def test_reloaded_tokenizer_is_the_same(tiny_model_dir: Path):
    # The reason the tiny model is a Llama: AutoTokenizer must not rebuild it (and drop spaces).
    for tok in (AutoTokenizer.from_pretrained(tiny_model_dir), load_tokenizer(str(tiny_model_dir))):
        for text in TEXTS:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text) and tok.decode(ids) == text
        assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 2, "left")


def test_save_and_reload_give_identical_logits(tokenizer, tmp_path: Path):
    model = build_model(tokenizer, seed=3).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = tokenizer(["12+35=", "7+8="], padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, again(**ids).logits)
    assert torch.equal(load_policy(str(tmp_path)).model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_same_seed_same_parameters_other_seed_other_parameters(tokenizer):
    a, b, c = (build_model(tokenizer, seed=s).state_dict() for s in (0, 0, 1))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_size_and_special_ids(tokenizer):
    model = build_model(tokenizer, "tiny")
    # tied embeddings: 82*128 + 4 layers * (4*128*128 attention + 3*128*512 MLP + 2*128 norms) + 128
    assert sum(p.numel() for p in model.parameters()) == 82 * 128 + 4 * (4 * 128 * 128 + 3 * 128 * 512 + 256) + 128
    assert model.generation_config.eos_token_id == 2 and model.generation_config.pad_token_id == 0


def test_unknown_size_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="unknown tiny model size 'huge'"):
        build_model(tokenizer, "huge")


def test_build_is_independent_of_a_fresh_tokenizer():
    assert build_tokenizer().get_vocab() == char_vocab()


@pytest.mark.parametrize("loader", [load_policy, load_tokenizer])
def test_missing_model_path_names_the_path(loader, tmp_path: Path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelLoadError) as err:
        loader(str(missing))
    assert repr(str(missing)) in str(err.value) and "does not exist" in str(err.value)


def test_relative_missing_path_is_not_mistaken_for_a_hub_id():
    with pytest.raises(ModelLoadError, match="'no_such_dir' does not exist"):
        load_policy("no_such_dir")


@pytest.mark.parametrize("loader", [load_policy, load_tokenizer])
def test_dir_without_config_json_is_rejected(loader, tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError) as err:
        loader(str(tmp_path))
    assert repr(str(tmp_path)) in str(err.value) and "no config.json" in str(err.value)


def test_a_file_is_not_a_model_dir(tmp_path: Path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a Hugging Face model directory"):
        load_policy(str(f))
