"""How the learner's weights reach the Ray rollout workers after each update (`scale.weight_sync`).

`object_store` (the default): one `ray.put` of the state dict per update; every worker reads it and
`load_state_dict`s it before its next share.

`collective`: the learner (rank 0, in the driver) and the W rollout workers (ranks 1..W) form one
torch.distributed group (a backend object each side owns, not torch.distributed's default group:
`new_group`), and after each update the learner broadcasts its tensors: each
large one (`PACK_BELOW` elements or more) as it is, with no copy, and each run of smaller ones packed
into one message. A worker's tensors are views into one flat buffer per dtype (bound once, when it
first joins), and every message is a contiguous slice of one, so the broadcast lands in its model in
place, with no second copy. The rendezvous is a `TCPStore` hosted by the driver on a free port, at
the driver's node address as Ray knows it (`ray_address = "auto"` clusters included). The backend
follows where the workers hold the policy: gloo for CPU tensors (the workers run on CPUs today), NCCL
for CUDA tensors (untested: no rollout worker holds the policy on a GPU yet).

A torch.distributed group cannot take in a new member, so when a worker dies (Ray restarts it from its
constructor's arguments) the group is made again: the learner marks the old generation abandoned in the
store (a live worker blocked in its broadcast sees the mark within `ABANDON_POLL_S` and gives up on it),
waits until every worker answers, and all of them join a new generation of the group under a fresh key
prefix in the same store; the learner then broadcasts its last weights, so the restarted worker holds
exactly what the others hold. A second death during that regroup is not retried: the run stops with the
error. Abandoned groups are parked, not destroyed: a gloo group whose broadcast failed or is still
pending can block in its destructor until the peer's timeout (docs/scale.md).

Why plain torch.distributed and not `ray.util.collective`: Ray's collective groups live in actors
(`init_collective_group` is called inside an actor; the learner here is the driver) and its NCCL
backend needs CuPy; its gloo backend is torch.distributed underneath anyway. Plain torch.distributed
gives us the timeout, the rendezvous and the failure behaviour directly, as `scale/ddp.py` uses them.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

# A broadcast or a rendezvous that waits longer fails rather than hangs: a peer that died is normally seen at
# once (its socket closes), this bounds the rest. The learner lets the shares in flight finish before it
# broadcasts, so the wait covers the transfer, not a generation.
COLLECTIVE_TIMEOUT_S = 120
RESTART_POLLS, RESTART_POLL_S = 240, 0.5  # how long a dead rollout worker may take to come back: 2 minutes
# Elements from which a tensor is its own message. Packing a large tensor costs a copy of it (a quarter of
# the transfer time for a 100M-parameter model on our CPUs); each message costs a round of the collective.
PACK_BELOW = 1 << 20
# How often a worker waiting in a broadcast looks for the learner's mark that the group was abandoned
ABANDON_POLL_S = 0.05
# Groups left after a death, kept referenced for the life of the process: never destroyed (see the module's doc)
_PARKED: list[Any] = []

Layout = list[tuple[str, tuple[int, ...], str]]  # (state-dict key, shape, dtype) of each tensor sent, in order


def group_backend(device: torch.device) -> str:
    """gloo for CPU tensors, NCCL for CUDA ones (NCCL cannot move CPU tensors)."""
    return "nccl" if device.type == "cuda" else "gloo"


def unique_tensors(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state dict without the repeats of a tied tensor (first key kept) and without empty tensors."""
    seen, out = set(), {}
    for key, t in state.items():
        ident = (t.data_ptr(), t.dtype, tuple(t.shape))
        if t.numel() and ident not in seen:
            seen.add(ident)
            out[key] = t
    return out


def layout(state: dict[str, Tensor]) -> Layout:
    return [(k, tuple(t.shape), str(t.dtype)) for k, t in unique_tensors(state).items()]


@dataclass(frozen=True)
class Segment:
    """One message of a broadcast: tensors `keys`, the slice `start:stop` of dtype `dtype`'s flat buffer."""

    dtype: str
    start: int
    stop: int
    keys: tuple[str, ...]


