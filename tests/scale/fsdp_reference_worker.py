"""One rank of `test_fsdp_reference_without_a_model_directory` (tests/scale/test_ddp.py); run as
`torchrun --nproc_per_node 2 tests/scale/fsdp_reference_worker.py MODEL_DIR OUT_DIR`.

A policy loaded by hub id has no model directory to point the KL reference at (`Run.start_dir` is None),
and a sharded policy cannot be deep-copied: rank 0 saves the gathered policy to OUT/reference/ and every
rank reads it back and shards it. Rank 0 saves the policy's and the reference's whole weights to OUT/ref.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.scale.fsdp import ShardedRanks
from feedbackrl.train.checkpoint import frozen_reference


def main() -> None:
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    ranks = ShardedRanks.join(torch.device("cpu"))[0]
    policy = ranks.shard(load_policy(model_dir))
    ref = frozen_reference(policy, load_tokenizer(model_dir), out_dir, None, source=None, ranks=ranks)
    weights = [{k: v.full_tensor() for k, v in m.state_dict().items()} for m in (policy, ref)]  # collective
    if ranks.main:
        torch.save({"policy": weights[0], "reference": weights[1], "frozen": all(
            not p.requires_grad for p in ref.parameters())}, out_dir / "ref.pt")
    ranks.close()


if __name__ == "__main__":
    main()
