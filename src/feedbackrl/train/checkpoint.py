"""Checkpoints that resume exactly, for every loop: the policy's files, optimizer, every RNG, step, loop state.

Layout: `OUT/checkpoints/step_000042/` holds the policy's own files (`PolicyFiles`: a Hugging Face model and
tokenizer saved with `save_pretrained`, whose own `config.json` is the model config, so it loads like any HF
model; or a plain torch module's `policy.pt` beside a `config.json` of its shape), `trainer_state.pt` (step,
optimizer, the global torch RNG, each of the loop's named RNG streams and the loop's own state: a text task's
state, a control run's environments), one file per extra state of the algorithm (a value head, the multiplier)
and `run_config.json` (the resolved run config). The text loop (`train/onpolicy.py`) and the control loop
(`control/loop.py`) write and read their checkpoints here; only the policy's files differ between them.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.load import load_policy
from feedbackrl.scale.ranks import OneProcess, Ranks

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "run_config.json"  # not config.json: that name is the HF model config
MODULE_FILE = "policy.pt"  # a plain torch policy's state dict (`ModuleFiles`)
MODEL_CONFIG = "config.json"  # the policy's shape: a HF model's config, or what rebuilds a plain torch module
REFERENCE_DIR = "reference"  # OUT/reference/: the policy as it was when RL started (KL anchor)
REFERENCE_POINTER = "reference.json"  # or a pointer to the model directory that holds those weights
_STEP_DIR = re.compile(r"step_(\d+)$")
_SAVED = ("step", "optimizer", "torch_rng")  # in every trainer_state.pt, beside the loop's streams and state

Rng = random.Random | torch.Generator


class CheckpointError(ValueError):
    """A directory that is not a feedbackrl checkpoint (or a run with none to resume)."""


class PolicyFiles(Protocol):
    """The model-specific part of a checkpoint: the policy's own files in a checkpoint dir, and its weights read
    back from one (a monitor's rollback, a resume)."""

    def save(self, directory: Path) -> None: ...

    def load_weights(self, ckpt: Path) -> dict[str, Tensor]: ...


@dataclass
class PretrainedFiles:
    """A Hugging Face policy and its tokenizer, saved with `save_pretrained` (a LoRA model writes its adapter
    only; its base is recorded by path)."""

    model: Any  # None off rank 0 under torchrun, where nothing is written
    tokenizer: Any

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)

    def load_weights(self, ckpt: Path) -> dict[str, Tensor]:
        return load_policy(str(ckpt)).state_dict()


@dataclass
class ModuleFiles:
    """A plain torch module (a control policy): its state dict in `policy.pt`, and `config` (what rebuilds the
    module: its shape) in `config.json`."""

    module: nn.Module
    config: dict[str, Any]

    def save(self, directory: Path) -> None:
        torch.save(self.module.state_dict(), directory / MODULE_FILE)
        (directory / MODEL_CONFIG).write_text(json.dumps(self.config, indent=2))

    def load_weights(self, ckpt: Path) -> dict[str, Tensor]:
        if (ckpt / MODULE_FILE).is_file():
            return torch.load(ckpt / MODULE_FILE, weights_only=True)
        # control checkpoints written before policy.pt kept the weights in the trainer state
        return torch.load(ckpt / STATE_FILE, weights_only=False)["policy"]


@dataclass
class TrainerState:
    step: int
    optimizer: dict[str, Any] | None  # None: saved without (train.save_optimizer = false)
    torch_rng: torch.Tensor
    rngs: dict[str, Any]  # each named RNG stream's saved state (random.Random.getstate(), Generator.get_state())
    loop_state: dict[str, Any]  # the rest: the loop's own state (a text task's "task_state", a control collector)


def _rng_state(rng: Rng) -> Any:
    return rng.getstate() if isinstance(rng, random.Random) else rng.get_state()


def _set_rng_state(rng: Rng, state: Any) -> None:
    if isinstance(rng, random.Random):
        rng.setstate(state)
    else:
        rng.set_state(state)


def save_checkpoint(out_dir: Path, step: int, policy: PolicyFiles, optimizer_state: dict[str, Any] | None,
                    rngs: dict[str, Rng], config_json: str, loop_state: dict[str, Any] | None = None,
                    extras: dict[str, Any] | None = None) -> Path:
    """Write atomically: into a temp dir, then rename, so a crash never leaves half a checkpoint.

    `policy` writes the model's own files. `optimizer_state` is the optimizer's `state_dict()`; None leaves it
    out (`train.save_optimizer = false`: for a 135M model 1 GB of the 1.6 GB). `rngs`: the loop's RNG streams by
    name (the global torch RNG is always saved); `loop_state`: the loop's other state by name, pickled into
    trainer_state.pt with them. `extras` maps file names to state dicts the algorithm needs besides the policy
    (PPO's value head, the multiplier), one file each, read back with `load_extra`.
    """
    state = loop_state or {}
    clash = sorted(set(_SAVED) & set(rngs) | set(_SAVED) & set(state) | set(rngs) & set(state))
    if clash:
        raise ValueError(f"save_checkpoint: {clash} named twice among the trainer state's entries")
    final = Path(out_dir) / "checkpoints" / f"step_{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save(tmp)
    torch.save({"step": step, "optimizer": optimizer_state, "torch_rng": torch.get_rng_state(),
                **{name: _rng_state(rng) for name, rng in rngs.items()}, **state}, tmp / STATE_FILE)
    for name, extra in (extras or {}).items():
        torch.save(extra, tmp / name)
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


def load_trainer_state(ckpt: Path, rngs: Iterable[str] = ()) -> TrainerState:
    """`ckpt`'s trainer_state.pt; `rngs`: the names of the RNG streams it must hold."""
    try:
        raw = torch.load(ckpt / STATE_FILE, weights_only=False)
    except Exception as e:  # corrupt or foreign file: say which
        raise CheckpointError(f"{ckpt / STATE_FILE} could not be read: {e}") from e
    names = list(rngs)
    missing = (set(_SAVED) | set(names)) - set(raw)
    if missing:
        raise CheckpointError(f"{ckpt / STATE_FILE} lacks {sorted(missing)}: not a feedbackrl checkpoint of this "
                              "loop")
    return TrainerState(raw["step"], raw["optimizer"], raw["torch_rng"], {n: raw[n] for n in names},
                        {k: v for k, v in raw.items() if k not in _SAVED and k not in names})


def read_config_json(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / CONFIG_FILE).read_text())


def restore(ckpt: Path, optimizer: torch.optim.Optimizer, rngs: dict[str, Rng],
            load_optimizer: Callable[[dict[str, Any]], None] | None = None) -> TrainerState:
    """Put a loop back where `ckpt` left it: the optimizer, the global torch RNG and each of `rngs` (the loop's
    streams by name); -> the saved state, for its step and the loop's own state. `load_optimizer` puts the saved
    optimizer state in (default `optimizer.load_state_dict`; a sharded learner's ranks each keep their shard)."""
    state = load_trainer_state(ckpt, rngs)
    if state.optimizer is not None:
        (load_optimizer or optimizer.load_state_dict)(state.optimizer)
    else:  # saved with train.save_optimizer = false
        warnings.warn(f"{ckpt} has no optimizer state (train.save_optimizer = false): AdamW restarts from zero "
                      "moments, so the resumed run is not exact", stacklevel=2)
    for name, rng in rngs.items():
        _set_rng_state(rng, state.rngs[name])
    torch.set_rng_state(state.torch_rng)
    return state


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
