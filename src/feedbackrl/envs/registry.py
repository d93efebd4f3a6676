"""Tasks selectable by name in a recipe (`[task] name = "..."`, options in `[task.options]`).

- addition: `procedural.addition.AdditionTask`
- reverse: `procedural.reverse.ReverseTask` (the demo task)
- word_problems: `procedural.word_problems.WordProblemTask` (GSM8K-style stories of 1-3 steps)
- dataset: `dataset.DatasetTask` (JSONL/Parquet/CSV/saved `datasets`; verifier exact, math or code)
- reasoning_gym: `reasoning_gym.ReasoningGymTask` (any reasoning-gym generator, `dataset` + `config`)
- planted_reverse: `planted.PlantedReverse` (a proxy reward with a known loophole, and a hidden gold check)
- adaptive_addition, adaptive_reverse, adaptive_reasoning_gym: `adaptive` (difficulty follows the recent pass rate)
- calculator_addition: `calculator.CalculatorAdditionTask` (episodes with a calculator tool)
- guess_number: `guess.GuessNumberTask` (episodes: find a hidden number from higher/lower feedback)
- secret: `secret.SecretTask` (a code word in a preamble: benign requests answered, extraction attempts refused)
- verifiers: `verifiers_env.VerifiersTask` (a `verifiers` library environment, in its own virtualenv)

Beyond these, `name` may point at user code, ``"package.module:Class"`` or ``"path/to/file.py:Class"``
(a class or factory called with `[task.options]`, returning a `Task`), or be the name of an entry point of
group ``feedbackrl.tasks`` that an installed package declares (`feedbackrl.plugins`). Built-in names win.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from feedbackrl import plugins
from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.adaptive import adaptive_addition, adaptive_reasoning_gym, adaptive_reverse
from feedbackrl.envs.base import Task
from feedbackrl.envs.calculator import CalculatorAdditionTask
from feedbackrl.envs.dataset import DatasetError, DatasetTask
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.envs.planted import PlantedReverse
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.envs.procedural.reverse import ReverseTask
from feedbackrl.envs.procedural.word_problems import WordProblemTask
from feedbackrl.envs.reasoning_gym import ReasoningGymTask
from feedbackrl.envs.secret import SecretTask
from feedbackrl.envs.verifiers_env import VerifiersTask

TASKS: dict[str, Callable[..., Task]] = {
    "addition": AdditionTask,
    "reverse": ReverseTask,
    "word_problems": WordProblemTask,
    "dataset": DatasetTask,
    "reasoning_gym": ReasoningGymTask,
    "adaptive_addition": adaptive_addition,
    "adaptive_reasoning_gym": adaptive_reasoning_gym,
    "adaptive_reverse": adaptive_reverse,
    "planted_reverse": PlantedReverse,
    "calculator_addition": CalculatorAdditionTask,
    "guess_number": GuessNumberTask,
    "secret": SecretTask,
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


TASK_MEMBERS = ("name", "sample", "heldout", "verify", "verify_batch", "observe", "difficulty", "state_dict",
                "load_state_dict", "kind", "demonstrate")


def installed_tasks() -> dict[str, str]:
    """Tasks installed packages declare (entry point group `feedbackrl.tasks`) that the registry does not
    already hold, by name -> the object they refer to (nothing is imported)."""
    return {name: ep.value for name, ep in plugins.entry_points(plugins.TASK_GROUP).items() if name not in TASKS}


def task_factory(name: str) -> Callable[..., Any]:
    """What `task.name` names: a registry entry, user code (``module:Class``, ``file.py:Class``) or an
    installed entry point; a ConfigError listing what exists otherwise."""
    if name in TASKS:
        return TASKS[name]
    if plugins.is_reference(name):
        factory = plugins.load_object(name, "task.name")
    elif name in installed_tasks():
        factory = plugins.load_entry_point(plugins.TASK_GROUP, name, "task.name")
    else:
        installed = sorted(installed_tasks())
        raise ConfigError(f"task.name: unknown task {name!r}; known tasks: {sorted(TASKS)}"
                          + (f", installed: {installed}" if installed else "")
                          + "; your own task class: 'package.module:Class' or 'path/to/file.py:Class'")
    if not callable(factory):
        raise ConfigError(f"task.name = {name!r} names a {type(factory).__name__}, not a task class or factory")
    return factory


def make_task(cfg: TaskConfig) -> Task:
    factory = task_factory(cfg.name)
    allowed = allowed_options(factory)
    if allowed is not None:
        unknown = sorted(set(cfg.options) - allowed)
        if unknown:
            raise ConfigError(f"task.options: unknown option(s) {unknown} for task {cfg.name!r}; "
                              f"allowed: {sorted(allowed)}")
    try:
        task = factory(**cfg.options)
    except DatasetError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task.options for {cfg.name!r}: {e}") from None
    missing = [m for m in TASK_MEMBERS if not hasattr(task, m)]  # user code: the loop calls every one
    if missing:
        raise ConfigError(f"task.name = {cfg.name!r} built a {type(task).__name__} without {missing}: subclass "
                          "feedbackrl.envs.base.Task, which gives the defaults of every part but name, "
                          "sample(rng), heldout(n) and verify(problem, completion)")
    return task


def register_task(name: str, factory: Callable[..., Any]) -> None:
    TASKS[name] = factory
