"""Ray rollout and reward workers on a local 2-CPU cluster: a few GRPO steps end to end.

Synchronous workers must give the single process's run bit for bit (same rows, same sampling
stream, same updates); a worker killed mid-step must change nothing and count nothing twice.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from feedbackrl.config import RunConfig, TaskConfig, build_config  # noqa: E402
from feedbackrl.envs.procedural.addition import AdditionTask  # noqa: E402
from feedbackrl.episodes.kinds import InProcessCollector  # noqa: E402
from feedbackrl.episodes.single_turn import task_scorer  # noqa: E402
from feedbackrl.log import MemorySink  # noqa: E402
from feedbackrl.models.load import load_policy, load_tokenizer  # noqa: E402
from feedbackrl.scale import weight_sync  # noqa: E402
from feedbackrl.scale.ray_collect import RayCollector, RewardPool, RolloutWorker  # noqa: E402
from feedbackrl.train.checkpoint import resolve_resume  # noqa: E402
from feedbackrl.train.grpo import train_grpo  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from test_checkpoint_resume import ShapedAddition, assert_same_parameters  # noqa: E402

STEPS = 3
KEYS = ("reward/mean", "reward/std", "loss/policy", "kl/mean", "clip_frac", "grad_norm", "rollout/len_mean")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors see this module's worker classes
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    yield
    ray.shutdown()


def config(steps: int = STEPS, **scale) -> RunConfig:
    # two epochs x two minibatches: the minibatch shuffles draw from the sampling generator after each rollout,
    # so a collector that left the generator anywhere but where one process leaves it changes the run
    return build_config({
        "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4},
        "algo": {"steps": steps, "epochs": 2, "minibatches": 2, "lr": 1e-2},
        "train": {"seed": 3}, "scale": scale,
    })


class CountingScorer:
    """The task's verifier, counting the completions it was asked to score."""

    def __init__(self, task):
        self.inner, self.scored = task_scorer(task), 0

    def __call__(self, problems, completions):
        self.scored += len(completions)
        return self.inner(problems, completions)


def run(model_dir: Path, out: Path, cfg: RunConfig, workers: int = 0, worker_cls: type = RolloutWorker,
        resume_from: Path | None = None, log=print):
    model, tok = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    task, rows = ShapedAddition(), MemorySink()
    scorer = CountingScorer(task)
    if workers:
        collector = RayCollector(cfg.scale, model, tok, task, scorer, cfg.rollout, worker_cls=worker_cls, log=log)
    else:
        collector = InProcessCollector(model, tok, task, scorer, cfg.rollout)
    train_grpo(cfg, model, tok, task, out, rows, resume_from=resume_from, scorer=scorer, collector=collector)
    return {k: v.clone() for k, v in model.state_dict().items()}, rows.by_step, scorer.scored


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    return run(tiny_model_dir, tmp_path_factory.mktemp("one"), config())


def assert_same_run(got, want) -> None:
    params, rows, _ = got
    want_params, want_rows, _ = want
    assert_same_parameters(params, want_params)
    for step in range(1, STEPS + 1):
        for key in KEYS:
            assert rows[step][key] == want_rows[step][key], (step, key)


@pytest.mark.parametrize("workers", [1, 2])
def test_synchronous_workers_equal_one_process(tiny_model_dir, tmp_path, one_process, workers):
    got = run(tiny_model_dir, tmp_path, config(rollout_workers=workers), workers)
    assert_same_run(got, one_process)
    assert got[2] == one_process[2] == STEPS * 12
    assert all(got[1][s]["scale/staleness_max"] == 0 for s in range(1, STEPS + 1))
    assert len({one_process[1][s]["reward/mean"] for s in range(1, STEPS + 1)}) > 1  # the policy moved


class DiesOnce(RolloutWorker):
    """Exits its process in the middle of its second share (the first time only: a marker file remembers)."""

    marker = ""

    def generate(self, prompts, rows, sample_state, cfg):
        self.calls = getattr(self, "calls", 0) + 1
        if rows.start > 0 and self.calls == 2 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        return super().generate(prompts, rows, sample_state, cfg)


def test_a_killed_worker_is_restarted_and_nothing_counts_twice(tiny_model_dir, tmp_path, one_process):
    marker = tmp_path / "died"
    cls = type("DiesOnceHere", (DiesOnce,), {"marker": str(marker)})
    lines: list[str] = []
    got = run(tiny_model_dir, tmp_path / "out", config(rollout_workers=2), 2, worker_cls=cls, log=lines.append)
    assert marker.exists()  # the worker did die, during step 2
    assert_same_run(got, one_process)  # its rows were generated again with the step-2 weights and stream
    assert got[2] == STEPS * 12  # every completion scored once
    assert [got[1][s]["scale/worker_restarts"] for s in range(1, STEPS + 1)] == [0.0, 1.0, 1.0]
    assert len(lines) == 1 and "rollout worker 1 died" in lines[0] and "rows 6..11 generated again" in lines[0]


