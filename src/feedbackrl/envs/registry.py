"""Tasks selectable by name in a recipe (`[task] name = "..."`, options in `[task.options]`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.base import Task
from feedbackrl.envs.dataset import DatasetError, DatasetTask
from feedbackrl.envs.procedural.addition import AdditionTask

TASKS: dict[str, Callable[..., Task]] = {
    "addition": AdditionTask,
    "dataset": DatasetTask,
}


def make_task(cfg: TaskConfig) -> Task:
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name: unknown task {cfg.name!r}; known tasks: {sorted(TASKS)}")
    factory = TASKS[cfg.name]
    if dataclasses.is_dataclass(factory):
        allowed = {f.name for f in dataclasses.fields(factory) if f.init and f.name != "name"}
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
