"""Ray rollout and reward workers: the collect step on a cluster, the learner in the driver.

Rollout workers are actors that each hold a copy of the policy and generate their share of a step's
rows (`shards.py` says why the shares add up to the single process's batch). Weights go from the
learner to the workers after each update through Ray's object store (one `ray.put` of the state dict,
read by every worker) or a torch.distributed broadcast (`scale.weight_sync`, `weight_sync.py`). Reward
workers are a pool of actors that each build the task and verify a chunk of the completions (the code
sandbox's verdicts are CPU-heavy); verdicts are pure, so a chunk whose worker died is simply verified again.

Synchronous (`scale.max_staleness = 0`): a step's rows are generated with the current weights, and
the run equals the single process's. Asynchronous (`max_staleness = 1`): as soon as a batch is
gathered, the next one is launched with the weights the workers hold, so generation of batch s+1
overlaps the learner's update on batch s; a batch is then one policy version old when it is trained
on, and the loop corrects for it (`algos/staleness.py`).

A rollout worker that dies mid-step is restarted by Ray (`max_restarts`); its share of the step is
thrown away, the restarted worker is given the current weights (with collective sync, by making the
process group again: `weight_sync.py`) and generates the share again from the same sampling state,
so every row is generated, scored and counted exactly once. The run's console says so and the step's
metrics carry `scale/worker_restarts`.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.config import RolloutConfig, ScaleConfig, TaskConfig
from feedbackrl.envs.base import Task
from feedbackrl.episodes.contracts import Batch, Scorer
from feedbackrl.episodes.single_turn import sample_owners, score_rollout
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.rollout.generate import Rollout, generate
from feedbackrl.scale.shards import advance, join_rollouts, shard_rows
from feedbackrl.scale.threads import available_cores, worker_env
from feedbackrl.scale.weight_sync import WEIGHT_SYNCS, GroupMember, Layout, Segment, wait_alive


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError("scale.rollout_workers / scale.reward_workers need Ray: pip install 'feedbackrl[ray]'") \
            from err
    return ray


def start_ray(address: str, actors: int) -> None:
    """Join the cluster at `address` ("auto": the running one), or start a local one on this node's cores."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:  # a local cluster: one logical CPU per actor at least, the threads are budgeted by `worker_env`
        ray.init(num_cpus=max(int(available_cores()), actors), include_dashboard=False, log_to_driver=False)


class RolloutWorker:
    """A policy copy that generates its share of each step (run as a Ray actor)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, threads: int) -> None:
        torch.set_num_threads(threads)
        self.model, self.tokenizer, self.version = model.cpu().eval(), tokenizer, 0
        self.member = GroupMember()  # its place in the learner's weight group (collective sync)

    def ping(self) -> None:
        """Answers once the actor is up (and its earlier calls are done)."""

    def set_version(self, version: int) -> int:
        self.version = version
        return version

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.model.load_state_dict(state)
        self.version = version
        return version

    def group_generation(self) -> int:
        return self.member.generation

    def join(self, address: str, port: int, rank: int, world: int, generation: int, learner_layout: Layout,
             segs: list[Segment], backend: str) -> int:
        """Join generation `generation` of the learner's weight group as rank `rank` (blocks until all have)."""
        self.member.join(self.model, address, port, rank, world, generation, learner_layout, segs, backend)
        return generation

    def receive(self, version: int, generation: int) -> int:
        """The learner's broadcast of policy version `version`, straight into the model's tensors."""
        self.member.receive(generation)
        self.version = version
        return version

    def generate(self, prompts: list[str], rows: slice, sample_state: torch.Tensor,
                 cfg: RolloutConfig) -> tuple[Rollout, int]:
        """Rows `rows` of the batch `prompts`, sampled from a generator in state `sample_state`."""
        g = torch.Generator().set_state(sample_state)
        ro = generate(self.model, self.tokenizer, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                      generator=g, min_new_tokens=cfg.min_new_tokens, rows=rows)
        return ro, self.version