class DiesInBroadcast(RolloutWorker):
    """Exits its process as the second weight broadcast reaches it (once: a marker file remembers)."""

    marker = ""

    def receive(self, version, generation):
        if version == 2 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        return super().receive(version, generation)


class DiesWhileOtherWaits(RolloutWorker):
    """Rank 2 exits as the second broadcast reaches it (once: a marker file remembers); rank 1 enters that
    broadcast 2 s late, after the learner has found rank 2 dead, so it waits in a broadcast the learner gave up."""

    marker = ""

    def receive(self, version, generation):
        if version == 2 and self.member.rank == 2 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        if version == 2 and self.member.rank == 1 and not getattr(self, "lagged", False):
            self.lagged = True
            time.sleep(2)
        return super().receive(version, generation)


@pytest.mark.parametrize("pack_below", [weight_sync.PACK_BELOW, 1000])
def test_collective_sync_equals_one_process(tiny_model_dir, tmp_path, one_process, monkeypatch, pack_below):
    # the tiny model's tensors are all below the default: one packed message per dtype; from 1000 elements its
    # matrices go alone (no copy) and the norms' weights are packed between them
    monkeypatch.setattr(weight_sync, "PACK_BELOW", pack_below)
    got = run(tiny_model_dir, tmp_path, config(rollout_workers=2, weight_sync="collective"), 2)
    assert_same_run(got, one_process)  # so the object store's run too (the test above): every reward, every weight
    assert got[2] == STEPS * 12
    rows = got[1]
    assert "perf/weights_put_s" not in rows[2]
    assert rows[1]["perf/weights_broadcast_s"] == 0.0 and rows[2]["perf/weights_broadcast_s"] > 0  # after update 1
    assert not torch.distributed.is_initialized()  # the collector's close left the process group


def test_collective_sync_refuses_a_process_that_has_a_group(tiny_model_dir, tmp_path):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)  # as under torchrun
    try:
        with pytest.raises(RuntimeError, match="already has one .torchrun.*scale.weight_sync = 'object_store'"):
            run(tiny_model_dir, tmp_path, config(rollout_workers=2, weight_sync="collective"), 2)
    finally:
        dist.destroy_process_group()


class TimesReceives:
    """Put before a RolloutWorker subclass: appends how long each weight broadcast the worker waited in took, and
    how it ended, to `marker`.receives (a worker that exits inside one writes nothing for it)."""

    marker = ""

    def receive(self, version, generation):
        t0, outcome = time.monotonic(), "failed"
        try:
            got = super().receive(version, generation)
            outcome = "ok"
            return got
        finally:
            with open(self.marker + ".receives", "a") as f:
                f.write(f"{self.member.rank} {version} {outcome} {time.monotonic() - t0:.3f}\n")


def longest_receive_s(marker: Path) -> float:
    receives = [line.split() for line in Path(str(marker) + ".receives").read_text().splitlines()]
    return max(float(t) for *_, t in receives)


@pytest.mark.parametrize("worker", [DiesOnce, DiesInBroadcast, DiesWhileOtherWaits])
def test_collective_sync_survives_a_killed_worker(tiny_model_dir, tmp_path, one_process, worker):
    # DiesOnce: found dead when its share is gathered; DiesInBroadcast: found dead by the broadcast itself;
    # DiesWhileOtherWaits: the same, the other worker left waiting in the broken broadcast. Each time the group is
    # made again and the restarted worker gets the current weights from it
    marker = tmp_path / "died"
    cls = type(f"{worker.__name__}Here", (TimesReceives, worker), {"marker": str(marker)})
    lines: list[str] = []
    got = run(tiny_model_dir, tmp_path / "out", config(rollout_workers=2, weight_sync="collective"), 2,
              worker_cls=cls, log=lines.append)
    # a live worker blocked in the broken group's broadcast is freed by the learner's abandoned mark, not by the
    # timeout; the bound is on each broadcast a worker waited in, not on the run, whose time follows the load
    assert longest_receive_s(marker) < weight_sync.COLLECTIVE_TIMEOUT_S / 2
    assert marker.exists()
    assert_same_run(got, one_process)
    assert got[2] == STEPS * 12
    assert len(lines) == 1, lines
    if worker is DiesOnce:
        assert "rollout worker 1 died" in lines[0] and "rows 6..11 generated again" in lines[0]
        assert [got[1][s]["scale/worker_restarts"] for s in range(1, STEPS + 1)] == [0.0, 1.0, 1.0]
    else:  # found by the broadcast after step 2's update: counted from step 3's batch on
        assert "weight broadcast failed" in lines[0] and "policy version 2 broadcast to every worker" in lines[0]
        assert [got[1][s]["scale/worker_restarts"] for s in range(1, STEPS + 1)] == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("sync", ["object_store", "collective"])
