"""The monitors on control runs: a learned reward rising while the true return falls is flagged by the same
`proxy_gold` detector as for text, its action (stop) honoured; a run whose reward model is right stays quiet."""

import json

import pytest

from feedbackrl.config import ConfigError, build_config
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


@pytest.mark.parametrize(("monitors", "match"), [
    ({"actions": {"proxy_gold": "rollback"}}, "can log or stop"),
    ({"gold_every": 2}, "environment's return"),
])
def test_monitor_settings_a_control_run_cannot_honour_are_refused(monitors, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(0.0, **monitors)
