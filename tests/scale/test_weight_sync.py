"""The collective weight sync's pieces without Ray: which tensors go, how they are packed, how a worker binds them.

The broadcast itself, between the learner and Ray workers, is tested in `test_ray.py`.
"""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from feedbackrl.config import build_config
from feedbackrl.scale.weight_sync import (
    GroupMember,
    Segment,
    abandoned_key,
    bind_flat,
    check_layout,
    group_backend,
    layout,
    messages,
    new_group,
    segments,
    targets,
    unique_tensors,
)


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


def test_segments_pack_small_tensors_and_send_large_ones_alone():
    lay = [("a", (2,), "f32"), ("b", (3, 2), "f32"), ("n", (4,), "i64"), ("c", (1,), "f32"), ("d", (2,), "f32"),
           ("e", (5,), "f32")]
    # float32 buffer: a 0:2, b 2:8, c 8:9, d 9:11, e 11:16; int64 buffer: n 0:4. From 5 elements a tensor is alone
    assert segments(lay, pack_below=5) == [
        Segment("f32", 0, 2, ("a",)), Segment("f32", 2, 8, ("b",)), Segment("f32", 8, 11, ("c", "d")),
        Segment("f32", 11, 16, ("e",)), Segment("i64", 0, 4, ("n",))]
    assert segments(lay, pack_below=100) == [Segment("f32", 0, 16, ("a", "b", "c", "d", "e")),
                                             Segment("i64", 0, 4, ("n",))]


@pytest.mark.parametrize("pack_below", [1, 4, 100])
def test_the_learner_messages_land_in_the_worker_model(pack_below):
    model, source = Tied(), Tied()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(-1)
    x = torch.tensor([[0.5, -1.0]])
    before = model.head(x)
    flats = bind_flat(model)
    assert list(flats) == ["torch.int64", "torch.float32"]
    assert flats["torch.float32"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0]  # embed, then bias
    assert torch.equal(model.head(x), before)  # values kept
    assert model.head.weight is model.embed.weight  # still tied, still the same Parameter objects
    segs = segments(layout(source.state_dict()), pack_below)
    assert len(segs) == {1: 3, 4: 3, 100: 2}[pack_below]  # pack_below 4: embed (6) alone, steps and bias packed
    # what a broadcast does: each of the learner's messages written into the worker's slice, in place
    for buf, view in zip(messages(source.state_dict(), segs, torch.device("cpu")), targets(flats, segs),
                         strict=True):
        view.copy_(buf)
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


def test_a_worker_waiting_in_an_abandoned_broadcast_fails_out_of_it():
    # the learner (rank 0 here, in a thread) joins the group but never broadcasts: it marks the generation
    # abandoned instead, as after a death. The worker must fail out on the mark, not at gloo's 120 s timeout,
    # whose error reads "Timed out waiting ..."; the learner's group stays alive (parked) all the while
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    learner: list = []
    joined = threading.Thread(target=lambda: learner.append(new_group(store, 0, 2, 5, "gloo")))
    joined.start()
    member = GroupMember()
    model = nn.Linear(3, 2)
    lay = layout(model.state_dict())
    member.join(model, "127.0.0.1", store.port, 1, 2, 5, lay, segments(lay, 1 << 20), "gloo")
    joined.join()
    failed: list[BaseException] = []

    def receive() -> None:
        try:
            member.receive(5)
        except RuntimeError as err:
            failed.append(err)

    waiting = threading.Thread(target=receive)
    waiting.start()
    store.set(abandoned_key(5), "1")
    waiting.join()
    assert len(failed) == 1 and "abandoned weight group generation 5" in str(failed[0]), failed
    with pytest.raises(RuntimeError, match="generation 5, not 6"):
        member.receive(6)
