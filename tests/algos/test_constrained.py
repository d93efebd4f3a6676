import functools
import json
import math

import pytest
import torch

from feedbackrl.algos.constrained import (
    LagrangeState,
    PIDLagrangeState,
    combined_advantages,
    grpo_lagrangian_advantages,
    kl_shaped_costs,
    lagrange_update,
    pid_lagrange_update,
    ppo_lagrangian_advantages,
    probe_cycle,
)
from feedbackrl.algos.ppo import gae, kl_penalised_rewards


def test_combined_advantages_hand_computed():
    a_r, a_c = torch.tensor([1.0, -1.0, 0.5]), torch.tensor([2.0, 0.0, -1.0])
    # lambda = 1: ((1 - 2) / 2, (-1 - 0) / 2, (0.5 + 1) / 2) = (-0.5, -0.5, 0.75)
    assert combined_advantages(a_r, a_c, 1.0).tolist() == [-0.5, -0.5, 0.75]
    # lambda = 3: ((1 - 6) / 4, -1 / 4, (0.5 + 3) / 4) = (-1.25, -0.25, 0.875)
    assert combined_advantages(a_r, a_c, torch.tensor(3.0)).tolist() == [-1.25, -0.25, 0.875]
    # lambda = 0 is the unconstrained advantage
    assert combined_advantages(a_r, a_c, 0.0).tolist() == a_r.tolist()


def test_combined_advantages_per_token_shape():
    # (N, T) advantages (PPO's per-token GAE) combine elementwise: lambda = 1, (3 - 1) / 2 = 1.
    out = combined_advantages(torch.full((2, 3), 3.0), torch.ones(2, 3), 1.0)
    assert out.shape == (2, 3) and out.eq(1.0).all()


@pytest.mark.parametrize("a_c, lam, match", [
    pytest.param(torch.zeros(2), 1.0, "one shape", id="shape-mismatch"),
    pytest.param(torch.zeros(3), -0.1, ">= 0", id="negative-lambda"),
    pytest.param(torch.zeros(3), float("nan"), ">= 0", id="nan-lambda"),
])
def test_combined_advantages_rejects_bad_input(a_c, lam, match):
    with pytest.raises(ValueError, match=match):
        combined_advantages(torch.zeros(3), a_c, lam)


def test_grpo_lagrangian_unscaled_hand_computed():
    # G = 2. Rewards (1, 0 | 0, 1): group means 0.5, 0.5 -> reward advantages (0.5, -0.5, -0.5, 0.5).
    # Costs (1, 0 | 0, 0): group means 0.5, 0 -> cost advantages (0.5, -0.5, 0, 0).
    # lambda = 1: ((0.5 - 0.5) / 2, (-0.5 + 0.5) / 2, -0.5 / 2, 0.5 / 2) = (0, 0, -0.25, 0.25):
    # in group 0 the rewarded completion is also the costly one, so the two cancel.
    adv, stats = grpo_lagrangian_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0, 0.0]),
                                            group_size=2, lam=1.0, scale=False)
    assert adv.tolist() == [0.0, 0.0, -0.25, 0.25]
    assert stats["advantages/cost"].tolist() == [0.5, -0.5, 0.0, 0.0]


def test_grpo_lagrangian_scaled_hand_computed():
    # Same signals, each divided by its own group's unbiased std + 1e-4:
    #   (1, 0): std sqrt(0.5) = 0.707107 -> +-0.5 / 0.707207 = +-0.707007
    #   cost group (0, 0): std 0 -> 0 / 1e-4 = 0
    # lambda = 0.5: group 0: (0.707007 - 0.5 * 0.707007) / 1.5 = 0.235669, and its negative;
    #               group 1: (-0.707007 - 0) / 1.5 = -0.471338, and its negative.
    adv, _ = grpo_lagrangian_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0, 0.0]),
                                        group_size=2, lam=0.5)
    assert adv.tolist() == pytest.approx([0.235669, -0.235669, -0.471338, 0.471338], abs=1e-6)


