"""Reward functions from the user's own code: `[reward] source = "python"`.

    [reward]
    source = "python"
    function = "my_rewards:score"      # or "rewards/mine.py:score" (relative to the current directory)
    signature = "completion"           # how it is called: "completion" (the default), "batch" or "trl"

`signature` says how the function is called; it is never guessed from the function's parameters:

- ``completion``: ``fn(problem, completion) -> float | Verdict``, once per completion. `problem` is a
  `Problem` (`prompt`, `answer`, `meta`), `completion` the policy's text.
- ``batch``: ``fn(problems, completions) -> list[float | Verdict]``, once per batch (both lists).
- ``trl``: TRL's reward-function signature, ``fn(completions=[...], prompts=[...], **columns) -> list[float]``,
  so a function written for TRL's ``reward_funcs`` carries over as is. The columns are keyword lists, one
  value per completion: ``answer`` (`problem.answer`) and every key of `problem.meta` the whole batch has (a
  dataset task's `meta_fields`: list ``solution`` there for a function that takes ``solution``). `prompts`
  are the prompts as the task wrote them (before any chat template). With ``trl_format = "conversational"``
  completions are ``[{"role": "assistant", "content": text}]`` and prompts lists of messages, as TRL passes
  them for a conversational dataset (TRL's own `trl.rewards` functions read ``completion[0]["content"]``).
  TRL's other keywords (``completion_ids``, ``trainer_state``) are not passed.

Any of the three may be async (a coroutine function, or any function whose result is awaitable): its
result is awaited on one event loop per process, kept between batches (so an async client the function
keeps stays usable); per-completion coroutines of one batch run concurrently.

Scores: a Verdict is taken as it is. A number (int, float, bool; NaN and infinities are errors) must lie in
`score_range` (default ``[0, 1]``) and is mapped linearly onto the Verdict's [0, 1]: ``(x - lo) / (hi - lo)``;
it passes when ``x >= pass_at`` (default: ``hi``). A number outside the range is an error, never clipped:
a TRL function that returns -1 for a malformed answer and 2 for a perfect one needs ``score_range = [-1, 2]``.
GRPO's group-normalised advantages do not change under this map (shift and scale cancel); RLOO without
`scale_advantages` and PPO see the reward scaled by ``1 / (hi - lo)``.

A function that raises, returns a list of the wrong length, None, NaN or anything that is not a number or a
Verdict stops the run with a `RewardFunctionError` that names the function, the completion and, when it
raised, its traceback: never a silent 0 that the policy would learn from.

The function runs in the training process with its rights: it is the user's code, as trusted as the recipe.
What it receives (completions) is the policy's output, which RL pressure makes adversarial: treat it as
untrusted data (never `eval` it; run code from it in `rewards/sandbox.py`, as the `code` source does).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from feedbackrl.config import ConfigError
from feedbackrl.rewards.verdict import Problem, Verdict

Signature = Literal["completion", "batch", "trl"]
TRLFormat = Literal["standard", "conversational"]
_TRL_RESERVED = ("completions", "prompts")


class RewardFunctionError(Exception):
    """A user's reward function raised, or returned something that is not a score (names it and the completion).

    Not a ValueError: nothing on the scoring path may mistake it for a malformed completion worth 0."""


@dataclass(frozen=True)
class PythonReward:
    """A user's function as a batch reward: `(problems, completions) -> list[Verdict]` (see the module doc)."""

    fn: Callable[..., Any]
    name: str  # how errors name it, e.g. "'my_rewards:score' (reward.function)"
    signature: Signature = "completion"
    score_range: tuple[float, float] = (0.0, 1.0)
    pass_at: float | None = None
    trl_format: TRLFormat = "standard"

    def __post_init__(self) -> None:
        lo, hi = self.score_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ConfigError(f"reward function {self.name}: score_range must be [lo, hi] with finite lo < hi, "
                              f"got {[lo, hi]}")
        if self.pass_at is not None and not lo <= self.pass_at <= hi:
            raise ConfigError(f"reward function {self.name}: pass_at = {self.pass_at} lies outside score_range "
                              f"{[lo, hi]}")
        if self.trl_format != "standard" and self.signature != "trl":
            raise ConfigError(f"reward function {self.name}: trl_format = {self.trl_format!r} applies to "
                              f"signature = 'trl' only (got signature = {self.signature!r})")

    def __call__(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        problems, completions = list(problems), list(completions)
        if not problems:
            return []
        if self.signature == "completion":
            values = [self._call(i, completions[i], problems[i], completions[i]) for i in range(len(problems))]
            pending = {i: v for i, v in enumerate(values) if inspect.isawaitable(v)}
            if pending:
                done = run_awaitable(self._gather(pending, completions))
                values = [done.get(i, v) for i, v in enumerate(values)]
        else:
            args, kwargs = ((problems, completions), {}) if self.signature == "batch" else \
                ((), self._trl_arguments(problems, completions))
            values = self._call(None, None, *args, **kwargs)
            if inspect.isawaitable(values):
                values = run_awaitable(self._awaited(values, None, None))
            values = self._as_list(values, len(problems))
        return [self._verdict(i, completions[i], v) for i, v in enumerate(values)]

    # --- calling --------------------------------------------------------------------------------------

    def _call(self, i: int | None, completion: str | None, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except Exception as e:
            raise self._raised(e, i, completion) from e

    async def _awaited(self, value: Awaitable[Any], i: int | None, completion: str | None) -> Any:
        try:
            return await value
        except Exception as e:
            raise self._raised(e, i, completion) from e

    async def _gather(self, pending: dict[int, Awaitable[Any]], completions: list[str]) -> dict[int, Any]:
        results = await asyncio.gather(*(self._awaited(v, i, completions[i]) for i, v in pending.items()))
        return dict(zip(pending, results, strict=True))

    def _trl_arguments(self, problems: list[Problem], completions: list[str]) -> dict[str, Any]:
        raw = [p.meta.get("raw_prompt", p.prompt) for p in problems]
        if self.trl_format == "conversational":
            prompts: list[Any] = [list(p.meta["messages"]) if "messages" in p.meta else
                                  [{"role": "user", "content": r}] for p, r in zip(problems, raw, strict=True)]
            outs: list[Any] = [[{"role": "assistant", "content": c}] for c in completions]
        else:
            prompts, outs = raw, completions
        shared = set.intersection(*(set(p.meta) for p in problems)) - {"raw_prompt", *_TRL_RESERVED}
        columns = {key: [p.meta[key] for p in problems] for key in sorted(shared)}
        return {"completions": outs, "prompts": prompts, "answer": [p.answer for p in problems], **columns}

    # --- checking what came back ----------------------------------------------------------------------

    def _as_list(self, values: Any, n: int) -> list[Any]:
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise RewardFunctionError(f"reward function {self.name} (signature = {self.signature!r}) must return "
                                      f"a list of {n} scores, one per completion; it returned {_show(values)}")
        if len(values) != n:
            raise RewardFunctionError(f"reward function {self.name} (signature = {self.signature!r}) returned "
                                      f"{len(values)} score(s) for a batch of {n} completions; it must return one "
                                      "per completion")
        return list(values)

    def _verdict(self, i: int, completion: str, value: Any) -> Verdict:
        if isinstance(value, Verdict):
            return value
        lo, hi = self.score_range
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, numbers.Real):
            raise self._bad(i, completion, f"returned {_show(value)}, not a number or a Verdict")
        x = float(value)
        if not math.isfinite(x):
            raise self._bad(i, completion, f"returned {x}, not a finite number")
        if not lo <= x <= hi:
            raise self._bad(i, completion, f"returned {x:g}, outside score_range [{lo:g}, {hi:g}]; set score_range "
                                           "to the range the function returns (it is mapped linearly onto [0, 1])")
        score = min(1.0, max(0.0, (x - lo) / (hi - lo)))
        passed = x >= (hi if self.pass_at is None else self.pass_at)
        return Verdict(score, passed, f"reward function returned {x:g}", {"raw": x})

    def _raised(self, e: Exception, i: int | None, completion: str | None) -> RewardFunctionError:
        where = "on the batch" if i is None else f"on completion {i} ({completion[:80]!r})"
        trace = "".join(traceback.format_exception(e)).rstrip()
        return RewardFunctionError(f"reward function {self.name} raised {where}: {type(e).__name__}: {e}\n{trace}")

    def _bad(self, i: int, completion: str, what: str) -> RewardFunctionError:
        return RewardFunctionError(f"reward function {self.name} {what} (completion {i}: {completion[:80]!r})")


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.80}"


