"""`feedbackrl train` under `torchrun`: 2 data-parallel ranks (gloo) against one process, and resumed, with
the whole policy on every rank (`scale.learner = "ddp"`) or sharded over them (`"fsdp"`).

The demo recipe, cut to 4 GRPO steps of 16 completions (2 epochs x 2 minibatches of 8 rows, so each
rank trains on 4 rows per update), a KL term, and a regex reward that a fresh tiny model passes
about a quarter of the time (the task's verifier would give all zeros, hence zero advantages).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from feedbackrl.config import ConfigError, build_config
from feedbackrl.envs.registry import make_task
from feedbackrl.log import MultiSink
from feedbackrl.scale.ranks import OneProcess
from feedbackrl.scale.threads import threads_per_process
from feedbackrl.train.run import check_run, prepare_policy, start_run

RECIPE = Path(__file__).parents[2] / "recipes" / "reverse_grpo.toml"
SETS = ["sft.steps=0", "algo.steps=4", "rollout.prompts_per_step=4", "rollout.group_size=4", "algo.epochs=2",
        "algo.minibatches=2", "algo.kl_coef=0.05", "algo.lr=2e-3", "reward.source=regex", "reward.pattern=.*[a-c].*",
        "task.heldout_size=16", "eval.every=2", "eval.pass_k=0", "train.threads=1", "train.checkpoint_every=2"]
LOSSES = ("loss/policy", "loss/kl", "kl/mean", "entropy/mean", "grad_norm")
FSDP = ("--set", "scale.learner=fsdp")
# a detector that fires on every step, set to roll back: rollbacks at steps 1 and 2, then (none left) a stop at 3
ROLLBACK = ("--set", 'monitors.detectors=["zero_variance"]', "--set",
            "monitors.options={zero_variance={window=1,max_frac=0.0}}", "--set",
            'monitors.actions={zero_variance="rollback"}')


def train(out: Path, ranks: int, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launcher, "-m", "feedbackrl.cli", "train", str(RECIPE), "--out", str(out),
           *[a for s in SETS for a in ("--set", s)], *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def rl_rows(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r.get("phase") == "rl"]
    assert len(steps) == len(set(steps)), f"a step logged twice (more than one rank writing?): {steps}"
    return {r["step"]: r for r in rows if r.get("phase") == "rl"}


def params(out: Path, step: int = 4) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "one"
    train(out, 1)
    return out


@pytest.mark.slow
def test_two_ranks_train_as_one_process_and_resume(tmp_path, one_process):
    # one process whose micro-batches are the ranks' shares: the same sums in the same order as 2 ranks
    train(tmp_path / "micro", 1, "--set", "train.micro_batch_size=4")
    log = train(tmp_path / "two", 2)
    assert "data-parallel learner: 2 ranks (gloo), 2 on this node with 1 thread(s) each" in log
    one, micro, two = rl_rows(one_process), rl_rows(tmp_path / "micro"), rl_rows(tmp_path / "two")
    assert sorted(two) == [1, 2, 3, 4]
    assert json.loads((tmp_path / "two" / "report.json").read_text())["data_parallel_ranks"] == 2
    assert len({r["reward/mean"] for r in one.values()}) > 1  # the policy learned: 0.25 -> 0.5 here

    for step in one:
        # the same completions every step: the rewards and the held-out evaluation are exactly one process's
        for key in ("reward/mean", "reward/std", "rollout/len_mean", "eval/accuracy"):
            assert two[step].get(key) == one[step].get(key), (step, key)
        # not bit for bit: each rank's training forward runs 4 rows where one process runs 8, and float
        # matmuls over other shapes round differently (here ~1e-6 relative); 2 ranks equal one process
        # with 4-row micro-batches exactly, so nothing else differs
        for key in LOSSES:
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
            assert two[step][key] == micro[step][key], (step, key)
    # 16 AdamW updates of lr 2e-3 (each moves a weight by up to 2e-3): the same weights to within 1e-4
    # (1.2e-5 measured), and exactly the micro-batched process's
    want, got, same_sums = params(one_process), params(tmp_path / "two"), params(tmp_path / "micro")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-4, msg=k)
        assert torch.equal(got[k], same_sums[k]), k

    # resumed from step 2 on 2 ranks: steps 3 and 4 exactly as the uninterrupted 2-rank run
    train(tmp_path / "resumed", 2, "--resume", str(tmp_path / "two" / "checkpoints" / "step_000002"))
    resumed = rl_rows(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", *LOSSES):
            assert resumed[step][key] == two[step][key], (step, key)
    assert all(torch.equal(t, got[k]) for k, t in params(tmp_path / "resumed").items())


def trainer_state(out: Path, step: int) -> dict:
    return torch.load(out / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt", weights_only=False)


@pytest.mark.slow
def test_fsdp_trains_as_one_process_and_resumes(tmp_path, one_process):
    log = train(tmp_path / "fsdp", 2, *FSDP)
    assert "data-parallel learner: 2 ranks (gloo), 2 on this node with 1 thread(s) each" in log
    assert "the policy is sharded over the ranks (FSDP2)" in log
    one, fsdp = rl_rows(one_process), rl_rows(tmp_path / "fsdp")
    assert sorted(fsdp) == [1, 2, 3, 4] and len({r["reward/mean"] for r in one.values()}) > 1
    report = json.loads((tmp_path / "fsdp" / "report.json").read_text())
    assert report["learner"] == "fsdp" and "no gold comparison" in report["no_gold"]
    for step in one:
        # the same completions every step (each rank decodes its share until every rank's rows are done), and
        # the same held-out evaluation, which every rank ran in step with rank 0
        for key in ("reward/mean", "reward/std", "rollout/len_mean", "eval/accuracy"):
            assert fsdp[step].get(key) == one[step].get(key), (step, key)
        # a sharded model trains through transformers' forward (FSDP's hooks keep our fused forward off), which
        # rounds differently: 4.4e-6 relative at most, measured
        for key in LOSSES:
            assert fsdp[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
    # 16 AdamW updates of lr 2e-3: 4.6e-5 apart at most, measured (DDP, through the fused forward: 1.2e-5)
    want, got = params(one_process), params(tmp_path / "fsdp")
    assert sorted(got) == sorted(want)  # one process's checkpoint format: the same tensors, tied head included
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=2e-4, msg=k)
    ckpt = Path("checkpoints") / "step_000004"
    assert (json.loads((tmp_path / "fsdp" / ckpt / "config.json").read_text())
            == json.loads((one_process / ckpt / "config.json").read_text()))  # a plain Llama, not FSDPLlama...
    mine, theirs = trainer_state(tmp_path / "fsdp", 4)["optimizer"], trainer_state(one_process, 4)["optimizer"]
    assert mine["param_groups"] == theirs["param_groups"] and sorted(mine["state"]) == sorted(theirs["state"])
    # the gathered AdamW state, numbered as one process numbers it; measured apart at most 1.2e-7 (exp_avg, up
    # to 0.019) and 2.8e-10 (exp_avg_sq, up to 3.4e-5)
    atol = {"step": 0.0, "exp_avg": 1e-5, "exp_avg_sq": 1e-8}
    for i, state in theirs["state"].items():
        assert sorted(mine["state"][i]) == sorted(atol)
        for k, t in state.items():
            torch.testing.assert_close(mine["state"][i][k], t, rtol=0, atol=atol[k], msg=f"{i} {k}")

    # resumed on 2 sharded ranks from step 2: steps 3 and 4 exactly as the uninterrupted run
    checkpoint = str(tmp_path / "fsdp" / "checkpoints" / "step_000002")
    train(tmp_path / "resumed", 2, *FSDP, "--resume", checkpoint)
    resumed = rl_rows(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", *LOSSES):
            assert resumed[step][key] == fsdp[step][key], (step, key)
    assert all(torch.equal(t, got[k]) for k, t in params(tmp_path / "resumed").items())
    # one process resumes from the sharded run's checkpoint too (1.2e-7 from the sharded run's weights, measured)
    train(tmp_path / "alone", 1, "--resume", checkpoint)
    alone = rl_rows(tmp_path / "alone")
    for step in (3, 4):
        assert alone[step]["reward/mean"] == fsdp[step]["reward/mean"], step
        for key in LOSSES:
            assert alone[step][key] == pytest.approx(fsdp[step][key], rel=1e-4, abs=1e-6), (step, key)
    for k, t in params(tmp_path / "alone").items():
        torch.testing.assert_close(t, got[k], rtol=0, atol=1e-5, msg=k)


@pytest.mark.slow
def test_fsdp_monitor_rollbacks_as_one_process(tmp_path):
    train(tmp_path / "one", 1, *ROLLBACK)
    train(tmp_path / "fsdp", 2, *FSDP, *ROLLBACK)
    actions = [[a["action"] for a in map(json.loads, (tmp_path / d / "alerts.jsonl").read_text().splitlines())]
               for d in ("one", "fsdp")]
    assert actions == [["rollback", "rollback", "stop"]] * 2
    one, fsdp = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "fsdp")
    assert sorted(fsdp) == [1, 2, 3]
    for step in one:
        assert fsdp[step]["reward/mean"] == one[step]["reward/mean"], step
        for key in LOSSES:
            assert fsdp[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
    # the checkpoint rolled back to twice: the sharded start gathered whole, exactly the built model's weights
    start = load_file(tmp_path / "fsdp" / "base_model" / "model.safetensors")
    assert all(torch.equal(t, start[k]) for k, t in params(tmp_path / "fsdp", 0).items())
    for k, t in params(tmp_path / "one", 3).items():  # 7.4e-5 apart at most, measured
        torch.testing.assert_close(params(tmp_path / "fsdp", 3)[k], t, rtol=0, atol=2e-4, msg=k)


@pytest.mark.slow
def test_fsdp_with_gradient_checkpointing_as_one_process(tmp_path):
    # with gradient checkpointing one process also trains through transformers' forward (the fused one does not
    # recompute), so this compares the same forward sharded and whole; each layer's weights are gathered again
    # for its recomputation in the backward
    checkpointing = ("--set", "train.gradient_checkpointing=true")
    train(tmp_path / "one", 1, *checkpointing)
    train(tmp_path / "fsdp", 2, *FSDP, *checkpointing)
    one, fsdp = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "fsdp")
    for step in one:
        assert fsdp[step]["reward/mean"] == one[step]["reward/mean"], step
        for key in LOSSES:  # 2.6e-6 relative at most, measured
            assert fsdp[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
    want = params(tmp_path / "one")
    for k, t in params(tmp_path / "fsdp").items():  # 9.2e-6 apart at most, measured
        torch.testing.assert_close(t, want[k], rtol=0, atol=5e-5, msg=k)


BF16 = ("--set", "train.precision=bf16")
# one update per step, no KL reference, no clipping: every forward that trains is one rank's share of the rows
ONE_UPDATE = ("--set", "algo.epochs=1", "--set", "algo.minibatches=1", "--set", "algo.kl_coef=0",
              "--set", "algo.max_grad_norm=1e9")


def mean_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return torch.cat([(a[k] - b[k]).abs().flatten() for k in b]).mean().item()


@pytest.mark.slow
def test_fsdp_bf16_trains_as_one_process_bit_for_bit(tmp_path):
    # bf16 is the loop's autocast around float32 weights in both: FSDP2 gathers the float32 shards and autocast
    # casts them per op, as in one process. One process whose micro-batches are the ranks' shares makes the same
    # bf16 matmuls over the same shapes, so everything but the clipping norm's summation order is the same; with
    # the norm out of play (clipping off) and no pass over other shapes (the old and reference log-probs, which
    # one process computes over the whole batch: bf16 matmuls here round a row differently in a batch of
    # another size), the two runs are equal bit for bit
    one_process = (*BF16, *ONE_UPDATE, "--set", "train.micro_batch_size=8")
    train(tmp_path / "one", 1, *one_process)
    train(tmp_path / "fsdp", 2, *FSDP, *BF16, *ONE_UPDATE)
    one, fsdp = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "fsdp")
    assert sorted(fsdp) == [1, 2, 3, 4] and len({r["reward/mean"] for r in one.values()}) > 1
    for step in one:
        for key in ("reward/mean", "reward/std", "rollout/len_mean", "eval/accuracy", "loss/policy", "entropy/mean"):
            assert fsdp[step].get(key) == one[step].get(key), (step, key)
        # logged only: the shards' norms are summed in another order (3.5e-7 relative apart, measured)
        assert fsdp[step]["grad_norm"] == pytest.approx(one[step]["grad_norm"], rel=1e-5), step
    want, got = params(tmp_path / "one"), params(tmp_path / "fsdp")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], t) for k, t in want.items())
    # the sharded checkpoint (float32 weights and AdamW state) resumes in one process: the same steps 3 and 4
    train(tmp_path / "alone", 1, *one_process, "--resume", str(tmp_path / "fsdp" / "checkpoints" / "step_000002"))
    alone = rl_rows(tmp_path / "alone")
    assert sorted(alone) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", "loss/policy", "entropy/mean"):
            assert alone[step][key] == fsdp[step][key], (step, key)
    assert all(torch.equal(t, got[k]) for k, t in params(tmp_path / "alone").items())


@pytest.mark.slow
def test_fsdp_bf16_with_kl_and_clipping_as_one_process(tmp_path, one_process):
    # the test's usual settings (KL, 2 epochs x 2 minibatches, clipping) in bf16, against one process whose
    # micro-batches are the ranks' shares: not bit for bit (the old and reference log-probs and the clipping norm
    # round differently, see above), and bf16 amplifies that: a float32 weight that moves by 1e-7 can round to
    # another bf16 value, and AdamW moves a weight whose tiny gradient changed sign by a whole step
    train(tmp_path / "one", 1, *BF16, "--set", "train.micro_batch_size=4")
    train(tmp_path / "fsdp", 2, *FSDP, *BF16)
    one, fsdp = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "fsdp")
    for step in one:  # the same completions (generation is float32 in both) and evaluations at every step
        for key in ("reward/mean", "reward/std", "rollout/len_mean", "eval/accuracy"):
            assert fsdp[step].get(key) == one[step].get(key), (step, key)
    for key in LOSSES:  # step 1: 2.1e-4 relative at most, measured (5e-2 by step 4)
        assert fsdp[1][key] == pytest.approx(one[1][key], rel=1e-3), key
    # after 16 updates of lr 2e-3: 6.4e-5 apart on average and 5.7e-3 at most, measured; the float32 run is
    # 9.1e-4 apart on average (so these runs did train in bf16), one process in bf16 without micro-batches 3.6e-3
    want, got = params(tmp_path / "one"), params(tmp_path / "fsdp")
    assert mean_abs_diff(got, want) < 2e-4
    assert max((got[k] - t).abs().max().item() for k, t in want.items()) < 1e-2
    assert mean_abs_diff(got, params(one_process)) > 4e-4


def test_fsdp_refuses_what_it_does_not_run(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"scale.learner: Input should be 'ddp' or 'fsdp' \(got 'zero3'\)"):
        build_config({"scale": {"learner": "zero3"}})
    refused = {  # each setting the sharded learner does not run, and what its message names
        "algo.name is 'ppo'": {"algo": {"name": "ppo", "minibatches": 1}},
        "rollout.backend is 'vllm'": {"rollout": {"backend": "vllm"}},
        "scale.rollout_workers / scale.reward_workers use Ray workers": {"scale": {"reward_workers": 1}},
        "lora.rank is 8; LoRA adapters are not sharded": {"lora": {"rank": 8}},
        "sft.steps is 10; the SFT warm start runs unsharded": {"sft": {"steps": 10}},
    }
    for message, section in refused.items():
        scale = {"learner": "fsdp", **section.get("scale", {})}
        with pytest.raises(ConfigError, match=re.escape(f"scale.learner = 'fsdp': {message}")):
            build_config({**section, "scale": scale})
    fsdp = {"scale": {"learner": "fsdp"}}
    build_config({**fsdp, "algo": {"name": "rloo"}, "train": {"gradient_checkpointing": True,  # these run sharded
                                                             "precision": "bf16"}})
    with pytest.raises(ConfigError, match="launch with torchrun --nproc_per_node N"):
        check_run(build_config(fsdp), None)  # one process: nothing to shard over
    monkeypatch.setenv("WORLD_SIZE", "3")  # 4 prompts x 4 samples / 2 minibatches = 8 rows: 3, 3 and 2
    with pytest.raises(ConfigError, match="a minibatch holds 8 rows .* cannot share equally; make it a multiple of 3"):
        check_run(build_config({**fsdp, "rollout": {"prompts_per_step": 4, "group_size": 4},
                                "algo": {"minibatches": 2}}), None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_run(build_config({**fsdp, "rollout": {"prompts_per_step": 4, "group_size": 4}}), None)
    cfg = build_config({**fsdp, "task": {"name": "guess_number"}})
    with pytest.raises(ConfigError, match="task.name = 'guess_number': its episodes are played in one process"):
        prepare_policy(cfg, make_task(cfg.task), tmp_path, None, torch.device("cpu"), MultiSink([]),
                       OneProcess(sharded=True))  # refused before the policy is built and every rank evaluates it
    assert not any(tmp_path.iterdir())


def test_torchrun_refuses_what_does_not_run_data_parallel(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="algo.name = 'ppo' runs in one process so far"):
        check_run(build_config({"algo": {"name": "ppo"}}), None)
    with pytest.raises(ConfigError, match="rollout.backend = 'vllm'"):
        check_run(build_config({"rollout": {"backend": "vllm"}}), None)
    with pytest.raises(ConfigError, match="use one or the other"):
        check_run(build_config({"scale": {"rollout_workers": 1}}), None)
    monkeypatch.setenv("WORLD_SIZE", "5")
    with pytest.raises(ConfigError, match="a minibatch holds 4 rows"):
        check_run(build_config({"rollout": {"prompts_per_step": 2, "group_size": 4}, "algo": {"minibatches": 2}}),
                  None)


class Joined(Exception):
    """Raised by a stand-in `init_process_group`: the run got as far as joining the process group."""


@pytest.mark.parametrize("learner", ["ddp", "fsdp"])
def test_dist_timeout_reaches_the_process_group(monkeypatch, tmp_path, learner):
    # rank 0 alone scores, evaluates and writes checkpoints while the other ranks wait in a collective: the
    # recipe's scale.dist_timeout_s must reach init_process_group, and 0 must leave torch's default
    import feedbackrl.scale.ddp as ddp
    from feedbackrl.train.run import run

    seen = []

    def init_process_group(backend, **kwargs):
        seen.append((backend, kwargs.get("timeout", "absent")))
        raise Joined

    monkeypatch.setattr(ddp.dist, "init_process_group", init_process_group)
    monkeypatch.setattr(ddp.dist, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    small = {"rollout": {"prompts_per_step": 4, "group_size": 4}}
    for timeout_s, want in ((90, datetime.timedelta(seconds=90)), (2.5, datetime.timedelta(seconds=2.5)), (0, None)):
        with pytest.raises(Joined):
            run(build_config({**small, "scale": {"learner": learner, "dist_timeout_s": timeout_s}}), tmp_path)
        assert seen.pop() == ("gloo", want), timeout_s
    for bad, message in ((-1, "greater than or equal to 0 (got -1)"), (float("inf"), "a finite number (got inf)")):
        with pytest.raises(ConfigError, match=re.escape(f"scale.dist_timeout_s: Input should be {message}")):
            build_config({"scale": {"dist_timeout_s": bad}})
    assert build_config({}).scale.dist_timeout_s == 0  # torch's default unless the recipe sets one


def test_ranks_on_one_node_share_its_cores(tmp_path):
    ranks = OneProcess(local_world=2)  # what a torchrun rank reports: 2 ranks on this node
    start_run(build_config({"train": {"threads": 0}}), tmp_path, ranks)
    assert torch.get_num_threads() == threads_per_process(2)
    start_run(build_config({"train": {"threads": 0}}), tmp_path)
    assert torch.get_num_threads() == threads_per_process(1)


def test_fsdp_refuses_a_model_without_decoder_layers_before_any_collective():
    # checked before the device mesh is built (no process group here): the CLI prints it as a config error
    from transformers import GPT2Config, GPT2LMHeadModel

    from feedbackrl.scale.fsdp import ShardedRanks

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(ConfigError, match=r"scale.learner = 'fsdp' shards decoder layers at model.model.layers .*; "
                                          r"GPT2LMHeadModel has none: use scale.learner = 'ddp'"):
        ShardedRanks(rank=0, world=2, local_world=2, backend="gloo").shard(gpt2)


@pytest.mark.slow
def test_fsdp_rloo_micro_batches_and_sampled_eval_as_one_process(tmp_path):
    # the paths the other sharded runs leave out: RLOO, micro-batches (each rank splits its share the same way),
    # no KL reference, and the held-out pass@k, whose sampled decoding every rank runs in step with the others
    # (a rank left out of it hangs the run; the untrained model reverses no word, so the scores are 0 on both)
    other = ("--set", "algo.name=rloo", "--set", "algo.kl_coef=0", "--set", "algo.steps=3", "--set", "eval.every=1",
             "--set", "eval.pass_k=2", "--set", "train.micro_batch_size=2", "--set", "task.heldout_size=8")
    train(tmp_path / "one", 1, *other)
    train(tmp_path / "fsdp", 2, *FSDP, *other)
    one, fsdp = rl_rows(tmp_path / "one"), rl_rows(tmp_path / "fsdp")
    assert sorted(fsdp) == [1, 2, 3] and len({r["reward/mean"] for r in one.values()}) > 1
    for step in one:
        for key in ("reward/mean", "rollout/len_mean", "eval/accuracy", "eval/pass@2"):
            assert fsdp[step].get(key) == one[step].get(key), (step, key)
        assert ("eval/pass@2" in one[step]) == (step < 3)  # every step but the last, which the final eval covers
        for key in ("loss/policy", "entropy/mean", "grad_norm"):
            assert fsdp[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
    after = [json.loads((tmp_path / d / "report.json").read_text())["eval_after"] for d in ("one", "fsdp")]
    assert after[0] == after[1] and after[0]["k"] == 2
