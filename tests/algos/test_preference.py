import math

import pytest
import torch

from feedbackrl.algos.preference import (
    PREFERENCE_LOSSES,
    RANKING_LOSSES,
    dpo_loss,
    ipo_loss,
    mean_token_logprobs,
    pro_loss,
    sequence_logprobs,
    token_logprobs,
)

# Two pairs used by the DPO/IPO tests.
#   pair 0: log(pi/ref) chosen = -1 - (-2) = 1, rejected = -3 - (-2) = -1 -> h = 2
#   pair 1: everything -2                                          -> h = 0
LOGP_C = torch.tensor([-1.0, -2.0])
LOGP_R = torch.tensor([-3.0, -2.0])
REF_C = torch.tensor([-2.0, -2.0])
REF_R = torch.tensor([-2.0, -2.0])


def test_token_logprobs_hand_computed():
    # V = 2, logits (0, log 3) -> softmax (1/4, 3/4): log(3/4) = -0.287682, log(1/4) = -1.386294.
    # The -100 label (ignore index) gives 0 instead of an indexing error.
    logits = torch.tensor([[[0.0, math.log(3.0)]] * 3])  # (1, 3, 2)
    labels = torch.tensor([[1, 0, -100]])
    assert token_logprobs(logits, labels).tolist()[0] == pytest.approx([-0.287682, -1.386294, 0.0], abs=1e-6)
    # Summed over the first two (masked-in) tokens: -0.287682 - 1.386294 = -1.673976.
    mask = torch.tensor([[1, 1, 0]])
    assert sequence_logprobs(logits, labels, mask).item() == pytest.approx(-1.673976, abs=1e-6)


def test_token_logprobs_matches_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    labels = torch.randint(0, 7, (3, 5), generator=g)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    torch.testing.assert_close(token_logprobs(logits, labels), -ce.view(3, 5))


def test_padding_with_garbage_logits_does_not_change_sequence_logprobs_or_grad():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 6, generator=g, requires_grad=True)
    labels = torch.randint(0, 6, (2, 4), generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # Three extra padded positions of huge garbage logits and arbitrary labels (incl. the ignore index).
    pad_logits = 1e4 * torch.randn(2, 3, 6, generator=g)
    padded = torch.cat([logits, pad_logits], dim=1)
    padded_labels = torch.cat([labels, torch.tensor([[5, -100, 0], [2, 3, -100]])], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 3, dtype=mask.dtype)], dim=1)

    short = sequence_logprobs(logits, labels, mask)
    (g_short,) = torch.autograd.grad(short.sum(), logits)
    long = sequence_logprobs(padded, padded_labels, padded_mask)
    (g_long,) = torch.autograd.grad(long.sum(), logits)
    torch.testing.assert_close(long, short)
    torch.testing.assert_close(g_long, g_short)


def test_dpo_hand_computed():
    # beta = 0.5: logits beta*h = (1, 0).
    #   pair 0: -log sigmoid(1) = log(1 + e^-1) = 0.313262;  pair 1: -log sigmoid(0) = log 2 = 0.693147
    #   mean = 0.503204
    logp_c = LOGP_C.clone().requires_grad_(True)
    loss, stats = dpo_loss(logp_c, LOGP_R, REF_C, REF_R, beta=0.5)
    assert loss.item() == pytest.approx(0.503204, abs=1e-6)
    # Implicit rewards beta*log(pi/ref): chosen (0.5, 0) -> mean 0.25; rejected (-0.5, 0) -> -0.25;
    # margin 0.5; accuracy: pair 0 yes, pair 1 a tie (not counted) -> 0.5.
    assert stats["pref/reward_chosen"].item() == pytest.approx(0.25)
    assert stats["pref/reward_rejected"].item() == pytest.approx(-0.25)
    assert stats["pref/reward_margin"].item() == pytest.approx(0.5)
    assert stats["pref/accuracy"].item() == pytest.approx(0.5)
    # d loss / d logp_c = -sigmoid(-beta*h) * beta / N: pair 0: -sigmoid(-1) * 0.5 / 2 = -0.268941/4
    # = -0.067235; pair 1: -0.5 * 0.5 / 2 = -0.125.
    loss.backward()
    assert logp_c.grad.tolist() == pytest.approx([-0.067235, -0.125], abs=1e-6)