# --- one event loop for every async reward function of the process ------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """The result of `awaitable`, run on a long-lived event loop in a daemon thread (so it works whether or not
    the caller is itself inside a running loop, and async clients bound to the loop stay usable)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="feedbackrl-reward-loop", daemon=True).start()

    async def wait() -> Any:
        return await awaitable

    return asyncio.run_coroutine_threadsafe(wait(), _loop).result()


# --- the registry's view --------------------------------------------------------------------------------


def check_callable(fn: Any, name: str, signature: str) -> None:
    """A ConfigError when `fn` is not callable or cannot take the arguments `signature` calls it with."""
    if not callable(fn):
        raise ConfigError(f"reward function {name}: names a {type(fn).__name__}, not a function")
    try:
        params = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the first call tells
    if signature in ("completion", "batch"):
        try:
            params.bind(None, None)
        except TypeError as e:
            shown = "fn(problem, completion)" if signature == "completion" else "fn(problems, completions)"
            raise ConfigError(f"reward function {name}: signature = {signature!r} calls it as {shown}, but its "
                              f"parameters are {params} ({e}); set signature to how it is meant to be called") from None
    elif not any(p.kind is p.VAR_KEYWORD for p in params.parameters.values()) and \
            "completions" not in params.parameters:
        raise ConfigError(f"reward function {name}: signature = 'trl' calls it as fn(completions=..., prompts=..., "
                          f"**columns), but its parameters are {params}")


def python_reward(fn: Callable[..., Any], name: str, *, signature: Signature = "completion",
                  score_range: tuple[float, float] = (0.0, 1.0), pass_at: float | None = None,
                  trl_format: TRLFormat = "standard") -> PythonReward:
    """`fn` checked and wrapped as a batch reward (see the module docstring for the options)."""
    check_callable(fn, name, signature)
    return PythonReward(fn, name, signature, (float(score_range[0]), float(score_range[1])), pass_at, trl_format)
