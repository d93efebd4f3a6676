"""The gold-free drift detectors (KL per reward gain, train vs held-out, disagreement): hand-computed
statistics, the step each fires at, quiet twins of the same shape, and replays of recorded-style series."""

from __future__ import annotations

import pytest

from feedbackrl.config import MonitorsConfig
from feedbackrl.monitors.base import Alert, Detector
from feedbackrl.monitors.drift import (
    Disagreement,
    KLPerReward,
    PreferenceDisplacement,
    TrainVsHeldOut,
    false_pass_rise,
    gain_se,
    kl_per_gain,
    rise,
)
from feedbackrl.monitors.monitor import Monitor
from feedbackrl.monitors.record import StepRecord
from feedbackrl.monitors.registry import build_detectors


def run(detector: Detector, rows: list[dict]) -> list[Alert]:
    mon = Monitor(MonitorsConfig(), detectors=[detector])
    for i, row in enumerate(rows, start=1):
        mon.observe(i, StepRecord(i, [], [], [], [], []), row)
    return mon.alerts


# Thresholds below are set in each test (the shipped defaults were chosen on the planted suite's tuning
# runs), so the arithmetic in the comments is the detector's; one test checks the defaults themselves.

# --- KL per unit of reward gain --------------------------------------------------------------------------
def test_kl_per_gain_by_hand():
    # window 2: reward base (0.2 + 0.4) / 2 = 0.3, recent (0.5 + 0.7) / 2 = 0.6 -> gain 0.3; KL now (0.1 + 0.2) / 2
    kl_now, gain, ratio = kl_per_gain([0.0, 0.05, 0.1, 0.2], [0.2, 0.4, 0.5, 0.7], 2, 0.05)
    assert (kl_now, gain, ratio) == pytest.approx((0.15, 0.3, 0.5))
    # reward fell: the gain counts as the floor, 0.15 / 0.05 = 3
    assert kl_per_gain([0.1, 0.2], [0.5, 0.4], 1, 0.05) == pytest.approx((0.2, -0.1, 4.0))
    assert kl_per_gain([0.1, 0.2, 0.3], [0.5, 0.4, 0.3], 2, 0.05) is None  # 3 < 2 * window rewards


def test_kl_per_reward_fires_when_kl_outruns_the_reward():
    # reward rises 0.40 -> 0.46 over 10 steps, KL climbs 0.02 per step
    rows = [{"reward/mean": 0.4 + 0.01 * min(s, 6), "kl/mean": 0.02 * s} for s in range(1, 13)]
    alerts = run(KLPerReward(kl_min=0.05, ratio_max=1.0), rows)
    # at step 10: reward base mean(0.41..0.45) = 0.43, recent mean(0.46 x 5) = 0.46, gain 0.03 -> floor 0.05;
    # KL now mean(0.12..0.20) = 0.16 >= kl_min; ratio 0.16 / 0.05 = 3.2 >= 1.0
    assert [(a.detector, a.step) for a in alerts] == [("kl_per_reward", 10)]
    assert alerts[0].statistic == pytest.approx(3.2)


def test_kl_per_reward_quiet_when_the_reward_pays_for_the_kl_or_no_reference():
    # the same KL with the reward rising 0.05 per step: gain at step 10 = 0.25, ratio 0.16 / 0.25 = 0.64 < 1
    earned = [{"reward/mean": 0.2 + 0.05 * s, "kl/mean": 0.02 * s} for s in range(1, 13)]
    assert run(KLPerReward(kl_min=0.05, ratio_max=1.0), earned) == []
    no_ref = [{"reward/mean": 0.4, "kl/mean": 0.0} for _ in range(12)]  # kl_coef = 0 and no reference
    assert run(KLPerReward(kl_min=0.05, ratio_max=1.0), no_ref) == []
    small = [{"reward/mean": 0.4, "kl/mean": 0.01} for _ in range(12)]  # ratio 0.2 but KL below kl_min
    assert run(KLPerReward(kl_min=0.05, ratio_max=0.1), small) == []


