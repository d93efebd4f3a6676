"""Segment preferences: cutting segments at episode ends, the segment Bradley-Terry loss by hand, the label
schedule, disagreement-based queries, and a reward model that learns CartPole's preferences."""

import math

import torch

from feedbackrl.config import SegmentPrefsConfig
from feedbackrl.control.preferences import (
    PreferenceLearner,
    cut_segments,
    round_budgets,
    round_steps,
    segment_bt_loss,
    segment_returns,
)
from feedbackrl.control.rollout import Rollout


def _rollout(t_len=6, n_env=2, done_at=((2, 0),)):
    dones = torch.zeros(t_len, n_env, dtype=torch.bool)
    for t, e in done_at:
        dones[t, e] = True
    obs = torch.arange(t_len * n_env, dtype=torch.float).view(t_len, n_env, 1)
    z = torch.zeros(t_len, n_env)
    return Rollout(obs, torch.zeros(t_len, n_env, dtype=torch.long), z, z.unsqueeze(-1), torch.ones(t_len, n_env), z,
                   dones, torch.zeros_like(dones), z.unsqueeze(-1), torch.zeros(n_env, 1), [])


def test_a_segment_is_absorbing_after_its_episode_ends():
    ro = _rollout()  # env 0's episode ends at step 2
    seg = cut_segments(ro, torch.tensor([1, 1]), torch.tensor([0, 1]), 4, n_actions=2, discrete=True)
    assert seg.mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert seg.gold.sum(1).tolist() == [2.0, 4.0]  # the teacher's returns: CartPole's 1 per real step
    assert seg.actions.shape == (2, 4, 2) and seg.obs[0, :, 0].tolist() == [2.0, 4.0, 6.0, 8.0]


def test_segment_bradley_terry_loss_hand_computed():
    # per-step predicted rewards; segment 1 of pair 0 has an absorbing last step whose 5.0 must not count
    steps_1 = torch.tensor([[0.5, 0.5, 5.0], [1.0, 0.0, 0.0]])
    steps_2 = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    r1, r2 = segment_returns(steps_1, mask), segment_returns(steps_2, torch.ones(2, 3, dtype=torch.bool))
    assert r1.tolist() == [1.0, 1.0] and r2.tolist() == [0.0, 0.0]
    # pair 0: first preferred, d = 1: -log sigmoid(1) = log(1 + e^-1) = 0.313262
    # pair 1: equal, d = 1: -(log sigmoid(1) + log sigmoid(-1)) / 2 = (0.313262 + 1.313262) / 2 = 0.813262
    loss, stats = segment_bt_loss(r1, r2, torch.tensor([1.0, 0.5]))
    expected = (math.log1p(math.exp(-1)) + (math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2) / 2
    assert abs(loss.item() - expected) < 1e-6, (loss.item(), expected)  # 0.563262
    # the second preferred: the roles swap, -log sigmoid(0 - 1) = 1.313262
    loss, _ = segment_bt_loss(r1[:1], r2[:1], torch.tensor([0.0]))
    assert abs(loss.item() - math.log1p(math.exp(1))) < 1e-6
    assert stats["rm/accuracy"].item() == 1.0  # the tie is left out of the accuracy


def test_label_schedule_spends_the_whole_budget():
    cfg = SegmentPrefsConfig(labels=100, rounds=4)
    assert round_steps(cfg, 40) == [0, 5, 10, 15]
    assert round_budgets(cfg, 4) == [25, 25, 25, 25]
    hyper = round_budgets(SegmentPrefsConfig(labels=100, rounds=4, schedule="hyperbolic"), 4)
    # shares 1, 1/2, 1/3, 1/4 of 25/12: 48, 24, 16, 12
    assert hyper == [48, 24, 16, 12] and sum(hyper) == 100



def test_rounds_that_share_a_step_ask_their_labels_together():
    cfg = SegmentPrefsConfig(labels=24, rounds=3)
    assert round_steps(cfg, 4) == [0, 1, 1]  # 3 rounds over the first 2 of 4 steps
    learner = PreferenceLearner(cfg, 4, 2, True, total_steps=4, generator=torch.Generator().manual_seed(0))
    assert learner.schedule == {0: 8, 1: 16} and sum(learner.schedule.values()) == cfg.labels


def _cartpole_rollouts(n, seed=0):
    import gymnasium  # noqa: F401 (the control extra)

    from feedbackrl.control.envs import make_vec_env
    from feedbackrl.control.policy import ActorCritic
    from feedbackrl.control.rollout import Collector

    collector = Collector(make_vec_env("CartPole-v1", 8), seed)
    policy = ActorCritic(4, 2, True)
    gen = torch.Generator().manual_seed(seed)
    return [collector.collect(policy, 64, gen) for _ in range(n)]


def test_reward_model_learns_which_segments_keep_the_pole_up():
    ro_train, ro_test = _cartpole_rollouts(2)
    cfg = SegmentPrefsConfig(segment_len=20, labels=200, rounds=1, selection="random", epochs=200)
    learner = PreferenceLearner(cfg, 4, 2, True, total_steps=1, generator=torch.Generator().manual_seed(0))
    stats = learner.query(0, ro_train)
    assert stats["prefs/labels"] == 200
    # held-out pairs from another rollout that differ in true return: the ensemble orders most of them right
    a, b, _, _ = learner._candidates(ro_test, 400)
    true_diff = a.gold.sum(1) - b.gold.sum(1)
    with torch.no_grad():
        pred = (segment_returns(learner.model(a.obs, a.actions), a.mask)
                - segment_returns(learner.model(b.obs, b.actions), b.mask)).mean(0)
    differ = true_diff != 0
    acc = ((pred[differ] > 0) == (true_diff[differ] > 0)).float().mean().item()
    assert differ.sum() > 50 and acc > 0.85, f"held-out accuracy {acc:.3f} on {int(differ.sum())} pairs"


def test_disagreement_selection_labels_the_most_disputed_candidates():
    (ro,) = _cartpole_rollouts(1)
    cfg = SegmentPrefsConfig(segment_len=20, labels=20, rounds=2, pool=8, ensemble=4, epochs=50)
    learner = PreferenceLearner(cfg, 4, 2, True, total_steps=4, generator=torch.Generator().manual_seed(0))
    learner.query(0, ro)  # round 1: 10 labels; the members now differ
    saved = learner.generator.get_state()
    a, b, _, _ = learner._candidates(ro, 10 * 8)  # the candidates round 2 will draw: 8 per label
    spread = learner._disagreement(a, b)
    top = torch.topk(spread, 10).indices
    learner.generator.set_state(saved)
    assert round_steps(cfg, 4) == [0, 1]  # two rounds over the first 2 of 4 steps
    learner.query(1, ro)  # round 2
    assert torch.equal(learner.first.obs[10:], a.obs[top]) and torch.equal(learner.second.obs[10:], b.obs[top])
    assert spread[top].min() >= spread.median()  # not merely the first ten drawn
