"""A run stopped at a checkpoint and resumed must end bit-for-bit where the uninterrupted run ends.

GRPO here, and RLOO (the same loop with leave-one-out advantages); PPO in test_resume_learned_reward.py."""

import copy
import json
import math
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from feedbackrl.config import RunConfig, build_config
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_trainer_state,
    read_config_json,
    resolve_resume,
)
from feedbackrl.train.constraint import CONSTRAINT_FILE
from feedbackrl.train.grpo import train_grpo
from feedbackrl.train.prefs import gold_scorer, training_cost
from feedbackrl.train.probe import PROBE_FILE, fingerprint

COMPLETION_LEN = 4


@dataclass
class ShapedAddition(AdditionTask):
    """Addition with partial credit and state.

    The score is the fraction of digits among the 4 generated characters, so even a random policy
    gets rewards that differ within a group (nonzero advantages: the policy really moves). The state
    (batches seen) sets the difficulty: 1-digit problems for 2 batches, then 2-digit ones, so a resume
    that lost the task state would train on other prompts.
    """

    batches: int = 0

    def sample(self, rng: random.Random) -> Problem:
        return AdditionTask(digits=1 + self.batches // 2).sample(rng)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        score = min(sum(c.isdigit() for c in completion), COMPLETION_LEN) / COMPLETION_LEN
        return Verdict(score, score == 1.0, f"{score:.2f} digits")

    def observe(self, problems: list[Problem], verdicts: list[Verdict]) -> None:
        self.batches += 1

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


def config(steps: int, algo: str = "grpo") -> RunConfig:
    # two epochs x two minibatches: old log-probs and minibatch shuffling are in play;
    # kl_coef > 0: the frozen reference is too.
    return build_config({
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": COMPLETION_LEN},
        "algo": {"name": algo, "steps": steps, "epochs": 2, "minibatches": 2, "kl_coef": 0.1, "lr": 1e-2},
        "train": {"seed": 3, "checkpoint_every": 2},
    })


def train(model_dir: Path, out: Path, steps: int, sink, resume_from: Path | None = None, algo: str = "grpo"):
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    train_grpo(config(steps, algo), model, tokenizer, ShapedAddition(), out, sink, resume_from=resume_from)
    return model


@pytest.fixture(scope="module")
def full_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """4 uninterrupted steps: (final parameters, metrics by step, run dir)."""
    out, rows = tmp_path_factory.mktemp("full"), MemorySink()
    model = train(tiny_model_dir, out, 4, rows)
    return {k: v.clone() for k, v in model.state_dict().items()}, rows.by_step, out


@pytest.fixture(scope="module")
def half_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run stopped after 2 steps (it checkpoints at step 2). Copy before writing into it."""
    out = tmp_path_factory.mktemp("half")
    train(tiny_model_dir, out, 2, MemorySink())
    return out


def assert_same_parameters(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    differ = [k for k in want if not torch.equal(got[k], want[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[0]}: max abs diff " \
                       f"{(got[differ[0]] - want[differ[0]]).abs().max().item():.3g}"


@pytest.mark.parametrize("into", ["same-run-dir", "new-out-dir"])
def test_resume_is_bit_exact(full_run, half_run: Path, tmp_path: Path, into: str):
    want, full_rows, _ = full_run
    run = shutil.copytree(half_run, tmp_path / "run")
    ckpt = resolve_resume(run)
    assert ckpt.name == "step_000002"
    torch.manual_seed(12345)  # a fresh process would start from other global RNG state
    rows = MemorySink()
    out = run if into == "same-run-dir" else tmp_path / "elsewhere"
    model = train(ckpt, out, 4, rows, resume_from=ckpt)  # model reloaded from the checkpoint dir
    assert_same_parameters(model.state_dict(), want)
    assert sorted(rows.by_step) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", "loss/policy", "kl/mean", "clip_frac"):
            assert rows.by_step[step][key] == full_rows[step][key], (step, key)


def test_rloo_resume_is_bit_exact(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """RLOO: 4 steps in one go, and 2 steps then a resume from the step-2 checkpoint, end identical."""
    from feedbackrl.train import grpo

    calls = []
    real = grpo.ADVANTAGES["rloo"]
    monkeypatch.setitem(grpo.ADVANTAGES, "rloo", lambda *a, **k: calls.append(1) or real(*a, **k))
    full_rows, half_rows, rows = MemorySink(), MemorySink(), MemorySink()
    want = train(tiny_model_dir, tmp_path / "full", 4, full_rows, algo="rloo").state_dict()
    train(tiny_model_dir, tmp_path / "half", 2, half_rows, algo="rloo")
    ckpt = resolve_resume(tmp_path / "half")
    assert ckpt.name == "step_000002" and read_config_json(ckpt)["algo"]["name"] == "rloo"
    torch.manual_seed(12345)  # a fresh process would start from other global RNG state
    model = train(ckpt, tmp_path / "half", 4, rows, resume_from=ckpt, algo="rloo")
    assert len(calls) == 4 + 2 + 2  # every step took the leave-one-out advantages
    base = load_policy(str(tiny_model_dir)).state_dict()
    assert max((want[k] - base[k]).abs().max().item() for k in base) > 1e-3  # the policy moved
    assert_same_parameters(model.state_dict(), want)
    assert sorted(rows.by_step) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", "loss/policy", "kl/mean", "clip_frac"):
            assert rows.by_step[step][key] == full_rows.by_step[step][key], (step, key)
    assert any(full_rows.by_step[s]["clip_frac"] > 0 for s in full_rows.by_step)


def test_the_resumed_run_exercises_every_path(full_run, tiny_model_dir: Path):
    # Preconditions for the bit-exact test to mean something: the policy moved, the KL term was
    # live and some updates were clipped (old log-probs differed from the current ones).
    want, rows, _ = full_run
    base = load_policy(str(tiny_model_dir)).state_dict()
    moved = max((want[k] - base[k]).abs().max().item() for k in base)
    assert moved > 1e-3, moved
    assert all(rows[s]["kl/mean"] > 0 for s in (2, 3, 4)), rows
    assert any(rows[s]["clip_frac"] > 0 for s in rows), rows
    assert len({rows[s]["reward/mean"] for s in rows}) > 1


def test_checkpoint_layout(half_run: Path, tiny_model_dir: Path):
    ckpt = half_run / "checkpoints" / "step_000002"
    state = load_trainer_state(ckpt, ["prompt_rng", "sample_rng"])
    assert state.step == 2 and state.loop_state == {"task_state": {"batches": 2}}
    assert sorted(state.rngs) == ["prompt_rng", "sample_rng"] and state.optimizer is not None
    assert read_config_json(ckpt) == config(2).model_dump(mode="json")
    # the model files are an ordinary HF model directory
    again = AutoModelForCausalLM.from_pretrained(ckpt)
    assert again.config.model_type == "llama"
    # the frozen KL reference is the policy at the start of RL
    ref = load_policy(str(half_run / "reference")).state_dict()
    assert_same_parameters(ref, load_policy(str(tiny_model_dir)).state_dict())


def test_latest_checkpoint_and_resolve_resume(full_run, tmp_path: Path):
    _, _, run = full_run
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert latest_checkpoint(run).name == "step_000004"
    assert resolve_resume(run) == latest_checkpoint(run)
    assert resolve_resume(run / "checkpoints" / "step_000002").name == "step_000002"
    # a half-written checkpoint (crash before the rename) is never picked
    copy = shutil.copytree(run, tmp_path / "run")
    shutil.copytree(copy / "checkpoints" / "step_000004", copy / "checkpoints" / "step_000006.tmp")
    assert latest_checkpoint(copy).name == "step_000004"


def test_resolve_resume_rejects_a_dir_that_is_not_a_checkpoint(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError) as err:
        resolve_resume(tmp_path)
    msg = str(err.value)
    assert repr(str(tmp_path)) in msg and "neither a checkpoint" in msg and "trainer_state.pt" in msg


def test_resolve_resume_rejects_a_missing_path(tmp_path: Path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(tmp_path / "gone")


def test_unreadable_trainer_state_is_a_checkpoint_error(half_run: Path, tmp_path: Path):
    ckpt = shutil.copytree(half_run / "checkpoints" / "step_000002", tmp_path / "ckpt")
    (ckpt / "trainer_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="could not be read"):
        load_trainer_state(ckpt)
    torch.save({"step": 1}, ckpt / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="not a feedbackrl checkpoint"):
        load_trainer_state(ckpt)


def test_resume_with_kl_needs_the_runs_frozen_reference(half_run: Path, tmp_path: Path):
    # A checkpoint copied out of its run dir has no reference next to it: refuse rather than
    # silently freezing the resumed policy as the reference.
    ckpt = shutil.copytree(half_run / "checkpoints" / "step_000002", tmp_path / "a" / "b" / "step_000002")
    with pytest.raises(CheckpointError, match="frozen reference"):
        train(ckpt, tmp_path / "out", 4, MemorySink(), resume_from=ckpt)


def test_min_new_tokens_reaches_the_rollouts(peaked_lm, tokenizer, tmp_path: Path):
    # at temperature 5 the peaked model ends most rows early (tests/rollout checks the same without the
    # ban); with EOS suppressed for all 6 tokens every completion is full length
    cfg = build_config({
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 6, "min_new_tokens": 6,
                    "temperature": 5.0},
        "algo": {"steps": 1}, "train": {"checkpoint_every": 0},
    })
    rows = MemorySink()
    train_grpo(cfg, copy.deepcopy(peaked_lm), tokenizer, ShapedAddition(), tmp_path, rows)
    assert rows.by_step[1]["rollout/len_mean"] == 6.0
    assert rows.by_step[1]["rollout/truncated_frac"] == 1.0


def constrained_config(steps: int, multiplier: str) -> RunConfig:
    """`config` with a cost (a digit 0-4 in the completion; the reward asks for digits) kept under 0.2."""
    gains = {"lr": 0.5} if multiplier == "lagrangian" else {"kp": 1.0, "ki": 0.5, "kd": 1.0}
    data = json.loads(config(steps).model_dump_json())
    data.update(cost={"source": "regex", "pattern": "[0-4]", "mode": "search"},
                constraint={"threshold": 0.2, "multiplier": multiplier, "window": 24, **gains})
    return build_config(data)


def train_constrained(model_dir: Path, out: Path, steps: int, multiplier: str, sink,
                      resume_from: Path | None = None):
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    cfg, task = constrained_config(steps, multiplier), ShapedAddition()
    scorer = gold_scorer(task.verify_batch, None, training_cost(cfg, task))
    train_grpo(cfg, model, tokenizer, task, out, sink, resume_from=resume_from, scorer=scorer)
    return model


@pytest.mark.parametrize("multiplier", ["lagrangian", "pid"])
def test_a_constrained_resume_is_bit_exact_lambda_included(tiny_model_dir: Path, tmp_path: Path, multiplier: str):
    full = MemorySink()
    want = {k: v.clone() for k, v in
            train_constrained(tiny_model_dir, tmp_path / "full", 4, multiplier, full).state_dict().items()}
    train_constrained(tiny_model_dir, tmp_path / "half", 2, multiplier, MemorySink())
    ckpt = resolve_resume(tmp_path / "half")
    saved = torch.load(ckpt / CONSTRAINT_FILE, weights_only=True)
    assert saved["multiplier"] == multiplier
    lam = math.exp(saved["state"]["log_lambda"]) if multiplier == "lagrangian" else saved["state"]["lam"]
    assert lam == full.by_step[2]["constraint/lambda"]
    assert len(saved["state"]["window"]) == 24  # 2 steps x 16 completions, the last 24 kept
    torch.manual_seed(12345)
    rows = MemorySink()
    model = train_constrained(ckpt, tmp_path / "half", 4, multiplier, rows, resume_from=ckpt)
    assert_same_parameters(model.state_dict(), want)
    lams = [full.by_step[s]["constraint/lambda"] for s in (1, 2, 3, 4)]
    assert len(set(lams)) > 1, lams  # the multiplier really moved
    for step in (3, 4):
        for key in ("reward/mean", "cost/mean", "constraint/lambda", "constraint/cost_window_mean", "loss/policy"):
            assert rows.by_step[step][key] == full.by_step[step][key], (step, key)


def probed_config(steps: int, probe_from: str = "train") -> RunConfig:
    """`constrained_config` (PID) with the multiplier on 6 probe prompts, 4 of them sampled a step."""
    data = json.loads(config(steps).model_dump_json())
    data.update(cost={"source": "regex", "pattern": "[0-4]", "mode": "search"},
                constraint={"threshold": 0.2, "multiplier": "pid", "kp": 1.0, "ki": 0.5, "kd": 1.0, "window": 12,
                            "probe_prompts": 6, "probe_per_step": 4, "probe_from": probe_from})
    return build_config(data)


def train_probed(model_dir: Path, out: Path, steps: int, sink, resume_from: Path | None = None,
                 probe_from: str = "train"):
    model, tokenizer = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    cfg, task = probed_config(steps, probe_from), ShapedAddition()
    scorer = gold_scorer(task.verify_batch, None, training_cost(cfg, task))
    train_grpo(cfg, model, tokenizer, task, out, sink, resume_from=resume_from, scorer=scorer)
    return model, task


@pytest.mark.parametrize("probe_from", ["train", "heldout"])
def test_a_resume_with_probe_prompts_is_bit_exact(tiny_model_dir: Path, tmp_path: Path, probe_from: str):
    full = MemorySink()
    model, task = train_probed(tiny_model_dir, tmp_path / "full", 4, full, probe_from=probe_from)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    assert task.batches == 4  # the probes' verdicts never reach the task: only the 4 training batches moved it
    # the first step samples a whole window (12 = the 6 probes twice), then 4 a step, cycling through the 6
    assert [full.by_step[s]["constraint/probe_n"] for s in (1, 2, 3, 4)] == [12.0, 4.0, 4.0, 4.0]
    assert all(0.0 <= full.by_step[s]["constraint/probe_cost"] <= 1.0 for s in (1, 2, 3, 4))
    train_probed(tiny_model_dir, tmp_path / "half", 2, MemorySink(), probe_from=probe_from)
    ckpt = resolve_resume(tmp_path / "half")
    probe = torch.load(ckpt / PROBE_FILE, weights_only=True)
    assert (probe["position"], probe["calls"], probe["size"]) == (4, 2, 6)  # 12 + 4 = 16 = 2 cycles + 4
    n = probed_config(4).task.heldout_size  # heldout: the 6 held-out problems after the evaluated ones
    drawn = task.heldout(n + 6)[n:] if probe_from == "heldout" else None
    assert drawn is None or probe["fingerprint"] == fingerprint(drawn)
    assert len(torch.load(ckpt / CONSTRAINT_FILE, weights_only=True)["state"]["window"]) == 12
    torch.manual_seed(12345)
    rows = MemorySink()
    model, _ = train_probed(ckpt, tmp_path / "half", 4, rows, resume_from=ckpt, probe_from=probe_from)
    assert_same_parameters(model.state_dict(), want)
    for step in (3, 4):
        for key in ("constraint/probe_cost", "constraint/lambda", "constraint/cost_window_mean", "cost/mean",
                    "loss/policy"):
            assert rows.by_step[step][key] == full.by_step[step][key], (step, key)


def test_a_resume_with_other_probe_prompts_is_refused(tiny_model_dir: Path, tmp_path: Path):
    train_probed(tiny_model_dir, tmp_path / "half", 2, MemorySink())
    ckpt = resolve_resume(tmp_path / "half")
    state = torch.load(ckpt / PROBE_FILE, weights_only=True)
    torch.save({**state, "fingerprint": "0" * 64}, ckpt / PROBE_FILE)
    with pytest.raises(ValueError, match="probe prompts .* are not the ones this run draws"):
        train_probed(ckpt, tmp_path / "half", 4, MemorySink(), resume_from=ckpt)
