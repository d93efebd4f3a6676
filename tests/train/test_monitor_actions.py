"""Each monitor action on a short real run: stop, roll back to the last checkpoint, raise the KL coefficient.

A detector configured to fire on every step (zero_variance with window 1 and threshold 0) triggers the
action at a known step, so each test knows exactly what the loop must have done.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from feedbackrl.config import RunConfig, build_config
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.checkpoint import latest_checkpoint
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.ppo import train_ppo


@dataclass
class LetterReverse(ReverseTask):
    """Partial credit (the fraction of lowercase letters), so a random policy's rewards differ and it moves."""

    def verify(self, problem: Problem, completion: str) -> Verdict:
        score = sum(c.islower() for c in completion[:4]) / 4
        return Verdict(score, score == 1.0, f"{score:.2f} letters")


ALWAYS = {"zero_variance": {"window": 1, "max_frac": 0.0}}


def config(steps: int, action: str, algo: str = "grpo", **extra: object) -> RunConfig:
    return build_config({
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
        "algo": {"name": algo, "steps": steps, "lr": 1e-2, **({"minibatches": 1} if algo == "ppo" else {})},
        "train": {"threads": 1, **extra},
        "monitors": {"detectors": ["zero_variance"], "options": ALWAYS, "actions": {"zero_variance": action}},
    })


def run(tiny_model_dir, tmp_path, cfg: RunConfig):
    model, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    sink = MemorySink()
    train = train_ppo if cfg.algo.name == "ppo" else train_grpo
    train(cfg, model, tok, LetterReverse(), tmp_path, sink)
    return model, sink


def test_stop_ends_the_run_at_the_alert(tiny_model_dir, tmp_path):
    _, sink = run(tiny_model_dir, tmp_path, config(5, "stop"))
    assert [s for s, _ in sink.rows] == [1]
    assert latest_checkpoint(tmp_path).name == "step_000001"  # the final checkpoint names the step it stopped at
    alerts = read_jsonl(tmp_path / "alerts.jsonl")
    assert [(a["detector"], a["step"], a["action"]) for a in alerts] == [("zero_variance", 1, "stop")]
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 8  # 8 completions, all of them (default 8 per step)


def test_rollback_restores_the_last_checkpoint(tiny_model_dir, tmp_path):
    # the alert at step 1 rolls back to the checkpoint saved before step 1: the final weights are the start's
    model, sink = run(tiny_model_dir, tmp_path, config(1, "rollback"))
    start = load_policy(str(tiny_model_dir)).state_dict()
    assert all(torch.equal(t, start[k]) for k, t in model.state_dict().items())
    assert [a["action"] for a in read_jsonl(tmp_path / "alerts.jsonl")] == ["rollback"]
    # control: the same step without the monitor moves the weights
    moved, _ = run(tiny_model_dir, tmp_path / "control", config(1, "log"))
    assert any(not torch.equal(t, start[k]) for k, t in moved.state_dict().items())


def test_rollback_then_stop_after_max_rollbacks(tiny_model_dir, tmp_path):
    cfg = config(6, "rollback", checkpoint_every=2)
    cfg.monitors.max_rollbacks = 2
    _, sink = run(tiny_model_dir, tmp_path, cfg)
    # step 1: back to step 0; re-armed, step 2: back to step 0 again; step 3: no rollbacks left -> stop
    assert [s for s, _ in sink.rows] == [1, 2, 3]
    assert [a["action"] for a in read_jsonl(tmp_path / "alerts.jsonl")] == ["rollback", "rollback", "stop"]
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step_000000", "step_000003"]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_raise_kl_turns_on_the_penalty(tiny_model_dir, tmp_path, algo):
    cfg = config(3, "raise_kl", algo)
    cfg.algo.kl_coef = 0.0
    _, sink = run(tiny_model_dir, tmp_path, cfg)
    # fires once at step 1 (0 -> the floor 0.05), logged from step 2 on
    assert [m["algo/kl_coef"] for _, m in sink.rows] == [0.0, 0.05, 0.05]
    if algo == "grpo":
        assert sink.rows[0][1]["loss/kl"] == 0.0 and sink.rows[2][1]["loss/kl"] != 0.0


def test_ppo_rolls_back_policy_and_value_head(tiny_model_dir, tmp_path):
    model, _ = run(tiny_model_dir, tmp_path, config(1, "rollback", "ppo"))
    start = load_policy(str(tiny_model_dir)).state_dict()
    assert all(torch.equal(t, start[k]) for k, t in model.state_dict().items())
    head = torch.load(tmp_path / "checkpoints" / "step_000001" / "value_head.pt")
    assert all(not t.any() for t in head.values())  # the zero-initialised head of step 0, not step 1's


def test_the_built_monitor_checks_gold_with_the_tasks_hidden_score(tmp_path):
    from feedbackrl.envs.planted import PlantedReverse
    from feedbackrl.train.monitoring import live_monitor

    cfg = build_config({"monitors": {"gold_every": 4}})
    task = PlantedReverse(hack="length_bias")
    problem = task._problem("abcde")
    mon = live_monitor(cfg, tmp_path, None, task)
    # the proxy pays 1.0 for the answer padded to 10 letters; the gold check gives it 0
    assert task.verify(problem, "edcbaxxxxx").score == 1.0
    assert (mon.gold(problem, "edcbaxxxxx"), mon.gold(problem, "edcba")) == (0.0, 1.0)
    assert live_monitor(build_config({}), tmp_path, None, task).gold is None  # no gold_every, no gold
    assert live_monitor(build_config({"monitors": {"enabled": False}}), tmp_path, None, task) is None


def test_monitors_reference_logs_kl_without_a_penalty(tiny_model_dir, tmp_path):
    """`monitors.reference`: a frozen reference at kl_coef = 0, so kl_per_reward has a KL to read; the loss
    is the plain policy loss (same parameters as the run without it)."""
    base = build_config({
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
        "algo": {"steps": 2, "lr": 1e-2, "kl_coef": 0.0}, "train": {"threads": 1},
        "monitors": {"detectors": ["kl_per_reward"]}})
    with_ref = base.model_copy(update={"monitors": base.monitors.model_copy(update={"reference": True})})
    model_ref, ref_sink = run(tiny_model_dir, tmp_path / "ref", with_ref)
    model_plain, plain_sink = run(tiny_model_dir, tmp_path / "plain", base)
    assert [m["kl/mean"] for _, m in plain_sink.rows] == [0.0, 0.0]  # no reference: nothing to compare with
    kl = [m["kl/mean"] for _, m in ref_sink.rows]
    assert kl[0] == 0.0 < kl[1], kl  # step 1 samples from the reference itself; step 2 from the updated policy
    plain = model_plain.state_dict()
    assert all(torch.equal(t, plain[k]) for k, t in model_ref.state_dict().items())