def test_grpo_lagrangian_constant_cost_group_adds_no_cost_noise():
    # G = 4, lambda = 0.5. Group 0 is a word every completion pays for (costs 1, 1, 1, 1): its mean is exactly 1,
    # so its cost advantage is 0 / (0 + 1e-4) = 0 exactly, and its combined advantage is the reward's alone,
    # A_r / 1.5: the per-group std injects nothing into a group whose cost does not vary.
    #   rewards (1, 0, 1, 0): unbiased std sqrt(1/3) = 0.577350 -> A_r = +-0.5 / 0.577450 = +-0.865875;
    #   / 1.5 = +-0.577250.
    # Group 1, rewards (1, 1, 0, 0) and costs (1, 0, 1, 0): A_r = (a, a, -a, -a), A_c = (a, -a, a, -a), a = 0.865875:
    #   ((a - a/2) / 1.5, (a + a/2) / 1.5, (-a - a/2) / 1.5, (-a + a/2) / 1.5) = (0.288625, 0.865875, -0.865875,
    #   -0.288625): the right answer that costs nothing keeps the whole reward advantage.
    rewards, costs = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([1.0, 1, 1, 1, 1, 0, 1, 0])
    adv, stats = grpo_lagrangian_advantages(rewards, costs, group_size=4, lam=0.5)
    assert stats["advantages/cost"][:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[:4].tolist() == (stats["advantages/reward"][:4] / 1.5).tolist()
    assert adv.tolist() == pytest.approx(
        [0.577250, -0.577250, 0.577250, -0.577250, 0.288625, 0.865875, -0.865875, -0.288625], abs=1e-6
    )


def test_grpo_lagrangian_rejects_costs_of_another_shape():
    with pytest.raises(ValueError, match="one cost per completion"):
        grpo_lagrangian_advantages(torch.zeros(4), torch.zeros(2), group_size=2, lam=1.0)


def test_lagrange_update_hand_computed():
    # lambda_init 1 (log 0), threshold 0.5, lr 0.1, window 4.
    state = LagrangeState.initial(1.0)
    # step 1, costs (1, 0, 1, 1): J_C = 0.75, violation 0.25; log lambda = 0 + 0.1 * 1 * 0.25 = 0.025,
    #   lambda = e^0.025 = 1.025315
    state, stats = lagrange_update(state, torch.tensor([1.0, 0.0, 1.0, 1.0]), threshold=0.5, lr=0.1, window=4)
    assert state.log_lambda == pytest.approx(0.025, abs=1e-15)
    assert stats == pytest.approx({"constraint/lambda": 1.025315, "constraint/cost_window_mean": 0.75,
                                   "constraint/violation": 0.25, "constraint/updated": 1.0}, abs=1e-6)
    # step 2, costs (0, 0): the window keeps the last 4 of (1, 0, 1, 1, 0, 0) = (1, 1, 0, 0), J_C = 0.5,
    #   violation 0 -> log lambda unchanged
    state, stats = lagrange_update(state, [0.0, 0.0], threshold=0.5, lr=0.1, window=4)
    assert state.window == (1.0, 1.0, 0.0, 0.0) and stats["constraint/violation"] == 0.0
    assert state.log_lambda == pytest.approx(0.025, abs=1e-15)
    # step 3, costs (0, 0): window (0, 0, 0, 0), J_C = 0, violation -0.5;
    #   log lambda = 0.025 + 0.1 * 1.025315 * (-0.5) = -0.026266, lambda = 0.974076
    state, stats = lagrange_update(state, [0.0, 0.0], threshold=0.5, lr=0.1, window=4)
    assert state.log_lambda == pytest.approx(-0.026266, abs=1e-6)
    assert stats["constraint/lambda"] == pytest.approx(0.974076, abs=1e-6)
    assert state.step == 3


def test_lagrange_update_waits_for_the_delay():
    # delay 2: the first two calls fill the window but leave lambda at 1; the third moves it with the
    # mean of all five costs seen: (2 + 2 + 0 + 1 + 0) / 5 = 1, violation 1 - 0 = 1, log lambda = 0.1.
    state = LagrangeState.initial(1.0)
    for costs in ([2.0, 2.0], [0.0, 1.0]):
        state, stats = lagrange_update(state, costs, threshold=0.0, lr=0.1, delay=2)
        assert state.log_lambda == 0.0 and stats["constraint/updated"] == 0.0
    state, stats = lagrange_update(state, [0.0], threshold=0.0, lr=0.1, delay=2)
    assert stats["constraint/cost_window_mean"] == 1.0 and stats["constraint/updated"] == 1.0
    assert state.log_lambda == pytest.approx(0.1, abs=1e-15)


def test_lagrange_update_caps_lambda():
    # lambda 4.9, cost 10 over a threshold 0 with lr 1: log 4.9 + 4.9 * 10 = 50.6 -> capped at log 5.
    state, stats = lagrange_update(LagrangeState.initial(4.9), [10.0], threshold=0.0, lr=1.0, lambda_max=5.0)
    assert state.log_lambda == math.log(5.0)
    assert stats["constraint/lambda"] == pytest.approx(5.0, rel=1e-12)


def test_lagrange_state_round_trips_bit_exactly_through_json():
    g = torch.Generator().manual_seed(0)
    state = LagrangeState.initial(0.7)
    for _ in range(5):
        state, _ = lagrange_update(state, torch.rand(8, generator=g), threshold=0.3, lr=0.37, window=12, delay=1)
    restored = LagrangeState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    costs = torch.rand(8, generator=g)
    assert lagrange_update(restored, costs, 0.3, lr=0.37, window=12) == lagrange_update(state, costs, 0.3, lr=0.37,
                                                                                        window=12)


@pytest.mark.parametrize("kwargs, costs, match", [
    pytest.param({}, [], "costs is empty", id="no-costs"),
    pytest.param({}, [0.1, float("nan")], "finite", id="nan-cost"),
    pytest.param({"window": 0}, [0.1], "window >= 1", id="window-zero"),
    pytest.param({"delay": -1}, [0.1], "delay >= 0", id="negative-delay"),
    pytest.param({"lambda_max": 0.0}, [0.1], "lambda_max > 0", id="cap-zero"),
])
def test_lagrange_update_rejects_bad_input(kwargs, costs, match):
    with pytest.raises(ValueError, match=match):
        lagrange_update(LagrangeState.initial(1.0), costs, threshold=0.0, **kwargs)


def test_lagrange_state_rejects_non_positive_lambda_init():
    with pytest.raises(ValueError, match="lambda_init must be > 0"):
        LagrangeState.initial(0.0)


def test_pid_update_hand_computed():
    # kp 1, ki 0.5, kd 2, threshold 0.5, window 1 (J_C is this step's cost), lambda starts at 1.
    pid = functools.partial(pid_lagrange_update, threshold=0.5, kp=1.0, ki=0.5, kd=2.0, window=1)
    state = PIDLagrangeState(lam=1.0)
    # cost 1.0: Delta 0.5, I = 0.5, D = 0 (no previous cost); lambda = 0.5 + 0.5 * 0.5 = 0.75
    state, _ = pid(state, [1.0])
    assert (state.lam, state.integral, state.prev_cost) == (0.75, 0.5, 1.0)
    # cost 1.5: Delta 1.0, I = 1.5, D = 0.5; lambda = 1.0 + 0.75 + 2 * 0.5 = 2.75
    state, _ = pid(state, [1.5])
    assert (state.lam, state.integral) == (2.75, 1.5)
    # cost 0.0: Delta -0.5, I = 1.0, D = max(0, -1.5) = 0; lambda = -0.5 + 0.5 = 0: the proportional
    # term drops lambda the moment the cost is safe, where the integral alone would still be at 0.5
    state, stats = pid(state, [0.0])
    assert (state.lam, state.integral) == (0.0, 1.0) and stats["constraint/violation"] == -0.5
    # cost 0.0 again: I = 0.5; lambda = max(0, -0.5 + 0.25) = 0
    state, _ = pid(state, [0.0])
    assert (state.lam, state.integral) == (0.0, 0.5)


def test_pid_integral_is_capped_against_windup():
    # ki 1, lambda_max 2, kp = kd = 0. Cost 10: I = min(10, 2 / 1) = 2, lambda 2. Cost 0 (Delta 0): I stays 2.
    # Cost -1 (a raw cost-model score can be negative): I = 1, lambda 1; uncapped, I would be 9 and lambda
    # would sit at the cap for 8 more safe steps.
    pid = functools.partial(pid_lagrange_update, threshold=0.0, kp=0.0, ki=1.0, kd=0.0, window=1, lambda_max=2.0)
    state = PIDLagrangeState(lam=0.0)
    for cost, lam in ((10.0, 2.0), (0.0, 2.0), (-1.0, 1.0)):
        state, _ = pid(state, [cost])
        assert state.lam == lam


def test_pid_waits_for_the_delay_and_round_trips():
    state = PIDLagrangeState(lam=0.3)
    state, stats = pid_lagrange_update(state, [5.0], threshold=0.0, kp=1.0, ki=1.0, kd=1.0, delay=1)
    assert (state.lam, state.integral, state.prev_cost, stats["constraint/updated"]) == (0.3, 0.0, None, 0.0)
    state, _ = pid_lagrange_update(state, [1.0], threshold=0.0, kp=0.1, ki=0.2, kd=0.3, delay=1)
    # J_C = (5 + 1) / 2 = 3: I = 3, D = 0 (first update); lambda = 0.1 * 3 + 0.2 * 3 = 0.9
    assert state.lam == pytest.approx(0.9, abs=1e-15) and state.prev_cost == 3.0
    assert PIDLagrangeState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_pid_rejects_negative_gains():
    with pytest.raises(ValueError, match="gains must be >= 0"):
        pid_lagrange_update(PIDLagrangeState(lam=1.0), [0.0], threshold=0.0, kp=-1.0, ki=0.1, kd=0.0)


def _lagged_policy(update, state, steps: int = 200, threshold: float = 0.3) -> list[float]:
    """A scripted policy: its cost moves a fifth of the way each step towards 1 / (1 + 2 lambda), where
    lambda is the multiplier of 5 steps ago (a policy follows the multiplier only with a lag)."""
    cost, costs, lams = 1.0, [], [state.lam] * 6
    for _ in range(steps):
        state, stats = update(state, [cost], threshold)
        costs.append(cost)
        lams.append(stats["constraint/lambda"])
        cost += 0.2 * (1.0 / (1.0 + 2.0 * lams[-6]) - cost)
    return costs


def test_pid_overshoots_and_oscillates_less_than_gradient_ascent():
    # Both start at lambda 1 with the same integral gain: near lambda = 1 the plain step on log lambda,
    # lr * lambda * Delta = 0.5 * Delta, moves lambda by about lambda * 0.5 * Delta = 0.5 * Delta, as ki = 0.5.
    threshold = 0.3
    plain = _lagged_policy(functools.partial(lagrange_update, lr=0.5, window=1), LagrangeState.initial(1.0))
    pid = _lagged_policy(functools.partial(pid_lagrange_update, kp=1.0, ki=0.5, kd=4.0, window=1),
                         PIDLagrangeState(lam=1.0))

    def after_first_crossing(costs: list[float]) -> tuple[float, float, int]:
        first = next(i for i, c in enumerate(costs) if c <= threshold)
        rest = costs[first:]
        crossings = sum((a - threshold) * (b - threshold) < 0 for a, b in zip(costs, costs[1:], strict=False))
        return max(threshold - c for c in rest), max(c - threshold for c in rest), crossings

    plain_under, plain_over, plain_cross = after_first_crossing(plain)
    pid_under, pid_over, pid_cross = after_first_crossing(pid)
    # measured: plain undershoots by 0.167, violates again by 0.076 and crosses 9 times;
    # PID undershoots by 0.060, violates again by 0.006 and crosses 7 times
    msg = f"plain {plain_under:.3f}/{plain_over:.3f}/{plain_cross}, pid {pid_under:.3f}/{pid_over:.3f}/{pid_cross}"
    assert pid_under < 0.5 * plain_under, msg
    assert pid_over < 0.2 * plain_over, msg
    assert pid_cross < plain_cross, msg
    # and both settle on the threshold: lambda* solves 1 / (1 + 2 lambda) = 0.3
    assert abs(plain[-1] - threshold) < 0.01 and abs(pid[-1] - threshold) < 0.01, msg


# --- PPO-Lagrangian: per-token costs and advantages --------------------------------------------------------------

def test_kl_shaped_costs_hand_computed():
    costs = torch.tensor([1.0, 0.0])
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 9.0], [-0.5, 7.0, 7.0]])  # the padding's values must not leak
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # row 0: 0.5 * (-1 + 1.5) = 0.25; 0.5 * (-2 + 1) = -0.5, plus the cost 1 at its last real token = 0.5
    # row 1: 0.5 * (-0.5 + 0.5) = 0 plus the cost 0; padding 0
    got = kl_shaped_costs(costs, logprobs, ref, mask, 0.5)
    assert got.tolist() == [[0.25, 0.5, 0.0], [0.0, 0.0, 0.0]]
    # the KL part is the reward's penalty with the sign turned: drifting costs what it loses in reward
    penalty = kl_penalised_rewards(torch.zeros(2), logprobs, ref, mask, 0.5)
    assert (kl_shaped_costs(torch.zeros(2), logprobs, ref, mask, 0.5) == -penalty).all()


