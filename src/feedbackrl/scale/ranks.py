"""The learner's processes as the training loops see them: `Ranks`, with this process alone (`OneProcess`) as
the default; `torchrun`'s data-parallel ranks are `scale/ddp.py:TorchrunRanks` and, with the policy sharded,
`scale/fsdp.py:ShardedRanks`. Torch only: importing this needs no optional extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import RolloutConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Collector, Scorer
from feedbackrl.episodes.kinds import InProcessCollector


class Ranks(Protocol):
    """The learner's processes: this one alone (`OneProcess`), or `torchrun`'s data-parallel ranks
    (`scale/ddp.py`: each rank trains on its share of every minibatch, gradients summed; `scale/fsdp.py`:
    the same with the policy sharded over the ranks)."""

    rank: int
    world: int
    local_world: int  # processes on this node, sharing its cores
    backend: str  # torch.distributed's: "gloo", "nccl"; "" in one process
    sharded: bool  # the policy is split over the ranks: every forward is collective, so all ranks make each one

    @property
    def main(self) -> bool: ...  # rank 0: the one that writes metrics, checkpoints and the report

    def share(self, n: int) -> slice: ...  # this rank's contiguous rows of n

    def gather(self, local: Tensor, n: int) -> Tensor: ...  # every rank's `share(n)` rows -> all n rows

    def sum(self, x: Tensor) -> Tensor: ...  # summed over the ranks

    def sum_gradients(self, params: list[Tensor]) -> None: ...

    def from_main(self, obj: Any) -> Any: ...  # rank 0's object on every rank

    def barrier(self) -> None: ...

    def sync_parameters(self, model: torch.nn.Module) -> None: ...  # rank 0's weights on every rank

    def all_done(self, done: Tensor) -> bool: ...  # (n,) rows' done flags -> stop decoding (all ranks agree if sharded)

    def shard(self, model: PreTrainedModel) -> PreTrainedModel: ...  # on this rank's device, sharded if `sharded`

    def full_model(self, model: PreTrainedModel) -> PreTrainedModel | None: ...  # whole, as saved; None off rank 0

    def full_optimizer_state(self, model: torch.nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any] | None: ...  # one process's format

    def load_model_state(self, model: torch.nn.Module, state: dict[str, Tensor]) -> None: ...  # a whole state dict

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             state: dict[str, Any]) -> None: ...  # one process's format

    def collector(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                  cfg: RolloutConfig) -> Collector: ...

    def close(self) -> None: ...


class WholePolicy:
    """The state methods of `Ranks` whose every process holds the whole policy (one process, data
    parallel): nothing to shard, gather or scatter."""

    def shard(self, model: PreTrainedModel) -> PreTrainedModel:
        return model

    def full_model(self, model: PreTrainedModel) -> PreTrainedModel | None:
        return model

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return optimizer.state_dict()

    @torch.no_grad()
    def load_model_state(self, model: torch.nn.Module, state: dict[str, Tensor]) -> None:
        model.load_state_dict(state)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)


@dataclass
class OneProcess(WholePolicy):
    """The default `Ranks`: one process, every row its own, nothing to communicate."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    backend: str = ""
    main: bool = True
    sharded: bool = False

    def share(self, n: int) -> slice:
        return slice(0, n)

    def gather(self, local: Tensor, n: int) -> Tensor:
        return local

    def sum(self, x: Tensor) -> Tensor:
        return x

    def sum_gradients(self, params: list[Tensor]) -> None:
        pass

    def from_main(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass

    def sync_parameters(self, model: torch.nn.Module) -> None:
        pass

    def all_done(self, done: Tensor) -> bool:
        return bool(done.all())

    def collector(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, scorer: Scorer,
                  cfg: RolloutConfig) -> Collector:
        return InProcessCollector(model, tokenizer, task, scorer, cfg)

    def close(self) -> None:
        pass