def test_cdpo_label_smoothing_hand_computed():
    # eps = 0.25, beta*h = (1, 0):
    #   pair 0: 0.75 * log(1 + e^-1) + 0.25 * log(1 + e) = 0.75*0.313262 + 0.25*1.313262 = 0.563262
    #   pair 1: 0.75 * log 2 + 0.25 * log 2 = 0.693147
    #   mean = 0.628204
    loss, _ = dpo_loss(LOGP_C, LOGP_R, REF_C, REF_R, beta=0.5, label_smoothing=0.25)
    assert loss.item() == pytest.approx(0.628204, abs=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(LOGP_C, LOGP_R, REF_C, REF_R, label_smoothing=0.5)


def test_ipo_hand_computed():
    # beta (tau) = 0.25 -> target margin 1/(2*0.25) = 2. h = (2, 0):
    #   pair 0: (2 - 2)^2 = 0; pair 1: (0 - 2)^2 = 4; mean = 2.
    logp_c = LOGP_C.clone().requires_grad_(True)
    loss, stats = ipo_loss(logp_c, LOGP_R, REF_C, REF_R, beta=0.25)
    assert loss.item() == pytest.approx(2.0)
    # d loss / d logp_c = 2 (h - 2) / N: pair 0: 0; pair 1: 2 * (-2) / 2 = -2.
    loss.backward()
    assert logp_c.grad.tolist() == pytest.approx([0.0, -2.0])
    assert stats["pref/reward_margin"].item() == pytest.approx(0.25 * (2 + 0) / 2)


def test_mean_token_logprobs_hand_computed():
    # row 0: tokens -1, -2, -3 (one pad, whose -100 must not count) -> -6 / 3 = -2; row 1: -4 alone -> -4
    token_lp = torch.tensor([[-1.0, -2.0, -3.0, -100.0], [-4.0, -100.0, -100.0, -100.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert mean_token_logprobs(token_lp, mask).tolist() == [-2.0, -4.0]
    with pytest.raises(ValueError, match="at least one token"):
        mean_token_logprobs(token_lp, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))


def test_ipo_on_length_averaged_logprobs_hand_computed():
    # TRL's IPO: one pair, chosen has 4 tokens, rejected 2. Summed log-ratios: chosen +2 (policy -6 vs
    # reference -8), rejected -1 (policy -5 vs -4). Per-token means: chosen -1.5 vs -2 -> +0.5,
    # rejected -2.5 vs -2 -> -0.5, so h = 1.0 (summed: h = 3). beta = 0.5 -> target 1/(2*0.5) = 1:
    #   averaged loss (1 - 1)^2 = 0; summed loss (3 - 1)^2 = 4.
    mask_c, mask_r = torch.tensor([[1, 1, 1, 1]]), torch.tensor([[1, 1, 0, 0]])
    pol_c, ref_c = torch.tensor([[-1.0, -2.0, -1.0, -2.0]]), torch.tensor([[-2.0, -2.0, -2.0, -2.0]])
    pol_r, ref_r = torch.tensor([[-2.0, -3.0, 0.0, 0.0]]), torch.tensor([[-2.0, -2.0, 0.0, 0.0]])
    averaged = [mean_token_logprobs(x, m) for x, m in ((pol_c, mask_c), (pol_r, mask_r), (ref_c, mask_c),
                                                      (ref_r, mask_r))]
    assert ipo_loss(*averaged, beta=0.5)[0].item() == 0.0
    summed = [(x * m).sum(-1) for x, m in ((pol_c, mask_c), (pol_r, mask_r), (ref_c, mask_c), (ref_r, mask_r))]
    assert ipo_loss(*summed, beta=0.5)[0].item() == 4.0


def test_pro_k3_hand_computed():
    # beta = 0.5. Row 0 log-ratios (4, 2, 0) -> scores s = (2, 1, 0), ranked in the right order:
    #   j=0: log(e^2 + e + 1) - 2 = log(11.107338) - 2 = 0.407606
    #   j=1: log(e + 1) - 1 = 1.313262 - 1 = 0.313262
    #   j=2: log(e^0) - 0 = 0                                   row sum 0.720868
    # Row 1 log-ratios (0, 2, 4) -> s = (0, 1, 2), ranked backwards:
    #   j=0: log(1 + e + e^2) - 0 = 2.407606
    #   j=1: log(e + e^2) - 1 = log(e (1 + e)) - 1 = 1.313262   row sum 3.720868
    # mean over rows = (0.720868 + 3.720868) / 2 = 2.220868
    ref = torch.full((2, 3), -5.0)
    logp = ref + torch.tensor([[4.0, 2.0, 0.0], [0.0, 2.0, 4.0]])
    loss, stats = pro_loss(logp, ref, beta=0.5)
    assert loss.item() == pytest.approx(2.220868, abs=1e-5)
    # Top-1: row 0 puts the best response first, row 1 does not.
    assert stats["pref/top1_accuracy"].item() == pytest.approx(0.5)
    # Mean score of the best response (2 + 0) / 2 = 1; of the worst (0 + 2) / 2 = 1.
    assert stats["pref/reward_best"].item() == pytest.approx(1.0)
    assert stats["pref/reward_worst"].item() == pytest.approx(1.0)


def test_pro_padding_mask_matches_shorter_ranking():
    # Row 0: 3 real responses + 1 garbage pad; row 1: 2 real + 2 pads. Each row must equal its
    # unpadded loss: row 0 is the k=3 ranking above (0.720868); row 1 with s = (1, 0) is
    # log(1 + e^-1) = 0.313262. Mean = 0.517065.
    ref = torch.zeros(2, 4)
    logp = torch.tensor([[4.0, 2.0, 0.0, 1e4], [2.0, 0.0, -1e4, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss, stats = pro_loss(logp, ref, beta=0.5, mask=mask)
    assert loss.item() == pytest.approx((0.720868 + 0.313262) / 2, abs=1e-5)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[mask == 0].abs().max().item() == 0.0
    # Worst real response: row 0 s=0, row 1 s=0 -> 0.
    assert stats["pref/reward_worst"].item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="right padding"):
        pro_loss(logp, ref, mask=torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]]))


def test_pro_with_two_responses_equals_dpo():
    g = torch.Generator().manual_seed(2)
    logp, ref = torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g)
    pro, _ = pro_loss(logp, ref, beta=0.3)
    dpo, _ = dpo_loss(logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], beta=0.3)
    torch.testing.assert_close(pro, dpo)