def test_ppo_lagrangian_advantages_hand_computed_unwhitened():
    reward_adv = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    cost_adv = torch.tensor([[2.0, 0.0], [1.0, 5.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    got, stats = ppo_lagrangian_advantages(reward_adv, cost_adv, mask, 1.0, whiten_each=False)
    # lambda = 1: ((1 - 2) / 2, (2 - 0) / 2, (3 - 1) / 2), and 0 on the padding (not (0 - 5) / 2)
    assert got.tolist() == [[-0.5, 1.0], [1.0, 0.0]]
    assert stats["advantages/reward_abs_mean"].item() == 2.0  # (1 + 2 + 3) / 3
    assert stats["advantages/cost_abs_mean"].item() == 1.0  # (2 + 0 + 1) / 3


def test_ppo_lagrangian_advantages_whiten_each_on_its_own():
    reward_adv = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    cost_adv = torch.tensor([[2.0, 0.0], [1.0, 5.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    got, _ = ppo_lagrangian_advantages(reward_adv, cost_adv, mask, 1.0)
    # real tokens: rewards 1, 2, 3 (mean 2, population std sqrt(2/3)) -> s * (-1, 0, 1), s = sqrt(3/2);
    # costs 2, 0, 1 (mean 1, the same std) -> s * (1, -1, 0); lambda = 1 -> s * (-1, 1/2, 1/2)
    s = math.sqrt(1.5)
    assert got[0, 0].item() == pytest.approx(-s, rel=1e-6)
    assert got[0, 1].item() == pytest.approx(s / 2, rel=1e-6)
    assert got[1, 0].item() == pytest.approx(s / 2, rel=1e-6)
    assert got[1, 1].item() == 0.0


def test_ppo_lagrangian_kl_weight_does_not_depend_on_lambda():
    # with no reward and no cost, only the KL: the cost's per-token signal is minus the reward's, so over zero
    # values GAE gives A_c = -A_r and (A_r - lambda A_c) / (1 + lambda) = A_r for every lambda
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.ones(1, 3)
    zero = torch.zeros(1)
    a_r, _ = gae(kl_penalised_rewards(zero, logprobs, ref, mask, 0.2), torch.zeros(1, 3), mask, 1.0, 1.0)
    a_c, _ = gae(kl_shaped_costs(zero, logprobs, ref, mask, 0.2), torch.zeros(1, 3), mask, 1.0, 1.0)
    for lam in (0.0, 1.0, 4.0):
        got, _ = ppo_lagrangian_advantages(a_r, a_c, mask, lam, whiten_each=False)
        torch.testing.assert_close(got, a_r, rtol=0, atol=1e-7)


def test_ppo_lagrangian_advantages_reject_other_shapes():
    with pytest.raises(ValueError, match=r"must be \(N, T\) like the mask \(2, 2\); got \(2,\) and \(2, 2\)"):
        ppo_lagrangian_advantages(torch.zeros(2), torch.zeros(2, 2), torch.ones(2, 2), 1.0)


# --- the pessimistic estimate (HC-RLHF): J_C as the window's Student-t upper bound ---------------------------------

T_90_3 = 1.6377443536962102  # t_{0.9, 3} (scipy.stats.t.ppf(0.9, 3))


def test_lagrange_update_with_the_upper_bound_hand_computed():
    # costs 0, 1, 0, 1: mean 0.5, unbiased std sqrt(1/3), n = 4 -> U = 0.5 + t_{0.9,3} sqrt(1/3) / 2
    bound = 0.5 + T_90_3 * math.sqrt(1 / 3) / 2  # 0.97278
    state, stats = lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0, 0.0, 1.0], 0.5, lr=0.1, bound_delta=0.1)
    assert stats["constraint/cost_window_mean"] == pytest.approx(bound, rel=1e-9)
    # the mean sits at the threshold (no step), the bound above it: log lambda = 0 + 0.1 * 1 * (U - 0.5)
    assert state.log_lambda == pytest.approx(0.1 * (bound - 0.5), rel=1e-9)
    plain, plain_stats = lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0, 0.0, 1.0], 0.5, lr=0.1)
    assert plain.log_lambda == 0.0 and plain_stats["constraint/cost_window_mean"] == 0.5


def test_pid_update_with_the_upper_bound_hand_computed():
    bound = 0.5 + T_90_3 * math.sqrt(1 / 3) / 2
    state, stats = pid_lagrange_update(PIDLagrangeState(lam=0.0), [0.0, 1.0, 0.0, 1.0], 0.5, kp=1.0, ki=0.5, kd=0.0,
                                       bound_delta=0.1)
    # Delta = U - 0.5; I = Delta; lambda = kp Delta + ki I = 1.5 Delta
    assert state.lam == pytest.approx(1.5 * (bound - 0.5), rel=1e-9)
    assert stats["constraint/violation"] == pytest.approx(bound - 0.5, rel=1e-9)


def test_the_upper_bound_needs_two_costs_and_a_valid_level():
    # one cost: no spread to bound, J_C is the cost itself (not an infinite bound that would pin lambda at its cap)
    state, stats = lagrange_update(LagrangeState.initial(1.0), [0.25], 0.5, bound_delta=0.1)
    assert stats["constraint/cost_window_mean"] == 0.25 and state.lam < 1.0
    with pytest.raises(ValueError, match=r"delta must be in \(0, 0.5\]"):
        lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0], 0.5, bound_delta=0.7)


