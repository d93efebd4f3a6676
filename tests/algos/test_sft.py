import pytest
import torch

from feedbackrl.algos.sft import sft_loss


def test_sft_loss_hand_computed():
    # Masked tokens: -1, -2 (row 0) and -4 (row 1): NLL = (1 + 2 + 4) / 3 = 7/3.
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = sft_loss(logprobs, mask)
    assert loss.item() == pytest.approx(7 / 3)
    # Each masked token weighs 1/3 (token-level mean over the batch); masked-out tokens get nothing.
    loss.backward()
    third = -1 / 3
    torch.testing.assert_close(logprobs.grad, torch.tensor([[third, third, 0.0], [third, 0.0, 0.0]]))


def test_sft_loss_is_zero_for_a_perfect_model_and_an_empty_mask():
    assert sft_loss(torch.zeros(2, 3), torch.ones(2, 3)).item() == 0.0
    assert sft_loss(torch.full((2, 3), -5.0), torch.zeros(2, 3)).item() == 0.0
