"""Detectors selectable by name in a recipe's `[monitors]` section; a new detector is one line here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from feedbackrl.config import ConfigError
from feedbackrl.monitors.base import Detector
from feedbackrl.monitors.drift import Disagreement, KLPerReward, PreferenceDisplacement, TrainVsHeldOut
from feedbackrl.monitors.hacking import (
    EnsembleDisagreement,
    FormatOnly,
    JudgeAddress,
    LengthGaming,
    PromptCopy,
    ProxyGoldDivergence,
    SandboxCheat,
)
from feedbackrl.monitors.health import EntropyCollapse, KLBlowup, Repetition, ZeroVariance

DETECTORS: dict[str, Callable[..., Detector]] = {
    "length_gaming": LengthGaming,
    "format_only": FormatOnly,
    "proxy_gold": ProxyGoldDivergence,
    "prompt_copy": PromptCopy,
    "kl_per_reward": KLPerReward,
    "train_vs_heldout": TrainVsHeldOut,
    "disagreement": Disagreement,
    "preference_displacement": PreferenceDisplacement,
    "ensemble_disagreement": EnsembleDisagreement,
    "sandbox_cheat": SandboxCheat,
    "judge_address": JudgeAddress,
    "repetition": Repetition,
    "entropy_collapse": EntropyCollapse,
    "kl_blowup": KLBlowup,
    "zero_variance": ZeroVariance,
}


INTERNAL = {"name", "kind", "stat", "what"}  # fields that are not settings


def build_detectors(names: list[str], options: dict[str, dict[str, Any]]) -> list[Detector]:
    """The detectors `names` (["all"] = every registered one), each built with its `options`."""
    chosen = list(DETECTORS) if names == ["all"] else names
    unknown = sorted((set(chosen) | set(options)) - set(DETECTORS))
    if unknown:
        raise ConfigError(f"monitors: unknown detector(s) {unknown}; known: {sorted(DETECTORS)}")
    out = []
    for name in chosen:
        factory, opts = DETECTORS[name], options.get(name, {})
        allowed = {f.name for f in dataclasses.fields(factory) if f.name not in INTERNAL}  # type: ignore[arg-type]
        bad = sorted(set(opts) - allowed)
        if bad:
            raise ConfigError(f"monitors.options.{name}: unknown option(s) {bad}; allowed: {sorted(allowed)}")
        out.append(factory(**opts))
    return out