def test_the_upper_bound_per_prompt_hand_computed():
    # costs (1, 1 | 0, 0 | 1, 0), groups of 2 completions of one prompt each: prompt means 1, 0, 0.5 (mean 0.5,
    # unbiased std 0.5, n = 3): U = 0.5 + t_{0.9,2} 0.5 / sqrt(3), t_{0.9,2} = 0.8 sqrt(2 / 0.36) = 1.885618
    # (closed form for 2 degrees of freedom) -> U = 0.5 + 0.544331 = 1.044331. Over the 6 completions as if
    # independent: std sqrt(1.5 / 5) = 0.547723, t_{0.9,5} = 1.475884: U = 0.5 + 0.330018 = 0.830018.
    costs = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    grouped, stats = pid_lagrange_update(PIDLagrangeState(lam=0.0), costs, 0.5, kp=1.0, ki=0.0, kd=0.0,
                                         bound_delta=0.1, bound_group=2)
    assert stats["constraint/cost_window_mean"] == pytest.approx(1.044331, abs=1e-6)
    assert grouped.lam == pytest.approx(0.544331, abs=1e-6)  # kp (U - 0.5)
    _, flat = pid_lagrange_update(PIDLagrangeState(lam=0.0), costs, 0.5, kp=1.0, ki=0.0, kd=0.0, bound_delta=0.1)
    assert flat["constraint/cost_window_mean"] == pytest.approx(0.830018, abs=1e-6)
    # the same for the plain multiplier; without a bound the grouping changes nothing (the mean is the mean)
    _, plain = lagrange_update(LagrangeState.initial(1.0), costs, 0.5, bound_delta=0.1, bound_group=2)
    assert plain["constraint/cost_window_mean"] == stats["constraint/cost_window_mean"]
    _, mean = lagrange_update(LagrangeState.initial(1.0), costs, 0.5, bound_group=2)
    assert mean["constraint/cost_window_mean"] == 0.5


