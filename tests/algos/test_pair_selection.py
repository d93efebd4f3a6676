"""Active pair selection on hand-made reward-model scores: the exact pairs and prompts chosen."""

import math

import torch

from feedbackrl.algos.pair_selection import (
    bald,
    committee_pairs,
    contrast_pairs,
    informative_pairs,
    laplace_factor,
    least_certain,
    random_pairs,
    runner_up_pairs,
    score_covariance,
    uncertain_pairs,
)

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


def test_runner_up_is_the_best_candidate_and_the_next_best():
    # prompt 0: best 5.0 (index 3), runner-up 2.3 (index 2); prompt 2: 4.0 and 3.9, padding never
    # counts; prompt 1 has one real candidate (its 9.0s are padding), so no pair to check
    pairs = runner_up_pairs(SCORES, MASK)
    assert pairs[0].tolist() == [2, 3] and pairs[2].tolist() == [0, 1]
    # not the closest pair (that is (1, 2), |diff| 0.3 < 2.7) nor the widest ((0, 3)): the top two
    scores = torch.tensor([[-1.0, 3.0, 2.0, 2.9], [0.0, 0.0, 0.0, 1.0]])
    assert runner_up_pairs(scores, torch.ones(2, 4)).tolist() == [[1, 3], [0, 3]]  # equal scores: lower index


# --- BALD: mutual information between the label and the model -------------------------------------


def _mc_bald(mean: float, var: float, n: int = 400_000) -> float:
    """Monte Carlo BALD with a fixed seed, as the reference."""
    z = mean + var**0.5 * torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.sigmoid(z)
    h = lambda q: -(torch.xlogy(q, q) + torch.xlogy(1 - q, 1 - q))  # noqa: E731
    return float(h(p.mean()) - h(p).mean())


def test_bald_is_zero_without_uncertainty_and_matches_monte_carlo():
    mean, var = torch.tensor([0.0, 3.0, 0.0, 2.0, 0.5]), torch.tensor([0.0, 0.0, 4.0, 1.0, 100.0])
    got = bald(mean, var)
    assert got[0].item() == 0.0 and got[1].item() == 0.0  # a sure coin flip and a sure winner teach nothing
    for k in (2, 3, 4):
        assert math.isclose(got[k].item(), _mc_bald(mean[k].item(), var[k].item()), abs_tol=2e-3)
    assert 0.23 < got[2].item() < 0.232 and 0.56 < got[4].item() < 0.57  # MC: 0.2313, 0.5642
    assert (got <= math.log(2)).all()


def test_committee_prefers_disagreement_over_a_shared_coin_flip():
    # 2 members, one prompt, 3 candidates. Pair (0, 1): both members say 0.5 (a sure coin flip).
    # Pair (0, 2): member 0 says sigmoid(2), member 1 sigmoid(-2): they disagree.
    scores = torch.tensor([[[0.0, 0.0, -2.0]], [[0.0, 0.0, 2.0]]])
    pairs, info = committee_pairs(scores, torch.ones(1, 3))
    assert pairs.tolist() == [[0, 2]]
    p = 1 / (1 + math.exp(-2))
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert math.isclose(info.item(), math.log(2) - h, rel_tol=1e-5)  # H(mean 0.5) - mean H = 0.3318
    # members agreeing on a clear winner: zero information
    _, none = committee_pairs(torch.tensor([[[0.0, 3.0]], [[0.0, 3.0]]]), torch.ones(1, 2))
    assert abs(none.item()) < 1e-7
    _, masked = committee_pairs(scores, torch.tensor([[1, 0, 0]]))
    assert masked.item() == -math.inf  # one real candidate: no pair


def test_laplace_covariance_equals_the_dense_posterior():
    g = torch.Generator().manual_seed(1)
    diffs = torch.randn(5, 8, generator=g, dtype=torch.float64)
    margins = torch.randn(5, generator=g, dtype=torch.float64)
    feats = torch.randn(3, 4, 8, generator=g, dtype=torch.float64)
    w = torch.sigmoid(margins) * torch.sigmoid(-margins)
    sigma = torch.linalg.inv(0.7 * torch.eye(8, dtype=torch.float64) + diffs.T @ torch.diag(w) @ diffs)
    cov = score_covariance(feats, laplace_factor(diffs, margins, 0.7), 0.7)
    torch.testing.assert_close(cov, feats @ sigma @ feats.transpose(1, 2))
    # no labels: the prior alone, phi_i . phi_j / lambda
    prior = score_covariance(feats, laplace_factor(diffs[:0], margins[:0], 2.0), 2.0)
    torch.testing.assert_close(prior, feats @ feats.transpose(1, 2) / 2.0)


def test_informative_pairs_weigh_variance_against_mean():
    scores = torch.tensor([[0.0, 0.0, 0.0]])
    cov = torch.diag(torch.tensor([0.0, 0.0, 9.0]))[None]  # candidate 2's score is unknown
    pairs, info = informative_pairs(scores, cov, torch.ones(1, 3))
    assert pairs.tolist() == [[0, 2]]  # (0, 1) is a sure tie: BALD 0
    assert math.isclose(info.item(), _mc_bald(0.0, 9.0), abs_tol=2e-3)


def test_contrast_takes_the_pair_scored_furthest_apart():
    pairs, gap = contrast_pairs(SCORES, MASK)
    assert pairs[0].tolist() == [0, 3] and math.isclose(gap[0].item(), 5.0)  # best 5.0 vs worst 0.0
    assert pairs[2].tolist() == [0, 1] and math.isclose(gap[2].item(), 0.1, rel_tol=1e-5)  # padding ignored
    assert gap[1].item() == -math.inf  # one real candidate: no pair
