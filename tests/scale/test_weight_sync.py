"""The collective weight sync's pieces without Ray: which tensors go, how they are packed, how a worker binds them.

The broadcast itself, between the learner and Ray workers, is tested in `test_ray.py`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from feedbackrl.config import build_config
from feedbackrl.scale.weight_sync import bind_flat, check_layout, flatten, group_backend, layout, unique_tensors


class Tied(nn.Module):
    """An embedding tied to the output layer, a bias and an integer buffer: what the packing must handle."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(3, 2)
        self.head = nn.Linear(2, 3)
        self.head.weight = self.embed.weight  # tied: one tensor under two keys
        self.register_buffer("steps", torch.tensor([7, 8], dtype=torch.int64))
        with torch.no_grad():
            self.embed.weight.copy_(torch.arange(6.0).reshape(3, 2))  # [[0, 1], [2, 3], [4, 5]]
            self.head.bias.copy_(torch.tensor([10.0, 11.0, 12.0]))


def test_a_tied_tensor_is_sent_once_under_its_first_key():
    state = Tied().state_dict()
    assert list(state) == ["steps", "embed.weight", "head.weight", "head.bias"]
    assert list(unique_tensors(state)) == ["steps", "embed.weight", "head.bias"]
    assert layout(state) == [("steps", (2,), "torch.int64"), ("embed.weight", (3, 2), "torch.float32"),
                             ("head.bias", (3,), "torch.float32")]


def test_flatten_packs_one_buffer_per_dtype_in_state_dict_order():
    flats = flatten(Tied().state_dict(), torch.device("cpu"))
    assert list(flats) == [torch.int64, torch.float32]
    assert flats[torch.int64].tolist() == [7, 8]
    assert flats[torch.float32].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0]  # embed, then bias


def test_bind_flat_makes_the_model_a_view_of_its_buffers():
    model, source = Tied(), Tied()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(-1)
    x = torch.tensor([[0.5, -1.0]])
    before = model.head(x)
    flats = bind_flat(model)
    assert torch.equal(model.head(x), before)  # values kept
    assert model.head.weight is model.embed.weight  # still tied, still the same Parameter objects
    # what a broadcast does: write the learner's buffers into the worker's, in place
    for dtype, flat in flatten(source.state_dict(), torch.device("cpu")).items():
        flats[dtype].copy_(flat)
    for key, want in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], want), key
    assert model.embed.weight.tolist() == [[-0.0, -1.0], [-2.0, -3.0], [-4.0, -5.0]]
    assert torch.equal(model.head(x), source.head(x))


def test_a_worker_model_of_another_architecture_is_refused():
    mine = layout(Tied().state_dict())
    check_layout(mine, mine)
    other = [*mine[:2], ("head.bias", (4,), "torch.float32")]
    with pytest.raises(ValueError, match=r"tensor 2 is \('head.bias', \(3,\).*the learner's is \('head.bias', \(4,\)"):
        check_layout(mine, other)
    with pytest.raises(ValueError, match="has 3 tensors, the learner's 2"):
        check_layout(mine, mine[:2])


def test_backend_follows_the_tensors_device():
    assert group_backend(torch.device("cpu")) == "gloo"
    assert group_backend(torch.device("cuda", 1)) == "nccl"


def test_bad_weight_sync_settings_are_rejected():
    assert build_config({}).scale.weight_sync == "object_store"
    assert build_config({"scale": {"rollout_workers": 2, "weight_sync": "collective"}}).scale.weight_sync == \
        "collective"
    with pytest.raises(ValueError, match="weight_sync") as err:
        build_config({"scale": {"rollout_workers": 2, "weight_sync": "nccl"}})
    assert "'object_store' or 'collective'" in str(err.value)
    with pytest.raises(ValueError, match=r"scale.weight_sync='collective' needs scale.rollout_workers >= 1"):
        build_config({"scale": {"weight_sync": "collective"}})