def test_the_upper_bound_per_prompt_needs_whole_groups():
    with pytest.raises(ValueError, match="not whole groups of 4"):
        lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0, 0.0, 1.0, 1.0, 0.0], 0.5, bound_delta=0.1,
                        bound_group=4)
    with pytest.raises(ValueError, match="bound_group must be >= 1"):
        lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0], 0.5, bound_delta=0.1, bound_group=0)
    # one whole group: no spread between prompts to bound, J_C is its mean
    _, stats = lagrange_update(LagrangeState.initial(1.0), [0.0, 1.0, 0.0, 1.0], 0.5, bound_delta=0.1, bound_group=4)
    assert stats["constraint/cost_window_mean"] == 0.5


def test_the_probe_cycle_hand_computed():
    assert probe_cycle(0, 3, 5) == ([0, 1, 2], 3)
    assert probe_cycle(3, 4, 5) == ([3, 4, 0, 1], 2)  # wraps around
    assert probe_cycle(2, 10, 4) == ([2, 3, 0, 1, 2, 3, 0, 1, 2, 3], 0)  # more than the set: every member again
    assert probe_cycle(0, 1, 1) == ([0], 0)
    # a window of `size` costs filled by successive calls holds each member exactly once
    position, seen = 0, []
    for count in (3, 3, 3, 3):
        indices, position = probe_cycle(position, count, 7)
        seen += indices
    assert sorted(seen[-7:]) == list(range(7))


@pytest.mark.parametrize("position, count, size", [(0, 0, 5), (5, 1, 5), (-1, 1, 5), (0, 1, 0)])
def test_the_probe_cycle_rejects_bad_arguments(position, count, size):
    with pytest.raises(ValueError, match="need size >= 1, count >= 1 and 0 <= position < size"):
        probe_cycle(position, count, size)
