"""Turn-level credit on a hand-made trajectory, arithmetic written out."""

from __future__ import annotations

import pytest
import torch

from feedbackrl.algos.turn_credit import turn_credit, turn_returns


def test_turn_returns_hand_computed() -> None:
    # rewards [1, 0, 2] with gamma 0.5: R2 = 2, R1 = 0 + 0.5*2 = 1, R0 = 1 + 0.5*1 = 1.5
    # second episode has 2 turns: [-1, 4] -> R1 = 4, R0 = -1 + 0.5*4 = 1; its padded turn stays 0
    r = torch.tensor([[1.0, 0.0, 2.0], [-1.0, 4.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert torch.equal(turn_returns(r, m, gamma=0.5), torch.tensor([[1.5, 1.0, 2.0], [1.0, 4.0, 0.0]]))


def test_turn_credit_on_a_hand_made_group() -> None:
    # one group of 3 episodes, gamma = 1
    #   ep0: turns [0, -1]     -> returns [-1, -1]
    #   ep1: turns [0, 0, 0]   -> returns [0, 0, 0]
    #   ep2: turns [-1]        -> returns [-1]
    # turn 0 baseline: (-1 + 0 - 1)/3 = -2/3 -> A = [-1/3, 2/3, -1/3]
    # turn 1 baseline (ep0, ep1): -1/2 -> A = [-1/2, 1/2]
    # turn 2 reached by ep1 only: A = 0
    r = torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # tokens: ep0 = turn0 x2, obs, turn1 x1; ep1 = turn0, obs, turn1, obs, turn2; ep2 = turn0 x2, pad x3
    token_turn = torch.tensor([[0, 0, -1, 1, -1], [0, -1, 1, -1, 2], [0, 0, -1, -1, -1]])
    adv = turn_credit(r, m, token_turn, group_size=3)
    expected = torch.tensor([[-1 / 3, -1 / 3, 0.0, -0.5, 0.0],
                             [2 / 3, 0.0, 0.5, 0.0, 0.0],
                             [-1 / 3, -1 / 3, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_turn_credit_groups_are_independent() -> None:
    r = torch.tensor([[1.0], [0.0], [5.0], [5.0]])
    m = torch.ones(4, 1)
    tt = torch.zeros(4, 1, dtype=torch.long)
    # group 1: mean 0.5 -> [0.5, -0.5]; group 2: equal rewards -> 0
    assert torch.equal(turn_credit(r, m, tt, group_size=2), torch.tensor([[0.5], [-0.5], [0.0], [0.0]]))
    with pytest.raises(ValueError, match="groups of 3"):
        turn_credit(r, m, tt, group_size=3)
