import copy

import torch

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
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert values.shape == (2, 3)
    assert fast_path_ok(model)
