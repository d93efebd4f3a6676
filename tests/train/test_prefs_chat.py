"""Chat-format preference pairs from a file are rendered with the model's own chat template."""

from __future__ import annotations

import json
from pathlib import Path

from feedbackrl.config import build_config
from feedbackrl.train.prefs import preference_data

ROW = {"chosen": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
       "rejected": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "5"}]}


def test_chat_pairs_use_the_models_template(smol_tokenizer, tokenizer, tmp_path: Path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(ROW) for _ in range(3)) + "\n")
    cfg = build_config({"algo": {"name": "dpo"}, "prefs": {"path": str(path)}})
    pairs, _, _ = preference_data(cfg, None, smol_tokenizer, None, None, tmp_path, heldout=False)
    want = smol_tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                              add_generation_prompt=True)
    assert pairs[0].prompt == want
    assert (pairs[0].chosen, pairs[0].rejected) == ("4<|im_end|>\n", "5<|im_end|>\n")
    # chat_template = "off" (or a tokenizer without one): the documented stand-in template
    off = build_config({"algo": {"name": "dpo"}, "prefs": {"path": str(path)}, "model": {"chat_template": "off"}})
    pairs, _, _ = preference_data(off, None, smol_tokenizer, None, None, tmp_path, heldout=False)
    assert pairs[0].prompt == "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"
    pairs, _, _ = preference_data(cfg, None, tokenizer, None, None, tmp_path, heldout=False)
    assert pairs[0].prompt == "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"
