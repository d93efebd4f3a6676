"""Simulated B-Pref teachers: each irrationality's effect, and the error statistics it should have."""

import math

import pytest
import torch

from feedbackrl.control.teachers import Teacher


def _pairs(returns_1, returns_2, length=1):
    """Segments of `length` steps whose rewards sum to the given returns (all on the last step)."""
    a, b = torch.zeros(len(returns_1), length), torch.zeros(len(returns_2), length)
    a[:, -1], b[:, -1] = torch.tensor(returns_1, dtype=torch.float), torch.tensor(returns_2, dtype=torch.float)
    return a, b


def test_rational_teacher_prefers_the_higher_return_and_ties_go_to_the_second():
    a, b = _pairs([3.0, 1.0, 2.0], [1.0, 3.0, 2.0])
    labels = Teacher().label(a, b, torch.Generator().manual_seed(0))
    assert labels.tolist() == [1.0, 0.0, 0.0]


def test_equal_and_skip_thresholds_use_undiscounted_returns():
    a, b = _pairs([3.0, 1.0, 5.0, 0.5], [2.6, 3.0, 5.2, 0.2])
    labels = Teacher(equal_within=0.5, skip_below=1.0).label(a, b, torch.Generator().manual_seed(0))
    # |3 - 2.6| < 0.5 -> equal; 1 vs 3 -> second; |5 - 5.2| < 0.5 -> equal; both below 1.0 -> skipped
    assert labels[:3].tolist() == [0.5, 0.0, 0.5] and math.isnan(labels[3])


def test_myopic_teacher_weighs_late_steps_more():
    # segment 1: reward 1 at step 0 of 3; segment 2: reward 0.6 at step 2. gamma = 0.5: 1 * 0.25 = 0.25 < 0.6
    a, b = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 0.6]])
    assert Teacher(gamma=0.5).label(a, b, torch.Generator().manual_seed(0)).tolist() == [0.0]
    assert Teacher(gamma=1.0).label(a, b, torch.Generator().manual_seed(0)).tolist() == [1.0]


def test_mistake_rate_matches_its_setting():
    n, eps = 20_000, 0.2
    a, b = _pairs([1.0] * n, [0.0] * n)
    wrong = (Teacher(mistake=eps).label(a, b, torch.Generator().manual_seed(0)) == 0.0).float().mean().item()
    sigma = math.sqrt(eps * (1 - eps) / n)  # binomial standard error: 0.0028
    assert abs(wrong - eps) < 5 * sigma, f"mistake rate {wrong:.4f}, expected {eps} +- {5 * sigma:.4f}"


@pytest.mark.parametrize("diff", [0.5, 1.0, 3.0])
def test_stochastic_teacher_agrees_with_sigmoid_of_beta_times_the_gap(diff):
    n, beta = 20_000, 1.0
    a, b = _pairs([diff] * n, [0.0] * n)
    first = (Teacher(beta=beta).label(a, b, torch.Generator().manual_seed(1)) == 1.0).float().mean().item()
    p = 1 / (1 + math.exp(-beta * diff))  # 0.622, 0.731, 0.953
    assert abs(first - p) < 5 * math.sqrt(p * (1 - p) / n), f"P(first) {first:.4f}, expected {p:.4f}"


def test_equal_pairs_are_never_flipped_by_mistakes():
    a, b = _pairs([1.0] * 1000, [1.0] * 1000)
    labels = Teacher(mistake=0.5, equal_within=0.1).label(a, b, torch.Generator().manual_seed(0))
    assert (labels == 0.5).all()


@pytest.mark.parametrize("kwargs", [{"beta": 0.0}, {"mistake": 1.5}, {"gamma": 0.0}, {"equal_within": -1.0}])
def test_bad_teacher_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="must be|need"):
        Teacher(**kwargs)
