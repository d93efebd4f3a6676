"""Tasks selectable by name in a recipe (`[task] name = "..."`, options in `[task.options]`).

- addition: `procedural.addition.AdditionTask`
- reverse: `procedural.reverse.ReverseTask` (the demo task)
- dataset: `dataset.DatasetTask` (JSONL/Parquet/CSV/saved `datasets`; verifier exact, math or code)
- reasoning_gym: `reasoning_gym.ReasoningGymTask` (any reasoning-gym generator, `dataset` + `config`)
- planted_reverse: `planted.PlantedReverse` (a proxy reward with a known loophole, and a hidden gold check)
- adaptive_addition, adaptive_reverse, adaptive_reasoning_gym: `adaptive` (difficulty follows the recent pass rate)
- calculator_addition: `calculator.CalculatorAdditionTask` (episodes with a calculator tool)
- guess_number: `guess.GuessNumberTask` (episodes: find a hidden number from higher/lower feedback)
- verifiers: `verifiers_env.VerifiersTask` (a `verifiers` library environment, in its own virtualenv)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.adaptive import adaptive_addition, adaptive_reasoning_gym, adaptive_reverse
from feedbackrl.envs.base import Task
from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.envs.dataset import DatasetError, DatasetTask
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.envs.planted import PlantedReverse
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.envs.reasoning_gym import ReasoningGymTask
from feedbackrl.envs.verifiers_env import VerifiersTask

TASKS: dict[str, Callable[..., Task]] = {
    "addition": AdditionTask,
    "reverse": ReverseTask,
    "dataset": DatasetTask,
    "reasoning_gym": ReasoningGymTask,
    "adaptive_addition": adaptive_addition,
    "adaptive_reasoning_gym": adaptive_reasoning_gym,
    "adaptive_reverse": adaptive_reverse,
    "planted_reverse": PlantedReverse,
    "calculator_addition": CalculatorAdditionTask,
    "guess_number": GuessNumberTask,
    "verifiers": VerifiersTask,
}


def allowed_options(factory: Callable[..., Any]) -> set[str] | None:
    """The option names `factory` accepts (None when it takes **kwargs, so any may be right)."""
    if dataclasses.is_dataclass(factory):
        return {f.name for f in dataclasses.fields(factory) if f.init and f.name != "name"}
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "name"}


def make_task(cfg: TaskConfig) -> Task:
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name: unknown task {cfg.name!r}; known tasks: {sorted(TASKS)}")
    factory = TASKS[cfg.name]
    allowed = allowed_options(factory)
    if allowed is not None:
        unknown = sorted(set(cfg.options) - allowed)
        if unknown:
            raise ConfigError(f"task.options: unknown option(s) {unknown} for task {cfg.name!r}; "
                              f"allowed: {sorted(allowed)}")
    try:
        return factory(**cfg.options)
    except DatasetError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task.options for {cfg.name!r}: {e}") from None


def register_task(name: str, factory: Callable[..., Any]) -> None:
    TASKS[name] = factory