def test_asynchronous_mode_trains_on_one_step_old_samples(tiny_model_dir, tmp_path, sync):
    _, rows, scored = run(tiny_model_dir, tmp_path, config(4, rollout_workers=2, max_staleness=1, weight_sync=sync),
                          2)
    # step 1 waits for a fresh batch; then each batch was sampled while the learner trained on the one before;
    # the last step is sampled fresh too (no sampling runs ahead of the final checkpoint)
    assert [rows[s]["scale/staleness_max"] for s in range(1, 5)] == [0.0, 1.0, 1.0, 1.0]
    assert scored == 4 * 12
    stale = [rows[s]["is_weight/mean"] for s in (2, 3, 4)]
    assert all(0 < w <= 2.0 for w in stale) and any(abs(w - 1) > 1e-3 for w in stale), stale


def resumed_against_uninterrupted(model_dir: Path, tmp_path: Path, cfg: RunConfig):
    """`cfg` run in one go, and run for 2 steps then resumed from that checkpoint to the end, with 2 workers:
    (uninterrupted model, its rows, resumed model, the resumed run's rows, completions it scored)."""
    want, want_rows, _ = run(model_dir, tmp_path / "full", cfg, 2)
    half = cfg.model_copy(deep=True)
    half.algo.steps = 2
    run(model_dir, tmp_path / "half", half, 2)
    ckpt = resolve_resume(tmp_path / "half")
    got, rows, scored = run(ckpt, tmp_path / "half", cfg, 2, resume_from=ckpt)
    return want, want_rows, got, rows, scored


def test_asynchronous_collective_sync_survives_a_killed_worker(tiny_model_dir, tmp_path):
    # the worker dies sampling the prefetched batch 2; the broadcast after update 1 waits for that share, finds
    # the worker dead and makes the group again; then the share is gathered, found lost and generated again
    # with the weights the regroup sent: one death, counted once, every completion scored once
    marker = tmp_path / "died"
    cls = type("DiesOnceHere", (TimesReceives, DiesOnce), {"marker": str(marker)})
    lines: list[str] = []
    cfg = config(4, rollout_workers=2, max_staleness=1, weight_sync="collective")
    _, rows, scored = run(tiny_model_dir, tmp_path / "out", cfg, 2, worker_cls=cls, log=lines.append)
    # the live worker may be left in the broken group's broadcast: it fails out when the learner marks the group
    # abandoned, not at the collective timeout (docs/scale.md: it once sat there 120 s waiting for the learner's
    # sockets to close). The bound is on each broadcast a worker waited in, not on the run, whose time follows the
    # machine's load
    assert longest_receive_s(marker) < weight_sync.COLLECTIVE_TIMEOUT_S / 2
    assert marker.exists() and scored == 4 * 12
    assert [rows[s]["scale/worker_restarts"] for s in range(1, 5)] == [0.0, 1.0, 1.0, 1.0]
    assert len(lines) == 2 and "weight broadcast failed" in lines[0] and "rows 6..11 generated again" in lines[1]
    # the regenerated rows were sampled with version 1, the others with version 0, trained on at step 2
    assert [rows[s]["scale/staleness_max"] for s in range(1, 5)] == [0.0, 1.0, 1.0, 1.0]
    assert rows[2]["scale/staleness_mean"] == 0.5


def test_asynchronous_resume_is_bit_exact(tiny_model_dir, tmp_path):
    cfg = config(4, rollout_workers=2, max_staleness=1).model_copy(deep=True)
    cfg.train.checkpoint_every = 2
    want, want_rows, got, rows, _ = resumed_against_uninterrupted(tiny_model_dir, tmp_path, cfg)
    assert_same_parameters(got, want)
    assert [rows[s]["reward/mean"] for s in (3, 4)] == [want_rows[s]["reward/mean"] for s in (3, 4)]
    shutil.rmtree(tmp_path)


@pytest.mark.slow
def test_synchronous_resume_is_bit_exact(tiny_model_dir, tmp_path):
    # 2 steps with a checkpoint, then a resume to 4, against 4 steps in one go: the restored generator states and
    # the resumed weights sent to the workers must give the same rows, losses and parameters
    cfg = config(4, rollout_workers=2)
    want, want_rows, got, rows, scored = resumed_against_uninterrupted(tiny_model_dir, tmp_path, cfg)
    assert_same_parameters(got, want)
    for step in (3, 4):
        for key in KEYS:
            assert rows[step][key] == want_rows[step][key], (step, key)
        assert rows[step]["scale/staleness_max"] == 0
    assert sorted(rows) == [3, 4] and scored == 2 * 12  # the resumed run trained (and scored) steps 3 and 4 only
    assert want_rows[3]["reward/mean"] != want_rows[4]["reward/mean"] or want_rows[3]["loss/policy"] != \
        want_rows[4]["loss/policy"]  # steps 3 and 4 are not one row repeated
    shutil.rmtree(tmp_path)


def test_reward_pool_gives_the_task_verdicts_in_order():
    task = AdditionTask(digits=2)
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(7)]
    completions = [p.answer if i % 2 else "0" for i, p in enumerate(problems)]
    pool = RewardPool(TaskConfig(name="addition", options={"digits": 2}), workers=2)
    verdicts, _ = pool(problems, completions)
    assert verdicts == task.verify_batch(problems, completions)
    assert [v.score for v in verdicts] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