class VerifierWorker:
    """The task's verifier for a chunk of completions (run as a Ray actor)."""

    def __init__(self, task_cfg: TaskConfig, threads: int) -> None:
        from feedbackrl.envs.registry import make_task

        torch.set_num_threads(threads)
        self.task = make_task(task_cfg)

    def verify(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        return self.task.verify_batch(problems, completions)


class RewardPool:
    """A `Scorer` that splits the completions between `workers` verifier actors, verdicts in row order."""

    def __init__(self, task_cfg: TaskConfig, workers: int, threads: int = 1) -> None:
        ray = _ray()
        actor = ray.remote(VerifierWorker).options(num_cpus=1, max_restarts=-1, max_task_retries=2,
                                                   runtime_env={"env_vars": worker_env(threads)})
        self.workers = [actor.remote(task_cfg, threads) for _ in range(workers)]

    def __call__(self, problems: Sequence[Problem], completions: Sequence[str]) -> tuple[list[Verdict], dict]:
        ray = _ray()
        parts = shard_rows(len(completions), len(self.workers))
        refs = [w.verify.remote(list(problems[s]), list(completions[s])) for w, s in zip(self.workers, parts,
                                                                                          strict=True)]
        return [v for chunk in ray.get(refs) for v in chunk], {}


@dataclass
class Pending:
    """A launched batch: its rows' problems, the workers' shares in flight and how to redo one."""

    owners: list[Problem]
    parts: list[slice]
    refs: list[Any]
    sample_state: torch.Tensor
    t0: float


class RayCollector:
    """A `Collector` whose rows are generated by `scale.rollout_workers` Ray actors (see the module doc)."""

    def __init__(self, scale: ScaleConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
                 scorer: Scorer, cfg: RolloutConfig, worker_cls: type = RolloutWorker,
                 log: Callable[[str], None] = print) -> None:
        ray = _ray()
        start_ray(scale.ray_address, scale.rollout_workers + scale.reward_workers)
        self.scale, self.tokenizer, self.task, self.scorer, self.cfg = scale, tokenizer, task, scorer, cfg
        self.log = log
        # synchronous: the workers generate while the learner waits, so they share the node's cores; asynchronous:
        # the learner trains at the same time and takes a worker's share
        threads = max(1, int(available_cores()) // (scale.rollout_workers + (scale.max_staleness > 0)))
        actor = ray.remote(worker_cls).options(num_cpus=1, max_restarts=-1, max_task_retries=0,
                                               runtime_env={"env_vars": worker_env(threads)})
        # kept: Ray restarts a dead worker from its constructor's arguments, which must stay in the object store
        self.init_refs = (ray.put(model), ray.put(tokenizer))
        self.workers = [actor.remote(*self.init_refs, threads) for _ in range(scale.rollout_workers)]
        self.version, self.restarts = 0, 0
        self.pending: deque[Pending] = deque()
        try:
            self.sync = WEIGHT_SYNCS[scale.weight_sync](self.workers, model, log)
        except BaseException:
            for w in self.workers:
                ray.kill(w)
            raise
        self.sync_s = 0.0  # the last update's weight transfer, as the learner saw it

    def update(self, model: PreTrainedModel, version: int) -> None:
        """Send the learner's weights to every worker (`scale.weight_sync`); they sample the next shares with them."""
        in_flight = [ref for p in self.pending for ref in p.refs]
        self.sync_s, self.version = self.sync.push(model, version, in_flight), version

    def _launch(self, prompt_rng: random.Random, sample_rng: torch.Generator) -> Pending:
        t0 = time.perf_counter()
        owners = sample_owners(self.task, self.cfg, prompt_rng)
        prompts, state = [p.prompt for p in owners], sample_rng.get_state()
        parts = shard_rows(len(owners), len(self.workers))
        refs = [w.generate.remote(prompts, rows, state, self.cfg) for w, rows in zip(self.workers, parts, strict=True)]
        if self.scale.max_staleness > 0:  # the learner draws on while this batch is out: skip the most it can use
            advance(sample_rng, self.cfg.max_new_tokens, len(owners))
        return Pending(owners, parts, refs, state, t0)

    def _redo(self, k: int, p: Pending) -> Any:
        """Worker k died: wait for Ray's restart (initial weights), load the current ones, generate the share again."""
        rows = p.parts[k]
        self.log(f"rollout worker {k} died during a step: restarted, policy version {self.version} loaded, its "
                 f"rows {rows.start}..{rows.stop - 1} generated again (none had been scored)")
        self.restarts += self._wait_restarted(k)
        return self.workers[k].generate.remote([q.prompt for q in p.owners], rows, p.sample_state, self.cfg)

    def _wait_restarted(self, k: int) -> bool:
        """Block until worker k answers again (calls fail while Ray restarts it), with the current weights;
        False if a weight broadcast had already found it dead (and counted it)."""
        wait_alive(self.workers[k], k)
        return self.sync.restore(k, self.version)

    def _gather(self, p: Pending) -> list[tuple[Rollout, int]]:
        ray = _ray()
        outs = []
        for k, ref in enumerate(p.refs):
            while True:
                try:
                    outs.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError:
                    ref = self._redo(k, p)
        return outs

    def collect(self, prompt_rng: random.Random, sample_rng: torch.Generator, prefetch: bool = False) -> Batch:
        """The next batch: the one launched last step (asynchronous), else one generated now."""
        t_call = time.perf_counter()
        if not self.pending:
            self.pending.append(self._launch(prompt_rng, sample_rng))
        p = self.pending.popleft()
        outs = self._gather(p)
        ro = join_rollouts([o for o, _ in outs], self.tokenizer.pad_token_id)
        if self.scale.max_staleness == 0:  # exactly the draws the single process's batch made
            advance(sample_rng, ro.completion_ids.shape[1], len(p.owners))
        versions = torch.cat([torch.full((s.stop - s.start,), v) for s, (_, v) in zip(p.parts, outs, strict=True)])
        t_gen = time.perf_counter()
        while prefetch and len(self.pending) < self.scale.max_staleness:
            self.pending.append(self._launch(prompt_rng, sample_rng))
        batch = score_rollout(self.task, self.scorer, p.owners, ro, t_call, t_gen, self.cfg.truncated_fails)
        batch.policy_versions = versions
        if self.scale.max_staleness > 0:
            batch.logprobs = ro.logprobs
        batch.metrics.update({"scale/worker_restarts": float(self.restarts + self.sync.deaths),
                              self.sync.metric: self.sync_s})
        return batch

    def close(self) -> None:
        ray = _ray()
        self.sync.close()  # first: the learner leaves the group before its peers go
        for w in self.workers:
            ray.kill(w)
        self.pending.clear()
