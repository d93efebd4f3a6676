"""Checkpoints that resume exactly: model (HF format), optimizer, every RNG, step, task state.

Layout: `OUT/checkpoints/step_000042/` holds the model and tokenizer (`save_pretrained`, so it
loads like any HF model, whose own `config.json` is the model config), `trainer_state.pt`
(optimizer, RNG states, step, task state) and `run_config.json` (the resolved run config).
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.load import load_policy
from feedbackrl.scale.ranks import OneProcess, Ranks

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "run_config.json"  # not config.json: that name is the HF model config
REFERENCE_DIR = "reference"  # OUT/reference/: the policy as it was when RL started (KL anchor)
REFERENCE_POINTER = "reference.json"  # or a pointer to the model directory that holds those weights
_STEP_DIR = re.compile(r"step_(\d+)$")


class CheckpointError(ValueError):
    """A directory that is not a feedbackrl checkpoint (or a run with none to resume)."""


@dataclass
class TrainerState:
    step: int
    optimizer: dict[str, Any] | None  # None: saved without (train.save_optimizer = false)
    prompt_rng: Any  # random.Random.getstate()
    sample_rng: torch.Tensor  # torch.Generator.get_state()
    torch_rng: torch.Tensor
    task_state: dict[str, Any] | None = None


def save_checkpoint(out_dir: Path, model: Any, tokenizer: Any, optimizer_state: dict[str, Any] | None, step: int,
                    prompt_rng: random.Random, sample_rng: torch.Generator, config_json: str,
                    task_state: dict[str, Any] | None = None, extras: dict[str, Any] | None = None) -> Path:
    """Write atomically: into a temp dir, then rename, so a crash never leaves half a checkpoint.

    `extras` maps file names to state dicts the algorithm needs besides the policy (PPO's value head).
    A LoRA model writes its adapter only (its base is recorded by path). `optimizer_state` is the optimizer's
    `state_dict()`; None leaves it out (`train.save_optimizer = false`: for a 135M model 1 GB of the 1.6 GB).
    """
    final = Path(out_dir) / "checkpoints" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"step": step, "optimizer": optimizer_state,
                "prompt_rng": prompt_rng.getstate(), "sample_rng": sample_rng.get_state(),
                "torch_rng": torch.get_rng_state(), "task_state": task_state}, tmp / STATE_FILE)
    for name, state in (extras or {}).items():
        torch.save(state, tmp / name)
    (tmp / CONFIG_FILE).write_text(config_json)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def is_checkpoint(path: Path) -> bool:
    """Trainer state, run config, and a model (config.json) or a LoRA adapter (adapter_config.json)."""
    model = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    return path.is_dir() and model and all((path / f).is_file() for f in (STATE_FILE, CONFIG_FILE))


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    steps = sorted((int(m.group(1)), p) for p in root.glob("step_*")
                   if (m := _STEP_DIR.search(p.name)) and is_checkpoint(p)) if root.is_dir() else []
    return steps[-1][1] if steps else None


def resolve_resume(path: str | Path) -> Path:
    """Accept a checkpoint dir or a run dir (its latest checkpoint); explain what is wrong otherwise."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"cannot resume from {str(path)!r}: it does not exist")
    if is_checkpoint(path):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(
            f"cannot resume from {str(path)!r}: it is neither a checkpoint (a dir with {STATE_FILE}, "
            f"{CONFIG_FILE} and model files) nor a run dir with checkpoints/step_*/ inside")
    return latest


def load_trainer_state(ckpt: Path) -> TrainerState:
    try:
        raw = torch.load(ckpt / STATE_FILE, weights_only=False)
    except Exception as e:  # corrupt or foreign file: say which
        raise CheckpointError(f"{ckpt / STATE_FILE} could not be read: {e}") from e
    missing = {"step", "optimizer", "prompt_rng", "sample_rng", "torch_rng"} - set(raw)
    if missing:
        raise CheckpointError(f"{ckpt / STATE_FILE} lacks {sorted(missing)}: not a feedbackrl checkpoint")
    return TrainerState(raw["step"], raw["optimizer"], raw["prompt_rng"], raw["sample_rng"], raw["torch_rng"],
                        raw.get("task_state"))


def read_config_json(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / CONFIG_FILE).read_text())


