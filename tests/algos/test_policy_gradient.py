import math

import pytest
import torch

from feedbackrl.algos.policy_gradient import clipped_pg_loss


def logs(*ratios: float) -> list[float]:
    return [math.log(r) for r in ratios]


# With old_logprobs = 0 and logprobs = log(r), the ratio exp(logprobs - old_logprobs) is r.
RATIOS = (0.5, 0.9, 1.1, 1.5)


def test_symmetric_clip_hand_computed():
    # clip 0.2: the ratio is clipped to [0.8, 1.2]; loss = -min(r*A, clip(r)*A).
    # A = +1: r=0.5 -> -min(0.5, 0.8) = -0.5     r=0.9 -> -0.9     r=1.1 -> -1.1
    #         r=1.5 -> -min(1.5, 1.2) = -1.2 (clipped branch active)
    # A = -1: r=0.5 -> -min(-0.5, -0.8) = 0.8 (active)   r=0.9 -> 0.9   r=1.1 -> 1.1
    #         r=1.5 -> -min(-1.5, -1.2) = 1.5 (not clipped: a worse bad action is fully penalised)
    # clip_frac: 2 active of 8 real tokens = 0.25.
    logprobs = torch.tensor([logs(*RATIOS), logs(*RATIOS)])
    loss, stats = clipped_pg_loss(logprobs, torch.zeros(2, 4), torch.tensor([1.0, -1.0]), torch.ones(2, 4),
                                  clip_low=0.2, clip_high=0.2)
    assert loss.tolist()[0] == pytest.approx([-0.5, -0.9, -1.1, -1.2], abs=1e-6)
    assert loss.tolist()[1] == pytest.approx([0.8, 0.9, 1.1, 1.5], abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.25)


def test_advantage_magnitude_scales_the_loss():
    # A = 2, r = 1.5 clipped to 1.2 -> -2.4;  r = 0.9 -> -1.8.
    loss, _ = clipped_pg_loss(torch.tensor([logs(1.5, 0.9)]), torch.zeros(1, 2), torch.tensor([2.0]),
                              torch.ones(1, 2))
    assert loss.tolist()[0] == pytest.approx([-2.4, -1.8], abs=1e-6)


def test_clip_higher_is_asymmetric():
    # clip_low 0.2, clip_high 0.28 (DAPO): the range is [0.8, 1.28].
    # A = +1: r=1.25 -> -1.25 (inside the raised ceiling; symmetric 0.2 would give -1.2)
    #         r=1.5  -> -1.28 (clipped at the new ceiling)
    # A = -1: r=0.5  -> -min(-0.5, -0.8) = 0.8 (the floor is unchanged)
    #         r=0.75 -> -min(-0.75, -0.8) = 0.8
    # clip_frac: r=1.5 (A=+1), r=0.5 and r=0.75 (A=-1) are clipped: 3 of 4.
    logprobs = torch.tensor([logs(1.25, 1.5), logs(0.5, 0.75)])
    loss, stats = clipped_pg_loss(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                                  clip_low=0.2, clip_high=0.28)
    assert loss.tolist()[0] == pytest.approx([-1.25, -1.28], abs=1e-6)
    assert loss.tolist()[1] == pytest.approx([0.8, 0.8], abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.75)
    symmetric, _ = clipped_pg_loss(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert symmetric[0, 0].item() == pytest.approx(-1.2, abs=1e-6)


def test_padding_is_zeroed_and_not_counted_in_clip_frac():
    # Same tokens as the symmetric example, but the last token of row 0 (r=1.5, clipped) is padding:
    # its loss is 0 and clip_frac = 1 active (row 1, r=0.5) / 7 real tokens.
    logprobs = torch.tensor([logs(*RATIOS), logs(*RATIOS)])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss, stats = clipped_pg_loss(logprobs, torch.zeros(2, 4), torch.tensor([1.0, -1.0]), mask)
    assert loss.tolist()[0] == pytest.approx([-0.5, -0.9, -1.1, 0.0], abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(1 / 7)


def test_token_level_advantages():
    # (N, T) advantages are used per token:
    # row 0: r=1.5, A=1 -> -1.2 (clipped);  r=0.5, A=-1 -> 0.8 (clipped)
    # row 1: r=1.1, A=2 -> -2.2;            r=1.5, A=0 -> 0
    logprobs = torch.tensor([logs(1.5, 0.5), logs(1.1, 1.5)])
    adv = torch.tensor([[1.0, -1.0], [2.0, 0.0]])
    loss, stats = clipped_pg_loss(logprobs, torch.zeros(2, 2), adv, torch.ones(2, 2))
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8], abs=1e-6)
    assert loss.tolist()[1] == pytest.approx([-2.2, 0.0], abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.5)


def test_sequence_advantages_equal_their_broadcast():
    gen = torch.Generator().manual_seed(0)
    logprobs, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    adv = torch.randn(3, generator=gen)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).float()
    per_seq, _ = clipped_pg_loss(logprobs, old, adv, mask)
    per_tok, _ = clipped_pg_loss(logprobs, old, adv[:, None].expand(3, 5), mask)
    assert torch.equal(per_seq, per_tok)


def test_gradient_flows_only_through_unclipped_tokens():
    # d(-r*A)/d(logprob) = -r*A on unclipped tokens; clipped tokens have a constant loss, gradient 0.
    # A = +1: r=0.9 -> -0.9, r=1.5 (clipped) -> 0.   A = -1: r=0.5 (clipped) -> 0, r=1.1 -> 1.1.
    logprobs = torch.tensor([logs(0.9, 1.5), logs(0.5, 1.1)], requires_grad=True)
    loss, _ = clipped_pg_loss(logprobs, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    loss.sum().backward()
    assert logprobs.grad.tolist()[0] == pytest.approx([-0.9, 0.0], abs=1e-6)
    assert logprobs.grad.tolist()[1] == pytest.approx([0.0, 1.1], abs=1e-6)


def test_on_policy_ratio_one_gives_vanilla_policy_gradient():
    # logprobs == old_logprobs: r = 1, loss = -A per token, gradient -A (REINFORCE with a baseline).
    lp = torch.tensor([[-0.3, -1.2], [-2.0, -0.1]], requires_grad=True)
    loss, stats = clipped_pg_loss(lp, lp.detach(), torch.tensor([0.5, -2.0]), torch.ones(2, 2))
    loss.sum().backward()
    assert loss.tolist() == [[-0.5, -0.5], [2.0, 2.0]]
    assert lp.grad.tolist() == [[-0.5, -0.5], [2.0, 2.0]]
    assert stats["clip_frac"].item() == 0.0
