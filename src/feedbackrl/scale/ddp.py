"""torch.distributed for the learner: `feedbackrl train` under `torchrun`, data parallel, gloo on CPUs and NCCL on GPUs.

Every rank holds the whole policy (built from the same seed, then rank 0's weights broadcast) and the
same random streams. A step:

1. Roll out: each rank generates its contiguous share of the step's N = B*G rows with the whole
   batch's padding and sampling stream (`generate(rows=...)`, as the Ray workers do: `shards.py`), the
   shares are all-gathered, and every rank advances its generator past the whole batch's draws. Every
   rank then holds the single process's batch, row for row.
2. Score on rank 0 only, the verdicts broadcast: a reward that calls a judge or a sandbox runs once per
   completion, and every rank feeds the same verdicts back to its task (adaptive difficulty stays in step).
3. Learn: each rank trains on its share of every minibatch. The losses' normalisers (token and sequence
   counts) are the whole minibatch's, which every rank can count since it holds the whole batch, so
   the ranks' gradients sum (one all-reduce per optimizer step) to the single process's gradient, and
   the identical optimizer steps keep the replicas equal.

Why not `DistributedDataParallel`'s wrapper: it prepares its gradient hooks in its `forward`, and our
training forward (`models/logprobs.py`) calls the decoder's weights directly for Llama/Qwen2 models,
never the wrapper's `forward`. The all-reduce is the same collective DDP issues, without its
bucketing and overlap with the backward pass (a GPU-scale optimisation).

Rank 0 alone writes: metrics, checkpoints, evaluations, the report. The other ranks read a checkpoint
to resume or to roll back, so OUT must be one directory they all see (one node, or a shared filesystem).
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import ConfigError, RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Scorer
from feedbackrl.episodes.single_turn import sample_owners, score_rollout
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.rollout.generate import Rollout, generate
from feedbackrl.scale.ranks import WholePolicy
from feedbackrl.scale.shards import advance, join_rollouts, shard_rows


@dataclass
class TorchrunRanks(WholePolicy):
    """The `Ranks` of a `torchrun` launch (see `scale/ranks.py`); `join` starts it."""

    rank: int
    world: int
    local_world: int  # ranks on this node, who share its cores
    backend: str
    sharded = False  # every rank holds the whole policy (`scale/fsdp.py` shards it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def join(cls, device: torch.device, timeout_s: float = 0) -> tuple[TorchrunRanks, torch.device]:
        """Join the process group `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR...): NCCL when the
        policy is on a GPU (each rank on GPU LOCAL_RANK), gloo on CPUs. -> the ranks and this rank's device.

        `timeout_s` (`scale.dist_timeout_s`): how long a collective waits for the other ranks before it fails;
        0 keeps torch's default. Rank 0 alone scores, evaluates and writes checkpoints while the others wait."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            if device.index is not None:
                raise ConfigError(f"train.device = '{device}' under torchrun: each rank takes GPU LOCAL_RANK; set "
                                  "train.device to 'cuda' or 'auto'")
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None  # None: torch's default
            dist.init_process_group(backend, timeout=timeout)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        return cls(dist.get_rank(), dist.get_world_size(), local_world, backend), device

    def share(self, n: int) -> slice:
        """This rank's contiguous rows of n (the first n % world ranks one row more)."""
        return shard_rows(n, self.world)[self.rank]

    def gather(self, local: Tensor, n: int) -> Tensor:
        """Every rank's `share(n)` rows (n_local, ...) -> all n rows in order, on every rank."""
        parts = shard_rows(n, self.world)
        width = max(s.stop - s.start for s in parts)
        padded = local.detach().new_zeros((width, *local.shape[1:]))  # all_gather wants equal shapes
        padded[: local.shape[0]] = local.detach()
        out = [torch.empty_like(padded) for _ in parts]
        dist.all_gather(out, padded)
        return torch.cat([o[: s.stop - s.start] for o, s in zip(out, parts, strict=True)])

    def sum(self, x: Tensor) -> Tensor:
        x = x.detach().clone()
        dist.all_reduce(x)
        return x

    def sum_gradients(self, params: list[Tensor]) -> None:
        """Sum every parameter's gradient over the ranks, in one flat buffer (one collective per step).

        Every rank trains on at least one row of the same model, so the same parameters hold a gradient."""
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def from_main(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled: small things only, e.g. a monitor's decision)."""
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    @torch.no_grad()
    def sync_parameters(self, model: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank (as DDP does when it wraps a model)."""
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)

    def all_done(self, done: Tensor) -> bool:
        return bool(done.all())  # each rank stops when its own rows are done: its forward calls are its own

    def collector(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                  cfg: RolloutConfig) -> ShardedCollector:
        # a task kind whose rollouts the ranks cannot share is refused before (`episodes/kinds.py:check_task_kind`)
        if cfg.weights != "fp32":
            raise ConfigError(f"torchrun: rollout.weights = {cfg.weights!r} samples in one process so far; run it "
                              "without torchrun or with rollout.weights = 'fp32'")
        return ShardedCollector(self, model, tokenizer, task, scorer, cfg)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _moved(ro: Rollout, device: torch.device | str) -> Rollout:
    """The rollout's tensors on `device` (shares travel on the CPU: a pickled GPU tensor unpickles onto the
    sender's GPU)."""
    return Rollout(**{f.name: getattr(ro, f.name).to(device) if isinstance(getattr(ro, f.name), Tensor)
                      else getattr(ro, f.name) for f in fields(ro)})


@dataclass
class ShardedCollector:
    """A `Collector` whose rows are generated by the ranks in shares, scored on rank 0 (see the module doc)."""

    ranks: TorchrunRanks
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    scorer: Scorer
    cfg: RolloutConfig

    def collect(self, prompt_rng: Any, sample_rng: torch.Generator, prefetch: bool = False) -> Batch:
        t0, c = time.perf_counter(), self.cfg
        owners = sample_owners(self.task, c, prompt_rng)  # the same problems on every rank: the same streams
        g = torch.Generator(sample_rng.device).set_state(sample_rng.get_state())
        mine = generate(self.model, self.tokenizer, [p.prompt for p in owners], c.max_new_tokens, c.temperature,
                        c.top_p, generator=g, min_new_tokens=c.min_new_tokens, rows=self.ranks.share(len(owners)),
                        all_done=self.ranks.all_done)
        parts: list[Any] = [None] * self.ranks.world
        dist.all_gather_object(parts, _moved(mine, "cpu"))
        ro = _moved(join_rollouts(parts, self.tokenizer.pad_token_id), self.model.device)
        advance(sample_rng, ro.completion_ids.shape[1], len(owners))  # exactly the single process's draws
        return score_rollout(self.task, self._score, owners, ro, t0, time.perf_counter(), c.truncated_fails)

    def _score(self, problems: list[Problem], texts: list[str]) -> tuple[list[Verdict], dict[str, float]]:
        return self.ranks.from_main(self.scorer(problems, texts) if self.ranks.main else None)

    def update(self, model: PreTrainedModel, version: int) -> None:
        pass  # every rank generates with its own replica, already updated

    def close(self) -> None:
        pass
