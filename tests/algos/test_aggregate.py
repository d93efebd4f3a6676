import pytest
import torch

from feedbackrl.algos.aggregate import AGGREGATIONS, fixed_length_sum, sequence_mean, token_mean

# Row 0 has 4 real tokens (1, 2, 3, 4), row 1 has 2 (10, 20) and 2 padding slots.
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


def test_token_mean_hand_computed():
    # (1+2+3+4+10+20) / 6 real tokens = 40/6
    assert token_mean(VALUES, MASK).item() == pytest.approx(40 / 6)


def test_sequence_mean_hand_computed():
    # row means 10/4 = 2.5 and 30/2 = 15 -> (2.5 + 15) / 2 = 8.75
    assert sequence_mean(VALUES, MASK).item() == pytest.approx(8.75)


def test_fixed_length_sum_hand_computed():
    # 40 / (N=2 * T=4) = 5;  with max_len = 8: 40 / (2 * 8) = 2.5
    assert fixed_length_sum(VALUES, MASK).item() == pytest.approx(5.0)
    assert fixed_length_sum(VALUES, MASK, max_len=8).item() == pytest.approx(2.5)


def test_global_counts_override_the_local_ones():
    # num_tokens = 10: 40/10 = 4.   num_sequences = 4: sequence_mean (2.5+15)/4 = 4.375,
    # fixed_length_sum 40 / (4 * 4) = 2.5.
    assert token_mean(VALUES, MASK, num_tokens=10).item() == pytest.approx(4.0)
    assert sequence_mean(VALUES, MASK, num_sequences=4).item() == pytest.approx(4.375)
    assert fixed_length_sum(VALUES, MASK, num_sequences=4).item() == pytest.approx(2.5)


def test_empty_mask_gives_zero_not_nan():
    zeros = torch.zeros(2, 3)
    for fn in AGGREGATIONS.values():
        assert fn(torch.ones(2, 3), zeros).item() == 0.0


@pytest.mark.parametrize("name", ["token_mean", "sequence_mean", "fixed_length_sum"])
def test_extra_padding_columns_with_garbage_change_nothing(name):
    # Three more padded columns holding large finite junk (what a model computes on pad tokens).
    values = torch.cat([VALUES, torch.tensor([[1e6, -7.0, 3.5], [-1e6, 42.0, 9.0]])], dim=1)
    mask = torch.cat([MASK, torch.zeros(2, 3)], dim=1)
    fn = AGGREGATIONS[name]
    # fixed_length_sum is padding-invariant only with an explicit max_len (its point: a constant).
    assert fn(values, mask, max_len=4).item() == fn(VALUES, MASK, max_len=4).item()


@pytest.mark.parametrize("name", ["token_mean", "sequence_mean", "fixed_length_sum"])
def test_accumulating_micro_batches_with_global_counts_equals_one_batch(name):
    # 4 micro-batches of 2 rows, each given the global token / sequence counts, sum to the 8-row value.
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(8, 6, generator=gen)
    mask = (torch.rand(8, 6, generator=gen) > 0.4).float()
    mask[:, 0] = 1.0
    fn = AGGREGATIONS[name]
    whole = fn(values, mask, max_len=6)
    parts = sum(fn(values[i : i + 2], mask[i : i + 2], num_tokens=mask.sum(), max_len=6, num_sequences=8)
                for i in range(0, 8, 2))
    torch.testing.assert_close(parts, whole)


def test_gradients_weigh_tokens_as_documented():
    # token_mean: every real token gets 1/6.  sequence_mean: row 0 tokens 1/(2*4) = 0.125,
    # row 1 tokens 1/(2*2) = 0.25.  Padding gets 0 in both.
    for fn, row0, row1 in ((token_mean, 1 / 6, 1 / 6), (sequence_mean, 0.125, 0.25)):
        v = VALUES.clone().requires_grad_(True)
        fn(v, MASK).backward()
        assert v.grad[0].tolist() == pytest.approx([row0] * 4)
        assert v.grad[1].tolist() == pytest.approx([row1, row1, 0.0, 0.0])