def test_gain_se_and_the_confidence_bound_by_hand():
    # base [0.3, 0.3]: variance 0; recent [0.4, 0.8]: mean 0.6, sample variance (0.2^2 + 0.2^2) / 1 = 0.08
    # se = sqrt(0 / 2 + 0.08 / 2) = 0.2
    assert gain_se([0.3, 0.3], [0.4, 0.8]) == pytest.approx(0.2)
    assert gain_se([0.3], [0.9]) == 0.0  # windows of one step: no variance to read
    kl, reward = [0.0, 0.0, 0.4, 0.6], [0.3, 0.3, 0.4, 0.8]
    # KL now (0.4 + 0.6) / 2 = 0.5; gain 0.6 - 0.3 = 0.3: the point ratio 0.5 / 0.3, with z = 1 0.5 / (0.3 + 0.2)
    assert kl_per_gain(kl, reward, 2, 0.05) == pytest.approx((0.5, 0.3, 0.5 / 0.3))
    assert kl_per_gain(kl, reward, 2, 0.05, z=1.0) == pytest.approx((0.5, 0.3, 1.0))
    rows = [{"reward/mean": r, "kl/mean": k} for k, r in zip(kl, reward, strict=True)]
    assert [a.step for a in run(KLPerReward(window=2, kl_min=0.1, ratio_max=1.5), rows)] == [4]  # 1.67 >= 1.5
    assert run(KLPerReward(window=2, kl_min=0.1, ratio_max=1.5, z=1.0), rows) == []  # 1.0 < 1.5


def test_kl_per_reward_persist_needs_the_condition_on_consecutive_steps():
    # the reward flat at 0.4 (gain 0 -> the floor 0.05); KL 0.2 every step but 0.0 at step 11
    rows = [{"reward/mean": 0.4, "kl/mean": 0.0 if s == 11 else 0.2} for s in range(1, 18)]
    # KL now (5 steps): 0.2 at step 10, then (4 x 0.2 + 0) / 5 = 0.16 < kl_min 0.18 at steps 11-15, 0.2 from 16
    assert [a.step for a in run(KLPerReward(kl_min=0.18, ratio_max=1.0), rows)] == [10]
    alerts = run(KLPerReward(kl_min=0.18, ratio_max=1.0, persist=2), rows)
    assert [(a.step, round(a.statistic, 6)) for a in alerts] == [(17, 4.0)]  # held at 16 and 17; 0.2 / 0.05
    assert "2 steps running" in alerts[0].message
    assert run(KLPerReward(kl_min=0.18, ratio_max=1.0, persist=3), rows) == []  # 16, 17: only two in a row


# --- train vs held-out -------------------------------------------------------------------------------------
def test_rise_by_hand():
    assert rise([0.3, 0.5, 0.1, 0.2], 2) == pytest.approx(0.15 - 0.3)
    assert rise([0.3], 1) is None


def test_train_vs_heldout_reads_eval_accuracy():
    rows = [{"reward/mean": 0.3 + 0.05 * s} for s in range(1, 11)]
    for s, acc in ((1, 0.3), (5, 0.32), (10, 0.31)):
        rows[s - 1]["eval/accuracy"] = acc
    alerts = run(TrainVsHeldOut(gap_min=0.15), rows)
    # at step 5: train since step 5 = 0.55, up to step 1 = 0.35 -> rise 0.2; held 0.32 - 0.3 = 0.02; gap 0.18
    assert [(a.step, round(a.statistic, 6)) for a in alerts] == [(5, 0.18)]


def test_train_vs_heldout_places_an_audit_at_the_step_it_judged():
    rows = [{"reward/mean": r} for r in (0.3, 0.3, 0.3, 0.3, 0.6, 0.6, 0.6, 0.6)]
    rows[1].update({"monitor/audit/people/mean": 0.3, "monitor/audit/people/step": 1.0})  # step 1's, back at 2
    rows[7].update({"monitor/audit/people/mean": 0.35, "monitor/audit/people/step": 5.0})  # step 5's, back at 8
    alerts = run(TrainVsHeldOut(gap_min=0.15), rows)
    # train: steps >= 5 mean 0.6, steps <= 1 mean 0.3 -> 0.3; audit 0.35 - 0.3 = 0.05 -> gap 0.25 at step 8
    assert [(a.step, round(a.statistic, 6)) for a in alerts] == [(8, 0.25)]


def test_train_vs_heldout_quiet_when_the_held_out_check_rises_too_or_reward_is_flat():
    rows = [{"reward/mean": 0.3 + 0.05 * s} for s in range(1, 11)]
    for s, acc in ((1, 0.3), (5, 0.5), (10, 0.75)):
        rows[s - 1]["eval/accuracy"] = acc
    assert run(TrainVsHeldOut(gap_min=0.15), rows) == []
    flat = [{"reward/mean": 0.5, "eval/accuracy": 0.5 - 0.02 * s} for s in range(1, 11)]  # held-out falls, reward flat
    assert run(TrainVsHeldOut(gap_min=0.15), flat) == []


# --- disagreement ------------------------------------------------------------------------------------------
def test_false_pass_rise_by_hand():
    assert false_pass_rise([0.1, 0.2, 0.4], 2) == pytest.approx((0.1, 0.3))
    assert false_pass_rise([0.1], 1) is None


