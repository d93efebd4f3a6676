"""The run's summary and plot show the monitors' alerts: a count in the printed summary, a line per
alert on curves.png."""

from __future__ import annotations

import json
from pathlib import Path

from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.log import console
from feedbackrl.monitors.report import alerts_section
from feedbackrl.train import report as report_mod


def write_run(tmp_path: Path, alerts: list[dict]) -> Path:
    rows = [{"step": s, "phase": "rl", "reward/mean": 0.1 * s, "reward/gold_mean": 0.05 * s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if alerts:
        (tmp_path / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    return tmp_path


def test_alerts_are_drawn_at_their_steps_and_counted_in_the_summary(tmp_path, monkeypatch):
    alerts = [{"step": 3, "detector": "proxy_gold", "kind": "hacking"},
              {"step": 4, "detector": "length_gaming", "kind": "hacking"}]
    run = write_run(tmp_path, alerts)
    drawn = []
    monkeypatch.setattr(report_mod, "mark_alerts", lambda ax, a: drawn.append([x["step"] for x in a]))
    report_mod.write_plot(run / "metrics.jsonl", run / "curves.png", "t")
    assert drawn == [[3, 4]] and (run / "curves.png").stat().st_size > 0
    section = alerts_section(run)
    assert section["count"] == 2 and section["first_step"] == 3
    with console.capture() as cap:
        report_mod.print_report({"task": "t", "algo": "grpo", "alerts": section, "wall_seconds": 1.0,
                                 "train_seconds": 0.5})
    assert "monitors: 2 alert(s), the first at step 3 (proxy_gold x1, length_gaming x1)" in cap.get()


def test_a_run_without_alerts_says_nothing_about_them(tmp_path):
    run = write_run(tmp_path, [])
    report_mod.write_plot(run / "metrics.jsonl", run / "curves.png", "t")
    with console.capture() as cap:
        report_mod.print_report({"task": "t", "algo": "grpo", "alerts": alerts_section(run), "wall_seconds": 1.0,
                                 "train_seconds": 0.5})
    printed = cap.get()
    assert "wall time 1.0s (training 0.5s)" in printed  # the report was printed, without a line on alerts
    assert "alert" not in printed and "monitors" not in printed


def test_the_run_path_renders_prompts_with_the_models_chat_template(tmp_path, smol_lm, smol_tokenizer):
    """A model with a chat template sees every prompt through it, in eval as in training."""
    from feedbackrl.config import build_config
    from feedbackrl.train.run import run

    model_dir = tmp_path / "smol"
    smol_lm.save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    cfg = build_config({"model": {"path": str(model_dir), "system_prompt": "Be brief."},
                        "task": {"name": "addition", "heldout_size": 2},
                        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
                        "algo": {"steps": 1}, "eval": {"pass_k": 0}, "train": {"threads": 1}})
    report = run(cfg, tmp_path / "run")
    shown = report["eval_before"]["samples"][0]["prompt"]
    raw = AdditionTask().heldout(1)[0].prompt  # the task's own text, before rendering
    want = smol_tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": raw}],
                                              tokenize=False, add_generation_prompt=True)
    assert shown == want != raw and "pass@0" not in report["eval_before"]


def test_dpo_on_the_users_own_pairs_says_there_is_no_gold(tmp_path, tiny_model_dir):
    """Pairs without gold columns (a user's own data) get no gold win rate against the default task."""
    from feedbackrl.config import build_config
    from feedbackrl.train.run import run

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a)}) + "\n"
                             for a in range(8)))
    cfg = build_config({"model": {"path": str(tiny_model_dir)}, "algo": {"name": "dpo", "batch_size": 4, "epochs": 1},
                        "prefs": {"path": str(pairs)}, "task": {"heldout_size": 2}, "eval": {"pass_k": 0},
                        "train": {"threads": 1}})
    with console.capture() as cap:
        report = run(cfg, tmp_path / "run")
    assert report["prefs"]["gold"] is False and "gold_vs_sft" not in report
    assert "no gold comparison with the starting policy" in report["no_gold"] and "no gold comparison" in cap.get()
