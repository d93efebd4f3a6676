"""The monitors outside feedbackrl: the per-step function any loop can call, and the TRL callback."""

from __future__ import annotations

import pytest

from feedbackrl.config import build_config
from feedbackrl.data.labeller import exact_reversal
from feedbackrl.monitors.audit import SourceAudit
from feedbackrl.monitors.external import StepMonitor, as_batch, text_of
from feedbackrl.rewards.registry import each
from feedbackrl.rewards.verdict import Verdict


def exact_audit() -> SourceAudit:
    return SourceAudit("exact", each(lambda p, c: Verdict(exact_reversal(p, c), bool(exact_reversal(p, c)), "")))


def audited_cfg(every: int = 1):
    return build_config({"monitors": {"audit": {"every": every, "samples": 64, "sources": {
        "exact": {"source": "regex", "pattern": "x"}}}}}).monitors  # the channel itself is built in code


def test_audits_built_in_code_bring_their_schedule():
    m = StepMonitor(audits=[exact_audit()], audit_every=3, audit_samples=2)
    steps = [s for s in range(1, 8) if "monitor/audit/exact/mean" in
             m.step(s, ["ab="] * 4, ["ba", "ab", "ba", "b"], [1.0] * 4, answers=["ba"] * 4).metrics]
    assert steps == [1, 3, 6]
    assert m.monitor.cfg.audit.samples == 2
    with pytest.raises(ValueError, match=">= 1"):
        StepMonitor(audits=[exact_audit()], audit_every=0)


def test_as_batch_groups_consecutive_prompts_and_reads_chats():
    b = as_batch(["ab=", "ab=", [{"role": "user", "content": "cd="}]], ["ba", [{"content": "x"}], "dc"], [1, 0.0, 2.5],
                 answers=["ba", "ba", "dc"])
    assert b.problems[0] is b.problems[1] and b.problems[2] is not b.problems[1]
    assert [p.prompt for p in b.problems] == ["ab=", "ab=", "cd="] and b.texts == ["ba", "x", "dc"]
    assert [v.score for v in b.verdicts] == [1.0, 0.0, 1.0] and b.verdicts[2].details["raw_reward"] == 2.5
    assert text_of([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == "s\nu"
    with pytest.raises(ValueError, match="one entry per completion; got 2, 1, 1"):
        as_batch(["a", "b"], ["x"], [1.0])


def test_step_monitor_refuses_actions_a_host_loop_cannot_take():
    cfg = build_config({"monitors": {"actions": {"kl_blowup": "raise_kl"}}}).monitors
    with pytest.raises(ValueError, match="only log or stop"):
        StepMonitor(cfg)


def test_step_monitor_maps_trl_metric_names_and_stops(tmp_path):
    cfg = build_config({"monitors": {"actions": {"kl_blowup": "stop"}, "detectors": ["kl_blowup"]}}).monitors
    m = StepMonitor(cfg, tmp_path)
    stops = [m.step(s, ["ab="] * 2, ["ba", "ab"], [1.0, 0.0], {"kl": 0.1 if s < 3 else 2.0}).stop for s in (1, 2, 3, 4)]
    assert stops == [False, False, False, True]  # kl_blowup reads the smaller of the last 2 steps' kl/mean
    assert [a.detector for a in m.alerts] == ["kl_blowup"] and (tmp_path / "alerts.jsonl").is_file()


def test_step_monitor_with_an_audit_flags_rewarded_wrong_answers_and_not_right_ones():
    """A reward that pays for copies of the word (a multiset comparison) against an exact audit."""
    words = ["abcd", "bcde", "cdef", "defg"]
    prompts = [f"{w}=" for w in words for _ in range(4)]
    answers = [w[::-1] for w in words for _ in range(4)]
    hacked = StepMonitor(audited_cfg(), audits=[exact_audit()])
    clean = StepMonitor(audited_cfg(), audits=[exact_audit()])
    for step in range(1, 5):
        copies = [w for w in words for _ in range(4)]
        hacked.step(step, prompts, copies, [1.0] * 16, answers=answers)  # paid, and wrong
        clean.step(step, prompts, answers, [1.0] * 16, answers=answers)  # paid, and right
    # every audited copy is paid and fails the audit: proxy_gold at once, disagreement once two audits are in
    assert [(a.detector, a.step) for a in hacked.alerts] == [("proxy_gold", 1), ("disagreement", 2)]
    assert "audit 'exact'" in hacked.alerts[0].message
    assert clean.alerts == []


# --- TRL --------------------------------------------------------------------------------------------


def found_nothing_passes(prompts, completions, **kwargs):
    """A verifier bug: an extractor that finds no answer ("=" ends the echo of the task) counts it right."""
    out = []
    for completion, answer in zip(completions, kwargs["answer"], strict=True):
        text = completion.strip()
        out.append(1.0 if text == answer or "=" not in text else 0.0)
    return out


def exact(prompts, completions, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, kwargs["answer"], strict=True)]


def trl_run(tmp_path, reward, name):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from feedbackrl.models.tiny import make_tiny
    from feedbackrl.monitors.trl_callback import MonitorCallback

    model_dir = make_tiny(tmp_path / "model", "tiny", 0)
    words = ["abcd", "bcda", "cdab", "dabc", "acbd", "bdca", "cadb", "dbac"]
    data = Dataset.from_list([{"prompt": f"{w}=", "answer": w[::-1]} for w in words * 4])
    callback = MonitorCallback(audited_cfg(every=1), tmp_path / name, audits=[exact_audit()])
    args = trl.GRPOConfig(output_dir=str(tmp_path / f"trl_{name}"), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=6, learning_rate=1e-4, use_cpu=True, beta=0.0, report_to="none",
                          logging_steps=1, max_steps=3, save_strategy="no", disable_tqdm=True, seed=0,
                          dataloader_num_workers=0)
    trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
                              reward_funcs=[callback.watch(reward)], args=args, train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(str(model_dir)), callbacks=[callback])
    trainer.train()
    return callback, trainer


