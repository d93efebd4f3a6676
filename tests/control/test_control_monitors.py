"""The monitors on control runs: a learned reward rising while the true return falls is flagged by the same
`proxy_gold` detector as for text, its action (stop) honoured; a run whose reward model is right stays quiet.
A planted alert's rollback acts as in the text loop (tests/train/test_monitor_actions.py), through the same
code (`train/monitoring.py`)."""

import json

import pytest
import torch

from feedbackrl.config import ConfigError, build_config
from feedbackrl.train.checkpoint import MODULE_FILE, load_extra, load_trainer_state
from feedbackrl.train.constraint import CONSTRAINT_FILE
from feedbackrl.train.run import run

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")


def _cfg(mistake: float, steps: int = 12, **monitors):
    # the planted case: a teacher who flips every label (B-Pref's mistake rate 1) teaches a reward model that
    # prefers the pole falling; PPO then raises the learned reward while the true return falls
    return build_config({
        "algo": {"name": "control_ppo", "steps": steps},
        "control": {"env": "CartPole-v1", "num_envs": 4, "rollout_steps": 128, "reward": "preferences",
                    "eval_episodes": 2,
                    "preferences": {"segment_len": 25, "labels": 160, "rounds": 4, "epochs": 40,
                                    "teacher": {"mistake": mistake, "equal_within": 0.5}}},
        "train": {"threads": 1}, "monitors": monitors})


def _rl_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "rl"]


def test_a_reward_model_that_prefers_the_wrong_behaviour_is_flagged_and_stops_the_run(tmp_path):
    report = run(_cfg(1.0, actions={"proxy_gold": "stop"}), tmp_path)
    rows = _rl_rows(tmp_path)
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["detector"] for a in alerts] == ["proxy_gold"] and alerts[0]["action"] == "stop", alerts
    fired = alerts[0]["step"]
    assert report["stopped_at"] == fired == rows[-1]["step"] < 12, (report.get("stopped_at"), fired)
    assert rows[-1]["alert/proxy_gold"] >= 0.1
    # what it saw: the learned reward's z-score above its start, the true return's below
    proxy = [r["monitor/proxy_mean"] for r in rows]
    gold = [r["monitor/gold_mean"] for r in rows]
    assert sum(proxy[-3:]) / 3 > sum(proxy[:3]) / 3 and sum(gold[-3:]) / 3 < sum(gold[:3]) / 3, (proxy, gold)
    assert report["alerts"]["count"] == 1 and (tmp_path / "checkpoints" / f"step_{fired:06d}").is_dir()


def test_a_right_reward_model_stays_quiet(tmp_path):
    report = run(_cfg(0.0), tmp_path)
    rows = _rl_rows(tmp_path)
    assert len(rows) == 12 and not (tmp_path / "alerts.jsonl").exists() and report["alerts"]["count"] == 0
    # the learned reward tracks the true one: proxy and gold z-scores agree at every update
    gaps = [abs(r["monitor/proxy_mean"] - r["monitor/gold_mean"]) for r in rows]
    assert max(gaps) < 0.1, gaps
    assert report["control_eval_after"]["eval/return"] > report["control_eval_before"]["eval/return"]


# planted: with the environment's reward the learned and true rewards are one (`reward/mean` = `reward/gold_mean`),
# so their gap never moves; with window 1 and gap_min 0, proxy_gold fires on a run's second update (and again on
# the second update after a rollback, which arms it again)
PLANTED = {"proxy_gold": {"window": 1, "gap_min": 0.0}}


def _planted(action: str, steps: int, max_rollbacks: int = 3, **train):
    return build_config({
        "algo": {"name": "control_ppo", "steps": steps},
        "control": {"env": "CartPole-v1", "num_envs": 2, "rollout_steps": 32, "eval_episodes": 2,
                    "cost": "cart_off_centre"},
        "constraint": {"threshold": 0.01, "window": 8},  # a multiplier, rolled back with the policy
        "train": {"threads": 1, **train},
        "monitors": {"detectors": ["proxy_gold"], "options": PLANTED, "actions": {"proxy_gold": action},
                     "max_rollbacks": max_rollbacks}})


def _alerts(run_dir):
    return [(a["detector"], a["step"], a["action"])
            for a in map(json.loads, (run_dir / "alerts.jsonl").read_text().splitlines())]


def test_a_rollback_restores_the_last_checkpoint(tmp_path):
    # the alert at update 2 rolls back to the checkpoint written before update 1: the final checkpoint holds the
    # start's policy, value heads, multiplier and (empty) optimizer state
    run(_planted("rollback", 2), tmp_path)
    assert _alerts(tmp_path) == [("proxy_gold", 2, "rollback")]
    assert [r["step"] for r in _rl_rows(tmp_path)] == [1, 2]
    start, final = (tmp_path / "checkpoints" / f"step_{s:06d}" for s in (0, 2))
    want, got = (torch.load(c / MODULE_FILE, weights_only=True) for c in (start, final))
    assert all(torch.equal(t, got[k]) for k, t in want.items())
    assert load_extra(final, CONSTRAINT_FILE) == load_extra(start, CONSTRAINT_FILE)
    assert load_trainer_state(final).optimizer["state"] == {} == load_trainer_state(start).optimizer["state"]
    # control: the same run with the alert only logged ends with other weights and another lambda
    run(_planted("log", 2), tmp_path / "logged")
    logged = tmp_path / "logged" / "checkpoints" / "step_000002"
    moved = torch.load(logged / MODULE_FILE, weights_only=True)
    assert any(not torch.equal(t, moved[k]) for k, t in want.items())
    assert load_extra(logged, CONSTRAINT_FILE) != load_extra(start, CONSTRAINT_FILE)


def test_rollback_then_stop_after_max_rollbacks(tmp_path):
    # update 2: back to update 0; armed again, update 4: no rollbacks left (max_rollbacks = 1) -> stop, as a text
    # run does (tests/train/test_monitor_actions.py); the rolled-back update 2 is not checkpointed
    report = run(_planted("rollback", 6, max_rollbacks=1, checkpoint_every=2), tmp_path)
    assert _alerts(tmp_path) == [("proxy_gold", 2, "rollback"), ("proxy_gold", 4, "stop")]
    assert [r["step"] for r in _rl_rows(tmp_path)] == [1, 2, 3, 4]
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step_000000", "step_000004"]
    assert report["stopped_at"] == 4 and report["alerts"]["count"] == 2


@pytest.mark.parametrize(("monitors", "match"), [
    ({"actions": {"proxy_gold": "raise_kl"}}, "control PPO has no KL term"),
    ({"gold_every": 2}, "environment's return"),
])
def test_monitor_settings_a_control_run_cannot_honour_are_refused(monitors, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(0.0, **monitors)
