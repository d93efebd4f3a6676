"""One rank of the DDP equality test (tests/scale/test_ddp.py); run as
`torchrun --nproc_per_node 2 tests/scale/ddp_worker.py MODEL_DIR OUT_DIR [local|fsdp|hf]` or with plain python (1 rank).

Trains `STEPS` AdamW steps of the GRPO policy loss on a fixed global batch, which every rank holds (as the
loop's ranks do); each rank takes its rows and normalises by the whole batch's token count.
Rank 0 saves the first step's gradients and the final parameters to OUT_DIR/world{W}{mode}.pt.
`fsdp`: the policy is sharded with FSDP2 (`fully_shard` on each decoder layer and the root), which gathers
the weights in its forward hooks and reduce-scatters the gradients in its backward; our fused forward sees
the hooks and takes the model's own forward (`models/logprobs.py`, `fast_path_ok`).
"""

from __future__ import annotations

import os
import sys

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from feedbackrl.algos.aggregate import token_mean
from feedbackrl.algos.policy_gradient import clipped_pg_loss
from feedbackrl.models.load import load_policy
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.scale.ddp import TorchrunRanks
from feedbackrl.scale.ranks import OneProcess, Ranks
from feedbackrl.train.optim import adamw

N, P, T, STEPS = 8, 3, 5, 3


def global_batch(vocab: int) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    completion_ids = torch.randint(3, vocab, (N, T), generator=g)
    lengths = torch.tensor([5, 1, 2, 5, 3, 1, 4, 2])  # rows 0-3 hold 13 tokens, rows 4-7 hold 10: unequal shares
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    advantages = torch.randn(N, generator=g)
    return prompt_ids, prompt_mask, completion_ids, completion_mask, advantages


def full(t: Tensor) -> Tensor:
    """A plain tensor, or an FSDP2 shard (a DTensor) gathered whole."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def main() -> None:
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    ranks: Ranks = TorchrunRanks.join(torch.device("cpu"))[0] if "WORLD_SIZE" in os.environ else OneProcess()
    model = load_policy(model_dir)
    fsdp = sys.argv[3:] == ["fsdp"]
    if sys.argv[3:] == ["hf"]:  # one process through the model's own forward, the one FSDP's hooks lead to
        model.register_forward_pre_hook(lambda module, args: None)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ranks.world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # FSDP2 averages the ranks' gradients; the normalisers are already global, so the sum is wanted. A
        # divide factor of 1 alone reduces with PREMUL_SUM, which gloo refuses: force a plain SUM. Per module:
        # each fully_shard'ed module reduces its own parameters
        for m in [*model.model.layers, model]:
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    optimizer = adamw(model.parameters(), lr=1e-2, weight_decay=0.0)
    *tensors, advantages = global_batch(model.config.vocab_size)
    rows = ranks.share(N)
    mine = [t[rows] for t in tensors]
    mask = mine[3].float()
    # argv[3] == 'local': each rank normalises by its own tokens (the mistake the test must catch)
    norm = {} if sys.argv[3:] == ["local"] else {"num_tokens": float(tensors[3].sum()), "num_sequences": float(N),
                                                 "max_len": T}
    first_grads = None
    for _ in range(STEPS):
        logprobs, _ = sequence_logprobs(model, *mine)
        pg, _ = clipped_pg_loss(logprobs, logprobs.detach(), advantages[rows], mask)
        token_mean(pg, mask, **norm).backward()
        if not fsdp:
            ranks.sum_gradients(list(model.parameters()))
        if first_grads is None:
            first_grads = {k: full(p.grad).clone() for k, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = {k: full(v).clone() for k, v in model.state_dict().items()}  # every rank: a collective under FSDP
    if ranks.main:
        torch.save({"grads": first_grads, "params": params},
                   f"{out_dir}/world{ranks.world}{''.join(sys.argv[3:])}.pt")
    ranks.close()


if __name__ == "__main__":
    main()