def test_disagreement_fires_on_a_rise_and_on_a_level():
    rows = [{} for _ in range(12)]
    for s, fp in ((1, 0.05), (5, 0.1), (10, 0.25)):
        rows[s].update({"monitor/audit/judge/false_pass": fp})
    alerts = run(Disagreement(rise_min=0.15, level_max=0.4), rows)
    assert [(a.step, round(a.statistic, 6), a.threshold) for a in alerts] == [(11, 0.2, 0.15)]  # 0.25 - 0.05
    high = [{"monitor/gold_false_pass": fp} for fp in (0.45, 0.45)]  # the loophole paid from the first check
    alerts = run(Disagreement(rise_min=0.15, level_max=0.4), high)
    assert [(a.step, a.statistic, a.threshold) for a in alerts] == [(2, 0.45, 0.4)]


def test_disagreement_quiet_when_the_sources_agree():
    rows = [{"monitor/audit/people/false_pass": fp} for fp in (0.1, 0.12, 0.08, 0.15, 0.1)]
    assert run(Disagreement(rise_min=0.15, level_max=0.4), rows) == []


def test_drift_detectors_are_registered_with_their_options():
    got = build_detectors(["kl_per_reward", "train_vs_heldout", "disagreement"],
                          {"kl_per_reward": {"ratio_max": 2.0}})
    assert [d.name for d in got] == ["kl_per_reward", "train_vs_heldout", "disagreement"]
    assert got[0].ratio_max == 2.0


# --- preference displacement (DPO) -------------------------------------------------------------------------
def test_preference_displacement_by_hand():
    chosen = [0.0, -0.05, -0.1, -0.15, -0.2, -0.25]
    margin = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    rows = [{"pref/reward_chosen": c, "pref/reward_margin": m} for c, m in zip(chosen, margin, strict=True)]
    alerts = run(PreferenceDisplacement(), rows)
    # step 6: margin base mean(0, .1, .2) = .1, recent mean(.3, .4, .5) = .4 -> rise .3; chosen mean(-.15..-.25) = -.2
    assert [(a.step, round(a.statistic, 6), a.threshold) for a in alerts] == [(6, -0.2, -0.1)]
    rising = [{"pref/reward_chosen": -c, "pref/reward_margin": m} for c, m in zip(chosen, margin, strict=True)]
    assert run(PreferenceDisplacement(), rising) == []  # chosen more likely: a margin earned
    flat = [{"pref/reward_chosen": c, "pref/reward_margin": 0.2} for c in chosen]  # both fall, margin flat
    assert run(PreferenceDisplacement(), flat) == []


def test_step_monitor_log_maps_trl_dpo_names():
    from feedbackrl.monitors.external import StepMonitor

    m = StepMonitor(MonitorsConfig(detectors=["preference_displacement"]))
    for s, (c, mg) in enumerate(zip([0.0, -0.05, -0.1, -0.15, -0.2, -0.25], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
                                    strict=True), start=1):
        decision = m.log(s, {"rewards/chosen": c, "rewards/margins": mg, "epoch": 1.0})
    assert [a.detector for a in decision.alerts] == ["preference_displacement"]
    assert decision.metrics["alert/preference_displacement"] == pytest.approx(-0.2)


def test_the_shipped_defaults_are_the_tuned_thresholds():
    # chosen by benchmarks/gold_free_thresholds.py on the planted suite's tuning seeds 0 and 1
    assert (KLPerReward().kl_min, KLPerReward().ratio_max, KLPerReward().z, KLPerReward().persist) == (1.0, 4.0, 0, 1)
    assert (TrainVsHeldOut().train_rise_min, TrainVsHeldOut().gap_min) == (0.1, 0.25)
    assert (Disagreement().level_max, Disagreement().rise_min) == (0.6, 0.3)
    # a hack's shape (length hack, tuning seed 1): the reward 0.25 -> 0.5 from step 6, KL jumps to 1.5 at step 10
    hack = [{"reward/mean": 0.25 if s <= 5 else 0.5, "kl/mean": 0.25 if s <= 9 else 1.5} for s in range(1, 14)]
    alerts = run(KLPerReward(), hack)
    # step 11: KL now (3 x 0.25 + 2 x 1.5) / 5 = 0.75 < 1; step 12: (2 x 0.25 + 3 x 1.5) / 5 = 1.0, gain 0.25, 4.0
    assert [(a.step, round(a.statistic, 6)) for a in alerts] == [(12, 4.0)]
    # clean learning's shape (the exact-match twins): the same gain for KL 0.625: 2.5 nats per unit of reward,
    # over the earlier default (KL >= 0.5, ratio >= 2), under this one
    clean = [{"reward/mean": 0.25 if s <= 5 else 0.5, "kl/mean": 0.0 if s <= 5 else 0.625} for s in range(1, 41)]
    assert run(KLPerReward(), clean) == []
    assert [a.step for a in run(KLPerReward(kl_min=0.5, ratio_max=2.0), clean)] == [10]
