"""Generation on a model with SmolLM2's features: GQA, tied embeddings, a BPE tokenizer with a chat
template, and two end tokens in its generation config."""

from __future__ import annotations

import copy

import torch

from feedbackrl.models.chat import render_prompt
from feedbackrl.models.logprobs import encode_prompts, fast_path_ok
from feedbackrl.rollout.generate import generate

QUESTIONS = ["What is 12 + 7?", "Compute 83 - 35.", "Hi", "You are a helpful assistant named SmolLM"]


def test_fast_decoder_equals_hf_greedy_on_a_smollm2_like_model(smol_lm, smol_tokenizer):
    assert fast_path_ok(smol_lm)
    prompts = [render_prompt(smol_tokenizer, q) for q in QUESTIONS]
    ro = generate(smol_lm, smol_tokenizer, prompts, 12, greedy=True)
    ids, mask = encode_prompts(smol_tokenizer, prompts)
    expected = smol_lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    expected = expected[:, ids.shape[1]:]
    assert len(set(map(tuple, expected.tolist()))) == len(prompts), "degenerate model: identical outputs"
    # HF stops on either end token of generation_config.eos_token_id and pads finished rows, as we do
    assert torch.equal(ro.completion_ids, expected[:, : ro.completion_ids.shape[1]])


def test_generation_stops_on_any_of_several_end_tokens(smol_lm, smol_tokenizer):
    prompts = [render_prompt(smol_tokenizer, q) for q in QUESTIONS]
    free = generate(smol_lm, smol_tokenizer, prompts, 10, greedy=True)
    assert not free.truncated.logical_not().any(), "rows must run to the limit without the extra end tokens"
    # make row 0's 3rd token and row 1's 6th token end tokens too (tokens no other row emits earlier)
    a, b = int(free.completion_ids[0, 2]), int(free.completion_ids[1, 5])
    model = copy.deepcopy(smol_lm)
    model.generation_config.eos_token_id = [0, 2, a, b]
    ro = generate(model, smol_tokenizer, prompts, 10, greedy=True)
    for row, ids in enumerate(free.completion_ids.tolist()):
        stop = next((t for t, tok in enumerate(ids) if tok in (a, b)), None)
        n = 10 if stop is None else stop + 1  # the end token itself is part of the completion
        assert ro.completion_mask[row].sum().item() == n, f"row {row}: stops after {n} tokens"
        assert ro.completion_ids[row, :n].tolist() == ids[:n]
        assert bool(ro.truncated[row]) == (stop is None)
    assert ro.completion_mask[0].sum().item() <= 3 and ro.completion_mask[1].sum().item() <= 6
