"""The sharded learner: `feedbackrl train` under `torchrun` with `scale.learner = "fsdp"` (FSDP2).

The data-parallel step of `scale/ddp.py` (each rank generates and trains on its share of the rows, with
the whole minibatch's normalisers), with the policy, and the KL reference when there is one, split over
the ranks by `torch.distributed.fsdp.fully_shard`: one unit per decoder layer and one for the root
(embeddings, final norm, head), so a rank holds 1/world of every weight and of the AdamW state and
gathers one layer's weights at a time in the forward.

What sharding changes, beside the model:

- Every forward is collective (it all-gathers the weights), so every rank makes the same calls:
  - Decoding: each rank generates its share of the rows and the ranks agree at every decode step
    whether all rows of the whole batch are done (`all_done`, one all-reduce of one integer per
    token). The other way, every rank generating the whole batch, would also agree, but only while the
    ranks compute bit-identical stop decisions (a GPU kernel that rounds differently on one rank would
    hang the others in the next all-gather), and it makes every rank do the whole batch's work.
  - The training forwards: `check_run` asks for equal minibatch shares, so the shares split into
    the same number of micro-batches on every rank.
  - The held-out evaluations run on every rank (rank 0 writes), with the same agreement.
- The gradients: FSDP2 reduce-scatters them in the backward and averages by default; the loop's
  normalisers are already global, so the sum is wanted: `set_gradient_divide_factor(1.0)` and
  `set_force_sum_reduction_for_comms(True)` (a plain SUM; gloo refuses the PREMUL_SUM a divide factor
  alone asks for) on every `fully_shard`ed module, since each reduces its own parameters.
- Checkpoints gather the weights and the AdamW state to rank 0 (`torch.distributed.checkpoint.state_dict`,
  `full_state_dict=True`), which writes them in one process's format: a single process resumes or
  evaluates the checkpoint, and the ranks resume by reading it whole and sharding it again.
- `train.precision = "bf16"` is the loop's autocast, as in one process (`models/policy.py`): FSDP2 gathers
  the float32 shards and autocast casts them to bf16 op by op, so the weights, gradients, reduce-scatter
  and AdamW state stay float32 and the matmuls are one process's bf16 matmuls. Not FSDP2's
  `MixedPrecisionPolicy(param_dtype=bfloat16)`: it casts at module level, for every forward (decoding too,
  which one process runs in float32) and keeps the norms, embeddings and residual stream in bf16 as well;
  on the test model its log-probs were 5.7e-3 from one process's autocast, where autocast sharded is 0.
- The KL reference is read from the model directory the policy started from (`Run.start_dir`), or, for
  a policy without one (loaded by hub id), from the gathered copy rank 0 writes to OUT/reference/, and
  sharded the same way, since a sharded model cannot be deep-copied (`train.checkpoint.frozen_reference`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, PreTrainedModel

from feedbackrl.config import ConfigError
from feedbackrl.scale.ddp import TorchrunRanks

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
_SCATTER = StateDictOptions(full_state_dict=True)  # every rank passes the whole state; each keeps its shard


class ShardedRanks(TorchrunRanks):
    """The `Ranks` of a `torchrun` launch whose policy is sharded with FSDP2 (see the module doc)."""

    sharded = True

    def sum_gradients(self, params: list[Tensor]) -> None:
        pass  # FSDP2 reduce-scatters (sums) them in the backward

    def sync_parameters(self, model: torch.nn.Module) -> None:
        pass  # every rank loaded the same weights and kept its shard of them

    def all_done(self, done: Tensor) -> bool:
        not_done = (~done).sum().reshape(1)  # an int64 on the model's device (NCCL wants the GPU)
        dist.all_reduce(not_done)
        return int(not_done) == 0

    def shard(self, model: PreTrainedModel) -> PreTrainedModel:
        """`fully_shard` each decoder layer, then the root; the shards go to this rank's device."""
        units = [*_decoder_layers(model), model]  # refused before the first collective (the mesh's)
        mesh = init_device_mesh("cuda" if self.backend == "nccl" else "cpu", (self.world,))
        for unit in units:
            # the root too (FSDP2 keeps a root's weights gathered after its forward by default): after a no-grad
            # forward (decoding, evaluation) nothing else frees them, and `parameters()` would then list the
            # gathered tensors instead of the shards the optimizer and the state dicts must see
            fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        for unit in units:
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        return model

    def full_model(self, model: PreTrainedModel) -> PreTrainedModel | None:
        """On rank 0: an unsharded model of the same class holding the gathered weights on the CPU (it
        saves as one process's model would); None on the other ranks. Every rank must call it."""
        state = get_model_state_dict(model, options=_GATHER)
        if not self.main:
            return None
        with torch.device("meta"):  # no second allocation: the gathered tensors become the parameters
            whole = AutoModelForCausalLM.from_config(model.config)
        whole.load_state_dict(state, assign=True)
        whole.tie_weights()  # assigning untied the shared embedding and head (one tensor in one process)
        whole.generation_config = model.generation_config
        return whole

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """On rank 0: the optimizer's whole state in one process's `optimizer.state_dict()` format (parameters
        numbered in the order the optimizer holds them); None on the other ranks. Every rank must call it."""
        state = get_optimizer_state_dict(model, optimizer, options=_GATHER)
        if not self.main:
            return None
        index = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
        return {"state": {index[name]: s for name, s in state["state"].items()},
                "param_groups": [{**g, "params": [index[name] for name in g["params"]]}
                                 for g in state["param_groups"]]}

    def load_model_state(self, model: torch.nn.Module, state: dict[str, Tensor]) -> None:
        set_model_state_dict(model, state, options=_SCATTER)

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             state: dict[str, Any]) -> None:
        """One process's optimizer state (read whole by every rank) -> this rank's shard of it."""
        names = _optimizer_names(model, optimizer)
        by_name = {"state": {names[i]: s for i, s in state["state"].items()},
                   "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=_SCATTER)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ConfigError(f"scale.learner = 'fsdp' shards decoder layers at model.model.layers (Llama, Qwen2, "
                          f"Mistral and most causal LMs); {type(model).__name__} has none: use scale.learner = 'ddp'")
    return list(layers)


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order one process's `state_dict()` numbers them."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
