"""torch.distributed for the learner: data parallel over `torchrun` ranks, gloo on CPUs and NCCL on GPUs.

Each rank trains on its rows of the global minibatch. The losses' normalisers (`algos/aggregate.py`:
the minibatch's real-token count, its sequence count) must be the *global* minibatch's, as they are
for micro-batches in one process; the ranks' gradients are then summed (one all-reduce per optimizer
step), which is the global minibatch's gradient. 2 ranks give the gradient of one process on the same
global batch (`tests/scale/test_ddp.py`, run with `torchrun`).

Why not `DistributedDataParallel`'s wrapper: it prepares its gradient hooks in its `forward`, and our
training forward (`models/logprobs.py`) calls the decoder's layers directly for Llama/Qwen2 models,
never the wrapper's `forward`. The all-reduce is the same collective DDP issues, without its
bucketing and overlap with the backward pass (a GPU-scale optimisation).

What is not here yet: the GRPO loop on ranks (rank 0 collecting and scattering each step's batch),
and FSDP2 for models that do not fit one device.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor


def init_from_env() -> tuple[int, int]:
    """Join the process group `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR...); (rank, world size).

    A plain `python` launch is rank 0 of 1 and starts no process group.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), world


def rank_rows(n: int, rank: int, world: int) -> slice:
    """This rank's contiguous rows of a global minibatch of n rows (n must divide evenly: equal shares)."""
    if n % world:
        raise ValueError(f"a global minibatch of {n} rows does not split evenly over {world} ranks")
    share = n // world
    return slice(rank * share, (rank + 1) * share)


def global_normalisers(mask: Tensor, max_len: int) -> dict[str, float]:
    """(n_local, T) this rank's mask -> the aggregation normalisers of the global minibatch (all ranks' rows)."""
    counts = torch.tensor([float(mask.sum()), float(mask.shape[0])], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(counts)
    return {"num_tokens": counts[0].item(), "num_sequences": counts[1].item(), "max_len": max_len}


def allreduce_gradients(params: list[Tensor]) -> None:
    """Sum every parameter's gradient over the ranks, in one flat buffer (one collective per step)."""
    if not dist.is_initialized():
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
