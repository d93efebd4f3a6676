"""How many threads each process may use, so that workers on one node never fight over cores.

PyTorch defaults to one intra-op thread per core it *sees* (`os.cpu_count()`), which counts the node's
cores, not the ones this process may run on (CPU affinity, a container's cgroup quota), nor the
other workers started on the same node. Oversubscribed OpenMP threads are slow twice over: the team
waits at every barrier for a thread that is descheduled, and with libgomp's default wait policy the
waiting threads spin for a while before sleeping, burning the time slice the late thread needs.

`available_cores` reads what this process may use; `threads_per_process` splits it between the
workers of one node; `worker_env` is the environment a freshly started worker (a Ray actor, a
`torchrun` rank) gets so that OpenMP starts with that budget and waits passively. The wait policy is
read once, when libgomp loads with torch, so it can only be set for a process that has not yet
imported torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup v2 CPU quota in cores (`cpu.max` = "quota period"), or None when unlimited or absent."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def affinity_cores() -> int:
    """Cores this process may be scheduled on (its CPU affinity mask); all cores where there is none."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_cores(root: Path = CGROUP_ROOT) -> float:
    """min(affinity, cgroup quota): the cores' worth of CPU time this process can get at most."""
    cores: float = affinity_cores()
    quota = cgroup_cpu_quota(root)
    return min(cores, quota) if quota is not None else cores


def threads_per_process(workers_per_node: int = 1, requested: int = 0, cores: float | None = None) -> int:
    """Intra-op threads for each of `workers_per_node` processes sharing this node's available cores.

    `requested` > 0 wins (the recipe's `train.threads`); otherwise floor(cores / workers), at least 1.
    """
    if workers_per_node < 1:
        raise ValueError(f"workers_per_node must be >= 1, got {workers_per_node}")
    if requested > 0:
        return requested
    cores = available_cores() if cores is None else cores
    return max(1, math.floor(cores / workers_per_node))


def worker_env(threads: int) -> dict[str, str]:
    """Environment for a new worker process: its thread budget, and OpenMP threads that sleep when idle."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def set_threads(threads: int) -> int:
    """Give torch (and the decode kernel, which reads torch's count) `threads` intra-op threads; returns it."""
    torch.set_num_threads(threads)
    return threads
