"""Active pair selection on hand-made reward-model scores: the exact pairs and prompts chosen."""

import math

import torch

from feedbackrl.algos.pair_selection import least_certain, random_pairs, uncertain_pairs

# Three prompts, K = 4 candidates; prompt 2 has only two real candidates (mask), prompt 1 one.
SCORES = torch.tensor([[0.0, 2.0, 2.3, 5.0],    # closest pair: (1, 2), |diff| 0.3
                       [1.0, 9.0, 9.0, 9.0],    # one real candidate: no pair
                       [4.0, 3.9, 0.0, 0.0]])   # (0, 1), |diff| 0.1; columns 2, 3 are padding
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])


def test_least_certain_pair_per_prompt_and_its_certainty():
    pairs, certainty = uncertain_pairs(SCORES, MASK)
    assert pairs[0].tolist() == [1, 2] and pairs[2].tolist() == [0, 1]
    # sigmoid(2.0 - 2.3) = sigmoid(-0.3) = 0.425557, so the certainty is |0.425557 - 0.5| = 0.074443
    assert math.isclose(certainty[0].item(), abs(1 / (1 + math.exp(0.3)) - 0.5), rel_tol=1e-6)
    assert math.isclose(certainty[0].item(), 0.0744427, rel_tol=1e-5)
    assert math.isclose(certainty[2].item(), 0.0249792, rel_tol=1e-5)  # sigmoid(0.1) - 0.5
    assert certainty[1].item() == math.inf  # the padded duplicates 9.0 = 9.0 are never a pair


def test_ties_go_to_the_first_pair():
    pairs, certainty = uncertain_pairs(torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 3))
    assert pairs.tolist() == [[0, 1]] and certainty.tolist() == [0.0]


def test_least_certain_prompts_first_and_no_prompt_without_a_pair():
    _, certainty = uncertain_pairs(SCORES, MASK)
    assert least_certain(certainty, 3).tolist() == [2, 0]  # 0.025 < 0.074; prompt 1 has no pair
    assert least_certain(certainty, 1).tolist() == [2]


def test_random_pairs_are_valid_and_cover_every_valid_pair():
    g = torch.Generator().manual_seed(0)
    seen = {tuple(random_pairs(MASK, g)[0].tolist()) for _ in range(300)}
    assert seen == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}  # all 6 pairs of prompt 0
    assert all(random_pairs(MASK, g)[2].tolist() == [0, 1] for _ in range(20))  # its only pair
