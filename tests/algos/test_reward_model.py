import pytest
import torch

from feedbackrl.algos.reward_model import bradley_terry_loss, pairwise_accuracy, safety_cost_loss


def test_bradley_terry_hand_computed():
    # Pair 0: r_c - r_r = 2 - 0 = 2 -> -log sigmoid(2) = log(1 + e^-2) = log(1.135335) = 0.126928
    # Pair 1: r_c - r_r = 0 - 0 = 0 -> -log sigmoid(0) = log 2 = 0.693147
    # mean = (0.126928 + 0.693147) / 2 = 0.410038
    chosen = torch.tensor([2.0, 0.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0])
    loss, stats = bradley_terry_loss(chosen, rejected)
    assert loss.item() == pytest.approx(0.410038, abs=1e-6)
    # Accuracy: pair 0 correct (1), pair 1 a tie (1/2) -> 0.75. Mean margin (2 + 0) / 2 = 1.
    assert stats["rm/accuracy"].item() == pytest.approx(0.75)
    assert stats["rm/margin"].item() == pytest.approx(1.0)
    assert stats["rm/chosen_mean"].item() == pytest.approx(1.0)
    assert stats["rm/rejected_mean"].item() == pytest.approx(0.0)
    # d/dr_c [-log sigmoid(d)] / N = -(1 - sigmoid(d)) / 2: pair 1 has d = 0 -> -(1 - 0.5)/2 = -0.25;
    # pair 0 has d = 2 -> -(1 - 0.880797)/2 = -0.059601.
    loss.backward()
    assert chosen.grad.tolist() == pytest.approx([-0.059601, -0.25], abs=1e-6)
    assert all(not v.requires_grad for v in stats.values())


def test_bradley_terry_with_margin_hand_computed():
    # d - m: pair 0: (3 - 1) - 2 = 0 -> log 2 = 0.693147; pair 1: (1 - 2) - 0 = -1 -> log(1 + e) = 1.313262
    # mean = (0.693147 + 1.313262) / 2 = 1.003204
    chosen = torch.tensor([3.0, 1.0])
    rejected = torch.tensor([1.0, 2.0])
    margin = torch.tensor([2.0, 0.0])
    loss, stats = bradley_terry_loss(chosen, rejected, margin=margin)
    assert loss.item() == pytest.approx(1.003204, abs=1e-6)
    # Stats describe the rewards, not the margin-shifted logits: one of two pairs right, mean r_c - r_r
    # = (2 + -1) / 2 = 0.5.
    assert stats["rm/accuracy"].item() == pytest.approx(0.5)
    assert stats["rm/margin"].item() == pytest.approx(0.5)


def test_bradley_terry_tie_rows_have_target_one_half():
    # Row 0 a preference, d = 2: -log sigmoid(2) = 0.126928.
    # Row 1 a tie, d = 2: -(log sigmoid(2) + log sigmoid(-2)) / 2 = (0.126928 + 2.126928) / 2 = 1.126928.
    # Row 2 a tie, d = 0: log 2 = 0.693147. Mean (0.126928 + 1.126928 + 0.693147) / 3 = 0.649001.
    chosen = torch.tensor([2.0, 2.0, 0.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 0.0])
    tie = torch.tensor([False, True, True])
    loss, stats = bradley_terry_loss(chosen, rejected, tie=tie)
    assert loss.item() == pytest.approx(0.649001, abs=1e-6)
    # d/dr_c of a tie row: (sigmoid(d) - 1/2) / N, zero at d = 0: row 1 (0.880797 - 0.5) / 3 = 0.126932;
    # the preference row as before, -(1 - 0.880797) / 3 = -0.039734.
    loss.backward()
    assert chosen.grad.tolist() == pytest.approx([-0.039734, 0.126932, 0.0], abs=1e-6)
    # the stats count the preference row only: right, margin 2
    assert stats["rm/accuracy"].item() == 1.0 and stats["rm/margin"].item() == pytest.approx(2.0)
    # all ties: the stats fall back to every row rather than an empty mean
    _, stats = bradley_terry_loss(chosen.detach(), rejected, tie=torch.ones(3, dtype=torch.bool))
    assert stats["rm/margin"].item() == pytest.approx(4 / 3)
    with pytest.raises(ValueError, match="tie must be"):
        bradley_terry_loss(chosen, rejected, tie=torch.zeros(2, dtype=torch.bool))


def test_pairwise_accuracy_ties_count_half():
    # correct, wrong, tie, tie -> (1 + 0 + 0.5 + 0.5) / 4 = 0.5
    chosen = torch.tensor([1.0, 0.0, 3.0, -1.0])
    rejected = torch.tensor([0.0, 1.0, 3.0, -1.0])
    assert pairwise_accuracy(chosen, rejected).item() == pytest.approx(0.5)


def test_bradley_terry_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="must both be"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(3), margin=torch.zeros(2))


def test_safety_cost_loss_hand_computed():
    # Pairwise term on costlier - safer: d = [1 - -1, 0 - 0] = [2, 0] -> (0.126928 + 0.693147) / 2 = 0.410038.
    # Classification term, s = +1 unsafe / -1 safe, -log sigmoid(s * c) per response, summed per pair:
    #   pair 0: costlier c = 1 unsafe -> -log sigmoid(1) = 0.313262; safer c = -1 safe -> -log sigmoid(1) = 0.313262
    #   pair 1: both c = 0, safe -> -log sigmoid(0) = 0.693147 each
    #   mean over pairs = (0.626523 + 1.386294) / 2 = 1.006409. Total 0.410038 + 1.006409 = 1.416446.
    costlier = torch.tensor([1.0, 0.0], requires_grad=True)
    safer = torch.tensor([-1.0, 0.0])
    loss, stats = safety_cost_loss(costlier, safer, torch.tensor([True, False]), torch.tensor([False, False]))
    assert loss.item() == pytest.approx(1.416446, abs=1e-6)
    assert stats["loss/rm_pairwise"].item() == pytest.approx(0.410038, abs=1e-6)
    assert stats["loss/rm_safety"].item() == pytest.approx(1.006409, abs=1e-6)
    # s * c = [1, 0, 1, 0]: two on the right side, two on the boundary (1/2 each) -> 3/4
    assert stats["rm/safety_accuracy"].item() == pytest.approx(0.75)
    assert stats["rm/accuracy"].item() == pytest.approx(0.75)  # pair 0 right, pair 1 a tie
    # d/dc_w of pair 1: pairwise -(1 - sigmoid(0)) / 2 = -0.25; classification s = -1:
    # d/dc [-log sigmoid(-c)] / 2 = sigmoid(0) / 2 = 0.25 -> 0. Pair 0: -(1 - sigmoid(2)) / 2 = -0.059601
    # and -(1 - sigmoid(1)) / 2 = -0.134471 -> -0.194072.
    loss.backward()
    assert costlier.grad.tolist() == pytest.approx([-0.194072, 0.0], abs=1e-6)


def test_safety_cost_loss_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="safety labels"):
        flags = torch.zeros(2, dtype=torch.bool)
        safety_cost_loss(torch.zeros(3), torch.zeros(3), flags, flags)