def segments(lay: Layout, pack_below: int) -> list[Segment]:
    """The messages of a broadcast, dtype by dtype (first seen first), each dtype's tensors in layout order:
    a tensor of `pack_below` elements or more alone, each run of smaller ones together."""
    out: list[Segment] = []
    for dtype in dict.fromkeys(d for _, _, d in lay):
        offset, run, run_start = 0, [], 0
        for key, shape, d in lay:
            if d != dtype:
                continue
            n = math.prod(shape)
            if n >= pack_below:
                if run:
                    out.append(Segment(dtype, run_start, offset, tuple(run)))
                    run = []
                out.append(Segment(dtype, offset, offset + n, (key,)))
            else:
                run_start = offset if not run else run_start
                run.append(key)
            offset += n
        if run:
            out.append(Segment(dtype, run_start, offset, tuple(run)))
    return out


def messages(state: dict[str, Tensor], segs: Sequence[Segment], device: torch.device) -> Iterator[Tensor]:
    """The learner's side: each segment's tensors on `device`, 1-D (a lone contiguous tensor is not copied)."""
    for seg in segs:
        parts = [state[k].detach().reshape(-1).to(device) for k in seg.keys]
        yield parts[0] if len(parts) == 1 else torch.cat(parts)


def targets(flats: dict[str, Tensor], segs: Sequence[Segment]) -> Iterator[Tensor]:
    """A worker's side: where each segment lands, a contiguous slice of its flat buffers."""
    for seg in segs:
        yield flats[seg.dtype][seg.start:seg.stop]


def bind_flat(model: nn.Module) -> dict[str, Tensor]:
    """Give each of `model`'s state tensors storage in one flat buffer per dtype, values kept; return the buffers.

    Written by hand: torch has the flatten (`parameters_to_vector`) but not the re-pointing of a module's
    tensors into one buffer, which is what lets a broadcast write straight into the model. The model's tensors
    are then views of a shared storage: clone them before serialising them one by one (Ray would send the
    whole buffer with each).
    """
    tensors = unique_tensors(model.state_dict(keep_vars=True))
    flats = {str(dtype): torch.empty(sum(t.numel() for t in tensors.values() if t.dtype == dtype), dtype=dtype,
                                     device=next(iter(tensors.values())).device)
             for dtype in dict.fromkeys(t.dtype for t in tensors.values())}
    offsets = dict.fromkeys(flats, 0)
    with torch.no_grad():
        for t in tensors.values():
            d = str(t.dtype)
            start, offsets[d] = offsets[d], offsets[d] + t.numel()
            view = flats[d][start:start + t.numel()].view_as(t)
            view.copy_(t)
            t.data = view  # the Parameter (or buffer) object stays, its storage is now the buffer's
    return flats


def check_layout(mine: Layout, learner: Layout) -> None:
    """The worker's tensors must be the learner's, in the same order: the flat buffers are cut the same way."""
    if mine == learner:
        return
    for i, (a, b) in enumerate(zip(mine, learner, strict=False)):
        if a != b:
            raise ValueError(f"rollout worker's tensor {i} is {a}, the learner's is {b}: the worker's model is not "
                             "the learner's architecture")
    raise ValueError(f"rollout worker's model has {len(mine)} tensors, the learner's {len(learner)}")


def new_group(store: dist.Store, rank: int, world: int, generation: int, backend: str) -> dist.Backend:
    """This process's member of generation `generation` of the weight group (blocks until every rank joins).

    The group is a backend object of its own, not torch.distributed's default group: its owner drops it to leave.
    Gloo runs it on one worker thread (its default is two; the broadcasts are issued one at a time anyway): when
    a group whose broadcast failed was destroyed, the destructor's wake-up of two idle worker threads was seen
    to block in glibc 2.36's condition variable (`pthread_cond_broadcast`, in `__condvar_quiesce_and_switch_g1`)
    until the live peer's own timeout, the old group's sockets kept open all that while.
    """
    prefixed = dist.PrefixStore(f"weights/{generation}", store)
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices, opts._threads, opts._timeout = [dist.ProcessGroupGloo.create_default_device()], 1, timeout
    return dist.ProcessGroupGloo(prefixed, rank, world, opts)