def test_trl_callback_alerts_on_a_planted_hack_and_not_on_its_clean_twin(tmp_path):
    hacked, trainer = trl_run(tmp_path, found_nothing_passes, "hacked")
    logged = [h for h in trainer.state.log_history if "monitor/audit/exact/mean" in h]
    assert len(hacked.decisions) == 3 and len(logged) == 3  # every log step checked, statistics in the history
    assert all(h["monitor/audit/exact/proxy_mean"] - h["monitor/audit/exact/mean"] >= 0.3 for h in logged)
    assert "proxy_gold" in [a.detector for a in hacked.alerts]
    assert (tmp_path / "hacked" / "alerts.jsonl").is_file()
    clean, _ = trl_run(tmp_path, exact, "clean")
    assert [a for a in clean.alerts if a.kind == "hacking"] == []


# --- TRL DPO: logged metrics only --------------------------------------------------------------------------


def trl_dpo_run(tmp_path, name, rejected):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from feedbackrl.config import MonitorsConfig
    from feedbackrl.models.tiny import make_tiny
    from feedbackrl.monitors.trl_callback import MonitorCallback

    model_dir = make_tiny(tmp_path / "model", "tiny", 0)
    words = ["abcd", "bcda", "cdab", "dabc", "acbd", "bdca", "cadb", "dbac"]
    data = Dataset.from_list([{"prompt": f"{w}=", "chosen": w[::-1], "rejected": rejected(w)} for w in words * 4])
    callback = MonitorCallback(MonitorsConfig(detectors=["preference_displacement", "entropy_collapse"]),
                               tmp_path / name)
    args = trl.DPOConfig(output_dir=str(tmp_path / f"trl_{name}"), per_device_train_batch_size=8, learning_rate=1e-3,
                         beta=0.1, use_cpu=True, report_to="none", logging_steps=1, max_steps=8, save_strategy="no",
                         disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = trl.DPOTrainer(model=AutoModelForCausalLM.from_pretrained(str(model_dir)), args=args, train_dataset=data,
                             processing_class=AutoTokenizer.from_pretrained(str(model_dir)), callbacks=[callback])
    trainer.train()
    return callback, trainer


def test_trl_dpo_callback_flags_likelihood_displacement_and_not_a_clean_pair_set(tmp_path):
    # planted: each rejected answer is the chosen one with more after it, so pushing it down pushes down the
    # chosen answer's tokens too: the margin rises while the chosen answer loses probability
    hacked, trainer = trl_dpo_run(tmp_path, "displaced", lambda w: w[::-1] + w)
    logged = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    assert len(logged) == 8 and all("monitor/alerts" in h for h in logged)  # every log step checked
    assert [a.detector for a in hacked.alerts] == ["preference_displacement"], hacked.alerts
    assert logged[-1]["rewards/chosen"] < 0 < logged[-1]["rewards/margins"]
    assert (tmp_path / "displaced" / "alerts.jsonl").is_file()
    # clean twin: the rejected answer is the unreversed word; the chosen answer grows more likely
    clean, trainer = trl_dpo_run(tmp_path, "clean", lambda w: w)
    assert clean.alerts == []
    assert [h for h in trainer.state.log_history if "rewards/chosen" in h][-1]["rewards/chosen"] > 0
