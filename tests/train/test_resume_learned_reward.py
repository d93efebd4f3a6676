"""On-policy RL against a learned reward model goes through the same run path as GRPO against a
verifier, so it resumes bit-exactly too: stopped at step 2 and resumed, GRPO and PPO (value head
included) end where the uninterrupted run ends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from feedbackrl.config import build_config
from feedbackrl.data.rows import read_jsonl
from feedbackrl.train.run import run


def config(model_dir: Path, reward_dir: Path, algo: str):
    epochs = {"epochs": 2, "minibatches": 2}
    return build_config({
        "model": {"path": str(model_dir)}, "reward": {"model": str(reward_dir)},
        "task": {"name": "reverse", "heldout_size": 4},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
        "algo": {"name": algo, "steps": 4, **epochs, "kl_coef": 0.1, "lr": 1e-2},
        "eval": {"pass_k": 2}, "train": {"seed": 5, "checkpoint_every": 2, "threads": 1},
    })


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rl_against_a_learned_reward_resumes_bit_exactly(tiny_model_dir: Path, reward_model_dir: Path,
                                                         tmp_path: Path, algo: str):
    cfg = config(tiny_model_dir, reward_model_dir, algo)
    full = tmp_path / "full"
    report = run(cfg, full)
    assert report["reward"] == str(reward_model_dir) and "gold_vs_sft" in report
    # the KL reference is the model the run loaded: recorded by path, not copied
    assert json.loads((full / "reference.json").read_text())["path"] == str(tiny_model_dir.resolve())
    assert not (full / "reference").exists()
    # interrupt a copy after step 2: drop what the last two steps wrote, then resume from its run dir
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    kept = [r for r in read_jsonl(full / "metrics.jsonl") if r["step"] <= 2 and r.get("phase") != "eval" or
            r["step"] == 0]
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    resumed = run(cfg, cut, resume=cut)
    assert resumed["resumed_from"].endswith("step_000002")
    a, b = weights(full, 4), weights(cut, 4)
    if algo == "ppo":
        heads = [torch.load(d / "checkpoints" / "step_000004" / "value_head.pt") for d in (full, cut)]
        a.update({f"value_head.{k}": v for k, v in heads[0].items()})
        b.update({f"value_head.{k}": v for k, v in heads[1].items()})
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resuming"
    rl = {r["step"]: r for r in read_jsonl(full / "metrics.jsonl") if r.get("phase") == "rl"}
    rl_resumed = {r["step"]: r for r in read_jsonl(cut / "metrics.jsonl") if r.get("phase") == "rl"}
    for step in (3, 4):  # the learned reward's proxy and the hidden gold of the same completions
        for key in ("reward/mean", "reward/gold_mean", "reward/raw_mean", "loss/policy", "kl/mean", "grad_norm"):
            assert rl[step][key] == rl_resumed[step][key], (step, key)
    assert resumed["eval_after"] == report["eval_after"]


def test_a_resume_whose_reference_model_is_gone_says_which(tiny_model_dir: Path, reward_model_dir: Path,
                                                           tmp_path: Path):
    import pytest

    from feedbackrl.train.checkpoint import CheckpointError

    cfg = config(tiny_model_dir, reward_model_dir, "grpo")
    run_dir = tmp_path / "run"
    run(cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"steps": 2})}), run_dir)
    (run_dir / "reference.json").write_text(json.dumps({"path": str(tmp_path / "moved")}))
    with pytest.raises(CheckpointError, match="no longer exists"):
        run(cfg, run_dir, resume=run_dir)
