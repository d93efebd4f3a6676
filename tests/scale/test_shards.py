"""A step's rows split between workers add up to the single process's batch, bit for bit."""

import random

import pytest
import torch

from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rollout.generate import generate
from feedbackrl.scale.shards import advance, join_rollouts, shard_rows


def test_shard_rows_hand_computed():
    assert shard_rows(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert shard_rows(4, 1) == [slice(0, 4)]
    assert shard_rows(2, 3) == [slice(0, 1), slice(1, 2), slice(2, 2)]
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        shard_rows(4, 0)


@pytest.mark.parametrize("workers", [2, 3])
def test_shares_equal_the_whole_batch(tiny_model_dir, workers):
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    rng = random.Random(0)
    task = ReverseTask(min_len=2, max_len=6)  # prompts of several lengths: the batch is left-padded
    prompts = [task.sample(rng).prompt for _ in range(12)]
    whole_rng = torch.Generator().manual_seed(7)
    whole = generate(model, tok, prompts, 6, generator=whole_rng)
    parts = [generate(model, tok, prompts, 6, generator=torch.Generator().manual_seed(7), rows=rows)
             for rows in shard_rows(len(prompts), workers)]
    joined = join_rollouts(parts, tok.pad_token_id)
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs", "truncated"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    assert joined.texts == whole.texts
    after = torch.Generator().manual_seed(7)
    advance(after, joined.completion_ids.shape[1], len(prompts))
    assert torch.equal(after.get_state(), whole_rng.get_state())  # the next step draws what the whole batch's would
