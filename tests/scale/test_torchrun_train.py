"""`feedbackrl train` under `torchrun`: 2 data-parallel ranks (gloo) against one process, and resumed.

The demo recipe, cut to 4 GRPO steps of 16 completions (2 epochs x 2 minibatches of 8 rows, so each
rank trains on 4 rows per update), a KL term, and a regex reward that a fresh tiny model passes
about a quarter of the time (the task's verifier would give all zeros, hence zero advantages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from feedbackrl.config import ConfigError, build_config
from feedbackrl.scale.threads import threads_per_process
from feedbackrl.train.context import OneProcess
from feedbackrl.train.run import check_run, start_run

RECIPE = Path(__file__).parents[2] / "recipes" / "reverse_grpo.toml"
SETS = ["sft.steps=0", "algo.steps=4", "rollout.prompts_per_step=4", "rollout.group_size=4", "algo.epochs=2",
        "algo.minibatches=2", "algo.kl_coef=0.05", "algo.lr=2e-3", "reward.source=regex", "reward.pattern=.*[a-c].*",
        "task.heldout_size=16", "eval.every=2", "eval.pass_k=0", "train.threads=1", "train.checkpoint_every=2"]
LOSSES = ("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "grad_norm")


def train(out: Path, ranks: int, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launcher, "-m", "feedbackrl.cli", "train", str(RECIPE), "--out", str(out),
           *[a for s in SETS for a in ("--set", s)], *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def rl_rows(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r.get("phase") == "rl"]
    assert len(steps) == len(set(steps)), f"a step logged twice (more than one rank writing?): {steps}"
    return {r["step"]: r for r in rows if r.get("phase") == "rl"}


def params(out: Path, step: int = 4) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


@pytest.mark.slow
def test_two_ranks_train_as_one_process_and_resume(tmp_path):
    train(tmp_path / "one", 1)
    # one process whose micro-batches are the ranks' shares: the same sums in the same order as 2 ranks
    train(tmp_path / "micro", 1, "--set", "train.micro_batch_size=4")
    log = train(tmp_path / "two", 2)
    assert "data-parallel learner: 2 ranks (gloo), 2 on this node with 1 thread(s) each" in log
    one, micro, two = (rl_rows(tmp_path / d) for d in ("one", "micro", "two"))
    assert sorted(two) == [1, 2, 3, 4]
    assert json.loads((tmp_path / "two" / "report.json").read_text())["data_parallel_ranks"] == 2
    assert len({r["reward/mean"] for r in one.values()}) > 1  # the policy learned: 0.25 -> 0.5 here

    for step in one:
        # the same completions every step: the rewards and the held-out evaluation are exactly one process's
        for key in ("reward/mean", "reward/std", "rollout/len_mean", "eval/accuracy"):
            assert two[step].get(key) == one[step].get(key), (step, key)
        # not bit for bit: each rank's training forward runs 4 rows where one process runs 8, and float
        # matmuls over other shapes round differently (here ~1e-6 relative); 2 ranks equal one process
        # with 4-row micro-batches exactly, so nothing else differs
        for key in LOSSES:
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
            assert two[step][key] == micro[step][key], (step, key)
    # 16 AdamW updates of lr 2e-3 (each moves a weight by up to 2e-3): the same weights to within 1e-4
    # (1.2e-5 measured), and exactly the micro-batched process's
    want, got, same_sums = params(tmp_path / "one"), params(tmp_path / "two"), params(tmp_path / "micro")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-4, msg=k)
        assert torch.equal(got[k], same_sums[k]), k

    # resumed from step 2 on 2 ranks: steps 3 and 4 exactly as the uninterrupted 2-rank run
    train(tmp_path / "resumed", 2, "--resume", str(tmp_path / "two" / "checkpoints" / "step_000002"))
    resumed = rl_rows(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", *LOSSES):
            assert resumed[step][key] == two[step][key], (step, key)
    assert all(torch.equal(t, got[k]) for k, t in params(tmp_path / "resumed").items())


def test_torchrun_refuses_what_does_not_run_data_parallel(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="algo.name = 'ppo' runs in one process so far"):
        check_run(build_config({"algo": {"name": "ppo"}}), None)
    with pytest.raises(ConfigError, match="rollout.backend = 'vllm'"):
        check_run(build_config({"rollout": {"backend": "vllm"}}), None)
    with pytest.raises(ConfigError, match="use one or the other"):
        check_run(build_config({"scale": {"rollout_workers": 1}}), None)
    monkeypatch.setenv("WORLD_SIZE", "5")
    with pytest.raises(ConfigError, match="a minibatch holds 4 rows"):
        check_run(build_config({"rollout": {"prompts_per_step": 2, "group_size": 4}, "algo": {"minibatches": 2}}),
                  None)


def test_ranks_on_one_node_share_its_cores(tmp_path):
    ranks = OneProcess(local_world=2)  # what a torchrun rank reports: 2 ranks on this node
    start_run(build_config({"train": {"threads": 0}}), tmp_path, ranks)
    assert torch.get_num_threads() == threads_per_process(2)
    start_run(build_config({"train": {"threads": 0}}), tmp_path)
    assert torch.get_num_threads() == threads_per_process(1)