def broadcast(group: dist.Backend, tensor: Tensor) -> None:
    """Rank 0's `tensor` into every rank's `tensor`, in place; raises when a peer died or the timeout passed."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    group.broadcast([tensor], opts).wait()


def abandoned_key(generation: int) -> str:
    """The store key the learner sets when it gives up on generation `generation` of the group."""
    return f"abandoned/{generation}"


def leave(member: Any) -> None:
    """Drop `member.group` without destroying it: parked for the life of the process (see the module's doc)."""
    if member.group is not None:
        _PARKED.append(member.group)
    member.group = None


def finish(work: Any, store: dist.Store, generation: int) -> None:
    """Wait for one collective `work` of generation `generation`; raise as soon as the learner marks that
    generation abandoned (or the work fails)."""
    key, pause, next_look = abandoned_key(generation), 1e-4, 0.0
    while not work.is_completed():
        now = time.monotonic()
        if now >= next_look:
            if store.check([key]):
                raise RuntimeError(f"the learner abandoned weight group generation {generation} during its "
                                   "broadcast (a rollout worker died): this worker rejoins the new generation")
            next_look = now + ABANDON_POLL_S
        time.sleep(pause)
        pause = min(2 * pause, ABANDON_POLL_S / 5)
    work.wait()  # raises the work's error, if it failed


def wait_alive(worker: Any, k: int) -> None:
    """Block until rollout worker k answers (calls fail while Ray restarts it)."""
    import ray

    for _ in range(RESTART_POLLS):
        try:
            ray.get(worker.ping.remote())
            return
        except ray.exceptions.RayActorError:
            time.sleep(RESTART_POLL_S)
    raise RuntimeError(f"rollout worker {k} did not come back after {RESTART_POLLS * RESTART_POLL_S:.0f} s")


class GroupMember:
    """A rollout worker's side of the collective sync: the flat buffers its model lives in, the store, the
    broadcast's segments, its generation of the group (-1: in none, as after a restart)."""

    def __init__(self) -> None:
        self.flats: dict[str, Tensor] | None = None
        self.store: dist.Store | None = None
        self.group: dist.Backend | None = None
        self.segments: list[Segment] = []
        self.generation, self.rank = -1, 0

    def join(self, model: nn.Module, address: str, port: int, rank: int, world: int, generation: int,
             learner_layout: Layout, segs: list[Segment], backend: str) -> None:
        check_layout(layout(model.state_dict()), learner_layout)
        self.segments = segs
        if self.flats is None:
            self.flats = bind_flat(model)
        if self.store is None:
            self.store = dist.TCPStore(address, port, is_master=False,
                                       timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        leave(self)
        self.group = new_group(self.store, rank, world, generation, backend)
        self.generation, self.rank = generation, rank

    def receive(self, generation: int) -> None:
        if self.flats is None or self.group is None or generation != self.generation:
            raise RuntimeError(f"rollout worker is in weight group generation {self.generation}, not {generation} "
                               "(restarted since): it rejoins when the group is made again")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        for view in targets(self.flats, self.segments):  # one at a time: a message lands before the next is posted
            finish(self.group.broadcast([view], opts), self.store, generation)


class ObjectStoreSync:
    """`scale.weight_sync = "object_store"`: one `ray.put` of the state dict per update, loaded by every worker."""

    metric = "perf/weights_put_s"

    def __init__(self, workers: Sequence[Any], model: nn.Module, log: Callable[[str], None]) -> None:
        self.workers, self.ref = workers, None
        self.deaths = 0  # workers found dead by a push: none, the push does not wait for them

    def push(self, model: nn.Module, version: int, in_flight: Sequence[Any]) -> float:
        """Seconds the learner spent: the put (the workers load the weights after their shares in flight)."""
        import ray

        t0 = time.perf_counter()
        self.ref = ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
        put_s = time.perf_counter() - t0
        for w in self.workers:  # queued behind any share in flight: the learner does not wait
            w.set_weights.remote(self.ref, version)
        return put_s

    def restore(self, k: int, version: int) -> bool:
        """Worker k came back from a restart with the initial weights: give it version `version`'s (True: done now)."""
        import ray

        w = self.workers[k]
        ray.get(w.set_weights.remote(self.ref, version) if self.ref is not None else w.set_version.remote(version))
        return True

    def close(self) -> None:
        self.ref = None


class CollectiveSync:
    """`scale.weight_sync = "collective"`: a broadcast in a process group of the learner and the workers."""

    metric = "perf/weights_broadcast_s"
    device = torch.device("cpu")  # where the workers hold the policy (`RolloutWorker`), so where the buffers live

    def __init__(self, workers: Sequence[Any], model: nn.Module, log: Callable[[str], None]) -> None:
        import ray

        if dist.is_initialized():
            raise RuntimeError("scale.weight_sync = 'collective' makes the learner rank 0 of a process group of its "
                               "own, but this process already has one (torchrun?); use scale.weight_sync = "
                               "'object_store'")
        self.workers, self.layout, self.log = workers, layout(model.state_dict()), log
        self.segments = segments(self.layout, PACK_BELOW)
        self.address = ray.util.get_node_ip_address()  # reachable from the workers' nodes, unlike localhost
        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        # the model whose weights the workers were last sent: it holds them until the next push (the loop trains
        # only between a batch's collect and the update), so a regroup sends them again from it
        self.generation, self.version, self.model = -1, 0, None
        self.group: dist.Backend | None = None
        self.deaths = 0  # broadcasts that found a worker dead
        self._regroup()

    def push(self, model: nn.Module, version: int, in_flight: Sequence[Any]) -> float:
        """Seconds from the first message to every worker holding the weights (shares in flight not counted)."""
        import ray

        if in_flight:  # every worker must take part in the broadcast: let its share finish first
            ray.wait(list(in_flight), num_returns=len(in_flight))
        t0 = time.perf_counter()
        self.model, self.version = model, version
        try:
            self._broadcast()
            return time.perf_counter() - t0
        except (RuntimeError, ray.exceptions.RayError) as err:  # a worker died before or during the broadcast
            failure = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        self.log(f"weight broadcast failed ({failure}): a rollout worker died; process group made again, policy "
                 f"version {version} broadcast to every worker")
        self.deaths += 1
        self._regroup()
        return time.perf_counter() - t0

    def restore(self, k: int, version: int) -> bool:
        """Worker k came back from a restart: unless a broadcast's regroup already took it in (False), make the
        group again (True)."""
        import ray

        if ray.get(self.workers[k].group_generation.remote()) == self.generation:
            return False
        self._regroup()
        return True

    def _broadcast(self) -> None:
        import ray

        refs = [w.receive.remote(self.version, self.generation) for w in self.workers]
        for buf in messages(self.model.state_dict(), self.segments, self.device):
            broadcast(self.group, buf)
        ray.get(refs)

    def _regroup(self) -> None:
        """Every worker alive, then all of them and the learner in a new generation of the group, same weights."""
        import ray

        if self.group is not None:  # a worker blocked in the old group's broadcast sees this and fails out of it
            self.store.set(abandoned_key(self.generation), "1")
        leave(self)
        for k, w in enumerate(self.workers):
            wait_alive(w, k)
        self.generation += 1
        world, backend = len(self.workers) + 1, group_backend(self.device)
        refs = [w.join.remote(self.address, self.store.port, rank, world, self.generation, self.layout,
                              self.segments, backend) for rank, w in enumerate(self.workers, start=1)]
        self.group = new_group(self.store, 0, world, self.generation, backend)
        ray.get(refs)
        if self.model is not None:  # none before the first update: every worker holds the initial weights
            self._broadcast()

    def close(self) -> None:
        # the run is over and no broadcast is pending: this group and those parked after deaths can go
        self.group = None
        _PARKED.clear()
        self.model, self.store = None, None  # the store's server stops with its last reference


WEIGHT_SYNCS = {"object_store": ObjectStoreSync, "collective": CollectiveSync}
