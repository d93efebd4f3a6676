"""Data-parallel learner: 2 `torchrun` ranks (gloo) give one process's gradients and training run, with
the whole policy on every rank (our all-reduce) or sharded by FSDP2 (`fully_shard`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # each test launches torchrun (~20 s on 2 cores)

WORKER = Path(__file__).with_name("ddp_worker.py")


def launch(model_dir: Path, out: Path, ranks: int, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, str(WORKER), str(model_dir), str(out), *extra]
    if ranks > 1:
        if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
            pytest.skip("torchrun not found")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *cmd[1:]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out / f"world{ranks}{''.join(extra)}.pt")


@pytest.fixture(scope="module")
def one(tiny_model_dir, tmp_path_factory) -> dict:
    return launch(tiny_model_dir, tmp_path_factory.mktemp("one"), 1)


def test_two_ranks_equal_one_process(tiny_model_dir, tmp_path, one):
    two = launch(tiny_model_dir, tmp_path, 2)
    for k, g in one["grads"].items():
        # the two ranks' shares hold 13 and 10 real tokens: a per-rank token mean would weigh them equally and
        # miss by ~10%; the global normaliser leaves only float summation order
        torch.testing.assert_close(two["grads"][k], g, rtol=1e-5, atol=1e-7, msg=k)
    assert any(g.abs().max() > 1e-4 for g in one["grads"].values())  # a real gradient, not zeros
    # 3 AdamW steps of lr 1e-2 later: the same parameters up to float rounding (Adam divides each gradient by
    # its own scale, so rounding in near-zero gradients shows at ~1e-5; one step moves a parameter ~1e-2)
    assert max_diff(one["params"], two["params"]) < 1e-4


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_per_rank_normalisers_would_be_caught(tiny_model_dir, tmp_path, one):
    local = launch(tiny_model_dir, tmp_path, 2, "local")
    assert max_diff(one["grads"], local["grads"]) > 1e-3 * max(g.abs().max().item() for g in one["grads"].values())
    assert max_diff(one["params"], local["params"]) > 1e-4


def test_fsdp2_two_ranks_equal_one_process(tiny_model_dir, tmp_path):
    # FSDP's forward hooks keep our fused forward off (`fast_path_ok`): compare with one process through the
    # model's own forward, which rounds differently from the fused one (9e-4 apart after these 3 steps)
    one_hf = launch(tiny_model_dir, tmp_path, 1, "hf")
    sharded = launch(tiny_model_dir, tmp_path, 2, "fsdp")
    # each rank holds half of every weight, gathered layer by layer in the forward; the gradients reduce-scattered
    for k, g in one_hf["grads"].items():
        torch.testing.assert_close(sharded["grads"][k], g, rtol=1e-5, atol=1e-7, msg=k)
    assert max_diff(one_hf["params"], sharded["params"]) < 1e-4  # 3.6e-5 measured


def test_fsdp_reference_without_a_model_directory(tiny_model_dir, tmp_path):
    # a policy loaded by hub id: the KL reference is the gathered policy, saved by rank 0 and sharded again
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(WORKER.with_name("fsdp_reference_worker.py")), str(tiny_model_dir), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "ref.pt")
    start = load_file(tiny_model_dir / "model.safetensors")
    assert out["frozen"] and sorted(out["reference"]) == sorted(out["policy"])
    assert all(torch.equal(t, out["policy"][k]) for k, t in out["reference"].items())
    saved = load_file(tmp_path / "reference" / "model.safetensors")  # what a resume reads: one process's format
    assert sorted(saved) == sorted(start) and all(torch.equal(t, start[k]) for k, t in saved.items())