def restore(ckpt: Path, optimizer: torch.optim.Optimizer, prompt_rng: random.Random, sample_rng: torch.Generator,
            task: Any, load_optimizer: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Put an on-policy loop back where `ckpt` left it (optimizer, RNG streams, task state); -> its step.
    `load_optimizer` puts the saved optimizer state in (default `optimizer.load_state_dict`; a sharded
    learner's ranks each keep their shard of it)."""
    state = load_trainer_state(ckpt)
    if state.optimizer is not None:
        (load_optimizer or optimizer.load_state_dict)(state.optimizer)
    else:  # saved with train.save_optimizer = false
        warnings.warn(f"{ckpt} has no optimizer state (train.save_optimizer = false): AdamW restarts from zero "
                      "moments, so the resumed run is not exact", stacklevel=2)
    prompt_rng.setstate(state.prompt_rng)
    sample_rng.set_state(state.sample_rng)
    torch.set_rng_state(state.torch_rng)
    if state.task_state is not None:
        task.load_state_dict(state.task_state)
    return state.step


def load_extra(ckpt: Path, name: str) -> Any:
    """A state dict saved with `save_checkpoint(..., extras={name: ...})`; a clear error when it is missing."""
    if not (ckpt / name).is_file():
        raise CheckpointError(f"cannot resume from {str(ckpt)!r}: it has no {name} (was it written by another "
                              "algorithm?)")
    return torch.load(ckpt / name, weights_only=True)


def frozen_reference(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path,
                     resume_from: Path | None, source: str | Path | None = None,
                     ranks: Ranks | None = None) -> PreTrainedModel:
    """The reference is the policy as it was when RL started, recorded once so a resume reloads it.

    When those weights already sit in a model directory (`source`: the SFT policy the run saved, the
    model it loaded), OUT/reference.json points at it and nothing is copied; otherwise the reference is
    saved to OUT/reference/. A resume reads it from the checkpoint's own run dir (RUN/checkpoints/step_N
    -> RUN), so resuming into a new out dir never freezes the resumed policy instead. Under `torchrun`
    (`ranks`) only rank 0 records it. A sharded policy (`Ranks.sharded`) cannot be deep-copied: its
    reference is read from `source`, or from the copy rank 0 saves of the gathered policy, and sharded.
    """
    ranks = ranks or OneProcess()
    if resume_from is None and ranks.sharded and source is None:  # a copy to read back: written, then read
        whole = ranks.full_model(model)
        if ranks.main:
            whole.save_pretrained(Path(out_dir) / REFERENCE_DIR)
            tokenizer.save_pretrained(Path(out_dir) / REFERENCE_DIR)
        ranks.barrier()
        return ranks.shard(load_policy(str(Path(out_dir) / REFERENCE_DIR)).eval().requires_grad_(False))
    if resume_from is None:
        pointer = Path(source).resolve() if source is not None else None
        ref = copy.deepcopy(model) if not ranks.sharded else load_policy(str(pointer))
    else:
        run_dir = Path(resume_from).parent.parent
        ref, pointer = _saved_reference(run_dir, resume_from)
        ref = ref.to(model.device) if not ranks.sharded else ref
    same_dir = resume_from is not None and Path(resume_from).parent.parent.resolve() == Path(out_dir).resolve()
    if ranks.main and not same_dir:
        if pointer is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / REFERENCE_POINTER).write_text(json.dumps({"path": str(pointer)}) + "\n")
        else:
            ref.save_pretrained(Path(out_dir) / REFERENCE_DIR)
            tokenizer.save_pretrained(Path(out_dir) / REFERENCE_DIR)
    ref.eval().requires_grad_(False)
    return ranks.shard(ref)


def _saved_reference(run_dir: Path, resume_from: Path) -> tuple[PreTrainedModel, Path | None]:
    """The frozen reference a run recorded: (the model, the directory it points at or None for a copy)."""
    if (run_dir / REFERENCE_DIR).is_dir():
        return load_policy(str(run_dir / REFERENCE_DIR)), None
    if (run_dir / REFERENCE_POINTER).is_file():
        pointer = Path(json.loads((run_dir / REFERENCE_POINTER).read_text())["path"])
        if not pointer.is_dir():
            raise CheckpointError(f"cannot resume from {str(resume_from)!r}: its frozen reference is the model in "
                                  f"{str(pointer)!r} ({run_dir / REFERENCE_POINTER}), which no longer exists")
        return load_policy(str(pointer)), pointer
    raise CheckpointError(f"cannot resume from {str(resume_from)!r} with algo.kl_coef > 0: its frozen reference "
                          f"({str(run_dir / REFERENCE_DIR)!r} or {REFERENCE_POINTER}) is missing (was the run started "
                          "with kl_coef = 0, or the checkpoint moved out of its run dir?)")
