"""Learning works: SFT on noisy demonstrations, then a short GRPO run against the truthful
verifier raises held-out accuracy well beyond seed noise. Before/after numbers are in the
assertion messages."""

from __future__ import annotations

import time
from pathlib import Path

from feedbackrl.config import build_config
from feedbackrl.data.rows import read_jsonl
from feedbackrl.envs.registry import make_task
from feedbackrl.log import JsonlSink
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.run import run_eval
from feedbackrl.train.sft import sft_warmstart

# Short words over 5 letters; the annotator copies instead of reversing 4+-letter words 70% of
# the time, so after SFT greedy decoding gets most long words wrong.
RECIPE = {
    "task": {"name": "reverse", "heldout_size": 100,
             "options": {"min_len": 3, "max_len": 5, "alphabet_size": 5, "demo_noise": 0.7, "sloppy_from": 4}},
    "sft": {"steps": 250, "batch_size": 64, "lr": 3e-3},
    "rollout": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 6},
    # 40 steps passed at seed 0 but not at seeds 1-2 (train reward +0.08), so float rounding alone (a
    # different forward) could fail it; at 60 steps seeds 0-2 gain 0.21 / 0.11 / 0.15 train reward
    "algo": {"steps": 60, "lr": 5e-4},
    "eval": {"pass_k": 4},
    "train": {"seed": 0},
}


def test_grpo_raises_heldout_accuracy_over_noisy_sft(tmp_path: Path) -> None:
    cfg = build_config(RECIPE)
    task = make_task(cfg.task)
    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    t0 = time.perf_counter()
    sft_warmstart(model, tok, task, cfg.sft, cfg.train.seed, sink)
    before = run_eval(model, tok, task, cfg)
    train_grpo(cfg, model, tok, task, tmp_path, sink)
    after = run_eval(model, tok, task, cfg)
    sink.close()
    msg = f"held-out greedy accuracy {before.accuracy:.2f} -> {after.accuracy:.2f} ({time.perf_counter() - t0:.0f}s)"
    print(msg)
    assert 0.1 <= before.accuracy <= 0.8, "SFT should leave a middling policy; " + msg
    assert after.accuracy >= before.accuracy + 0.15, msg
    rewards = [r["reward/mean"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("phase") == "rl"]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, f"train reward {first:.2f} -> {last:.2f}; " + msg


def test_sft_as_the_algorithm_raises_heldout_accuracy_through_the_run_path(tmp_path: Path) -> None:
    """algo.name = "sft": the run path evaluates the untrained policy, runs the SFT steps, evaluates again."""
    from feedbackrl.train.run import run

    recipe = {**RECIPE, "algo": {"name": "sft"}, "sft": {"steps": 150, "batch_size": 64, "lr": 3e-3},
              "task": {**RECIPE["task"], "heldout_size": 50,
                       "options": {**RECIPE["task"]["options"], "demo_noise": 0.0}},
              "train": {"seed": 0, "threads": 1}}
    report = run(build_config(recipe), tmp_path)
    before, after = report["eval_before"]["accuracy"], report["eval_after"]["accuracy"]
    assert report["algo"] == "sft" and report["steps"] == 150 and (tmp_path / "sft_policy" / "config.json").is_file()
    assert before <= 0.05 and after >= before + 0.3, f"held-out greedy accuracy {before:.2f} -> {after:.2f}"
