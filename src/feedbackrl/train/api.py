"""The Python API: `feedbackrl.train(...)` does what `feedbackrl train RECIPE --out DIR --set KEY=VALUE` does,
and also takes a reward function and a task object built in the calling process.

    import feedbackrl

    def starts_right(problem, completion):
        return float(completion[:1] == problem.answer[:1])

    report = feedbackrl.train("recipes/reverse_grpo.toml", out="runs/mine", reward=starts_right,
                              overrides={"algo.steps": 20})

- `recipe`: a TOML file, a dict with the recipe's sections (as the TOML would parse), a `RunConfig`, or None
  (the defaults).
- `overrides`: ``["algo.steps=20"]`` as `--set` takes them, or ``{"algo.steps": 20}`` (values as they are).
- `reward`: a function called as ``fn(problem, completion)``, or a dict of the `[reward] source = "python"`
  options with the function itself as `function`: ``{"function": fn, "signature": "trl", "score_range":
  [-1, 1]}`` (docs/rewards.md, Your own function). Not together with a recipe's own `[reward]` section.
- `task`: a task object (`feedbackrl.envs.base.Task`: subclass it for the defaults); its `name` is recorded
  as `task.name` in the run's config.json.
- `resume`: a checkpoint or run directory to continue, as `--resume`.

Returns the run's report (what `report.json` holds). Errors are the CLI's: a `ConfigError` (or `DatasetError`,
`ModelLoadError`, ...) naming the field, and a `RewardFunctionError` when the reward function misbehaves.
Task and reward objects run in this process: no torchrun ranks or Ray workers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from feedbackrl.config import ConfigError, RunConfig, apply_overrides, build_config, read_recipe
from feedbackrl.envs.base import Task
from feedbackrl.envs.registry import TASK_MEMBERS
from feedbackrl.rewards.python_fn import PythonReward, python_reward


def train(recipe: str | Path | Mapping[str, Any] | RunConfig | None = None, *, out: str | Path = "runs/train",
          reward: Callable[..., Any] | Mapping[str, Any] | None = None, task: Task | None = None,
          overrides: Sequence[str] | Mapping[str, Any] = (), resume: str | Path | None = None) -> dict[str, Any]:
    """Run a recipe into `out` and return its report (see the module docstring)."""
    from feedbackrl.train.run import run  # torch and transformers: imported when a run starts

    data, source = _recipe_data(recipe)
    data = _apply_mapping(data, overrides) if isinstance(overrides, Mapping) else apply_overrides(data, list(overrides))
    if task is not None:
        _check_task(task)
        data["task"] = {**data.get("task", {}), "name": str(task.name), "options": {}}
    cfg = build_config(data, source)
    fn = _reward(reward, cfg) if reward is not None else None
    return run(cfg, out, resume=resume, task=task, reward=fn)


def _recipe_data(recipe: str | Path | Mapping[str, Any] | RunConfig | None) -> tuple[dict[str, Any], str]:
    if isinstance(recipe, RunConfig):
        return recipe.model_dump(exclude_unset=True), "RunConfig"
    if isinstance(recipe, Mapping):
        return copy.deepcopy(dict(recipe)), "recipe dict"
    if recipe is None or isinstance(recipe, str | Path):
        return read_recipe(recipe)
    raise ConfigError(f"recipe: expected a TOML path, a dict or a RunConfig, got {type(recipe).__name__}")


def _apply_mapping(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        node = data
        *parents, last = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"overrides[{key!r}]: {k!r} is a value, not a section")
        node[last] = value
    return data


def _check_task(task: Any) -> None:
    if isinstance(task, type):
        raise ConfigError(f"task: got the class {task.__name__}, expected a task object: pass {task.__name__}(...), "
                          "or name the class in the recipe (task.name = 'package.module:Class')")
    missing = [m for m in TASK_MEMBERS if not hasattr(task, m)]
    if missing:
        raise ConfigError(f"task: a {type(task).__name__} without {missing}; subclass feedbackrl.envs.base.Task, "
                          "which gives the defaults of every part but name, sample(rng), heldout(n) and "
                          "verify(problem, completion)")


def _reward(reward: Callable[..., Any] | Mapping[str, Any], cfg: RunConfig) -> PythonReward:
    if cfg.reward.source or cfg.reward.model:
        raise ConfigError(f"reward: given as an argument and in the recipe's [reward] section (source = "
                          f"{cfg.reward.source or 'learned'!r}); give one of them")
    options = dict(reward) if isinstance(reward, Mapping) else {"function": reward}
    fn = options.pop("function", None)
    if fn is None:
        raise ConfigError(f"reward: a dict of options needs 'function', the function itself; got {sorted(options)}")
    label = getattr(fn, "__qualname__", type(fn).__name__)
    allowed = {"signature", "score_range", "pass_at", "trl_format"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"reward: unknown option(s) {unknown}; the options are function, "
                          f"{', '.join(sorted(allowed))}")
    return python_reward(fn, f"{label!r} (the reward argument)", **options)