def _linear_policy_logprobs(weight: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
    return sequence_logprobs(feats @ weight.T, labels, mask)  # feats (n, T, D), weight (V, D)


def test_dpo_gradient_accumulation_1x8_equals_8x1():
    g = torch.Generator().manual_seed(3)
    n, t, d, v = 8, 5, 4, 6
    weight = torch.randn(v, d, generator=g, requires_grad=True)
    feats_c, feats_r = torch.randn(n, t, d, generator=g), torch.randn(n, t, d, generator=g)
    labels_c, labels_r = torch.randint(0, v, (n, t), generator=g), torch.randint(0, v, (n, t), generator=g)
    lengths = torch.tensor([5, 3, 4, 1, 2, 5, 3, 4])
    mask = (torch.arange(t) < lengths[:, None]).long()
    ref_c, ref_r = torch.randn(n, generator=g) - 5, torch.randn(n, generator=g) - 5

    def loss_on(idx: slice) -> torch.Tensor:
        lc = _linear_policy_logprobs(weight, feats_c[idx], labels_c[idx], mask[idx])
        lr = _linear_policy_logprobs(weight, feats_r[idx], labels_r[idx], mask[idx])
        return dpo_loss(lc, lr, ref_c[idx], ref_r[idx], beta=0.2)[0]

    (full_grad,) = torch.autograd.grad(loss_on(slice(0, n)), weight)
    acc = torch.zeros_like(weight)
    for i in range(n):  # eight chunks of one pair, each loss weighted by chunk size / N = 1/8
        (gi,) = torch.autograd.grad(loss_on(slice(i, i + 1)) * (1 / n), weight)
        acc += gi
    torch.testing.assert_close(acc, full_grad, rtol=1e-5, atol=1e-7)
    assert full_grad.abs().max() > 1e-3  # the check is not vacuous


def test_registries_select_by_name():
    assert PREFERENCE_LOSSES["dpo"] is dpo_loss
    assert PREFERENCE_LOSSES["ipo"] is ipo_loss
    assert RANKING_LOSSES["pro"] is pro_loss
    for fn in PREFERENCE_LOSSES.values():
        loss, stats = fn(LOGP_C, LOGP_R, REF_C, REF_R, beta=0.5)
        assert loss.dim() == 0 and all(not s.requires_grad for s in stats.values())


def test_shape_errors_name_the_inputs():
    with pytest.raises(ValueError, match=r"\(N,\) summed"):
        dpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="best response first"):
        pro_loss(torch.zeros(3), torch.zeros(3))
