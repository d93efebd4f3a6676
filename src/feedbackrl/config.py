"""Run configuration: pydantic models with `extra="forbid"`, so a typo is an error, not a default.

A recipe is a small TOML file that sets only what differs from these defaults; the CLI overrides
single values with dotted keys (`--set algo.lr=3e-4`). Every error names the field, the value
given and what is allowed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A recipe or override that does not describe a valid run."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("tiny", description='HF model dir or hub id; "tiny" builds a tiny local model')
    size: Literal["tiny", "small"] = Field("tiny", description="size of the locally built model (path=tiny)")
    init_seed: int = Field(0, description="seed of the random init of a locally built model")


class TaskConfig(Section):
    name: str = Field("addition", description="task registry key, see `feedbackrl tasks`")
    options: dict[str, Any] = Field(default_factory=dict, description="task constructor options")
    heldout_size: int = Field(200, ge=1, le=100_000, description="held-out problems used for eval")


class SFTConfig(Section):
    steps: int = Field(0, ge=0, description="SFT warm-start steps on the task's demonstrations; 0 = none")
    batch_size: int = Field(64, ge=1, description="demonstrations per SFT step")
    lr: float = Field(1e-3, gt=0, le=1, description="AdamW learning rate for SFT")
    warmup_steps: int = Field(20, ge=0, description="linear LR warm-up steps")


class RolloutConfig(Section):
    prompts_per_step: int = Field(16, ge=1, description="B: prompts sampled per training step")
    group_size: int = Field(8, ge=1, description="G: completions per prompt")
    max_new_tokens: int = Field(8, ge=1, le=4096, description="cap on generated tokens")
    temperature: float = Field(1.0, gt=0, le=10, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")


class GRPOConfig(Section):
    name: Literal["grpo"] = Field("grpo", description="algorithm")
    steps: int = Field(100, ge=0, description="training steps (one rollout batch each)")
    lr: float = Field(2e-4, gt=0, le=1, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    epochs: int = Field(1, ge=1, le=64, description="optimisation passes over each rollout batch")
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch (splits the batch)")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip below 1 (ratio >= 1 - clip_low)")
    clip_high: float = Field(0.2, ge=0, le=10, description="PPO clip above 1; > clip_low is clip-higher")
    kl_coef: float = Field(0.0, ge=0, description="beta of the k3 KL to a frozen reference; 0 loads none")
    scale_advantages: bool = Field(True, description="divide by group std (False = Dr. GRPO)")
    aggregation: Literal["token_mean", "sequence_mean", "fixed_length_sum"] = Field(
        "token_mean", description="how per-token losses become a scalar")


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="evaluate every N training steps; 0 = only before/after")
    pass_k: int = Field(4, ge=1, le=256, description="k for pass@k (sampled at the rollout temperature)")
    batch_size: int = Field(256, ge=1, description="prompts per generation batch in eval")


class TrainConfig(Section):
    seed: int = Field(0, description="seed for data order and sampling")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps; 0 = only at the end")
    tensorboard: bool = Field(False, description="also log to TensorBoard (needs the tensorboard extra)")


class RunConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: GRPOConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        n = self.rollout.prompts_per_step * self.rollout.group_size
        if n % self.algo.minibatches:
            raise ValueError(f"algo.minibatches={self.algo.minibatches} must divide prompts_per_step*group_size={n}")
        if self.algo.scale_advantages and self.rollout.group_size < 2:
            raise ValueError("rollout.group_size must be >= 2 for group-normalised advantages")
        return self


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        if not e["loc"]:  # a cross-field check: its message names the fields; the input is the whole recipe
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key (value {e['input']!r}); check the spelling, "
                         "see `feedbackrl config` for the allowed keys")
        else:
            lines.append(f"  {loc}: {e['msg']} (got {e['input']!r})")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """'algo.lr=3e-4' -> (['algo', 'lr'], 0.0003). Values are parsed as TOML, else kept as strings."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k!r} is a value, not a section")
        node[keys[-1]] = value
    return data


def build_config(data: dict[str, Any], source: str = "recipe") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML recipe (or start from defaults), apply dotted overrides, validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe {str(path)!r} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"recipe {str(path)!r} is not valid TOML: {e}") from None
        source = str(path)
    return build_config(apply_overrides(data, overrides or []), source)
