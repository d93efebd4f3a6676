import copy

import torch
from fp32 import assert_within, decoder_logprob_tolerance

from feedbackrl.models.logprobs import encode_prompts, fast_path_ok, sequence_logprobs
from feedbackrl.train.ppo import logprobs_and_values, make_value_head


def test_ppo_forward_leaves_the_policy_on_the_fast_decode_path(peaked_lm, tokenizer):
    # output_hidden_states=True would make transformers hook the model for good (and our decoder then
    # falls back to the slow generic path for the rest of the run)
    model = copy.deepcopy(peaked_lm)
    p_ids, p_mask = encode_prompts(tokenizer, ["12+3=", "7+85="])
    c_ids = torch.tensor([[5, 6, 7], [8, 9, tokenizer.pad_token_id]])
    c_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got, values, _ = logprobs_and_values(model, make_value_head(model), p_ids, p_mask, c_ids, c_mask)
    want, _ = sequence_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    # two float32 forwards (the trunk plus LM head here, the fast training path there) that round differently on
    # every CPU: each within the float32 bound of one float64 run (tests/fp32.py derives it)
    model64 = copy.deepcopy(peaked_lm).double()
    truth, _ = sequence_logprobs(model64, p_ids, p_mask, c_ids, c_mask)
    tol = decoder_logprob_tolerance(model64, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1))
    assert 0 < tol < 1e-2  # well below the gap between any two of the tokens' log-probs: a wrong position shows
    assert_within(got, truth, tol * c_mask, "PPO forward")
    assert_within(want, truth, tol * c_mask, "sequence_logprobs")
    assert values.shape == (2, 3)
    assert fast_path_ok(model)
