"""Every reward source by name, and a recipe's `[reward]` section built into one batch reward.

`REWARDS` maps a source name to a `Source`: a factory `build(ctx, **options) -> BatchReward` and a
one-line summary. A recipe names a source and sets its options beside it; composites (`gate`,
`weighted_sum`, `value_weighted`) hold other sources, so they nest:

    [reward]
    source = "gate"
    gate = { source = "regex", pattern = '.*\\\\boxed\\{.+\\}.*' }
    [reward.reward]
    source = "weighted_sum"
    parts.math = { source = "math", weight = 2 }
    parts.short = { source = "length_words", relation = "at most", num = 40 }

Options are checked when the recipe is validated (`check_reward`, called by `RewardConfig`):
unknown source names, unknown or missing options and wrong types are a `ConfigError` naming the
field path and what is allowed, before any model is loaded. `build_reward` then builds the sources
(loading reward models, probing the code sandbox); errors there name the path too.

Every source is scored a batch at a time (`BatchReward`): the code sandbox runs tests in parallel and
a learned reward model scores many completions per forward pass. A source may also have `pop_metrics()`
(the judges: `judge/calls`, `judge/cache_hits`, ...), which the training loop logs once per step when it is the recipe's
[reward] source itself (not a composite's part). Per-completion sources (math,
format, instruction checks) are applied one by one. Composites use `combine.py` on each completion,
so a composed verdict keeps every part's evidence under `details["parts"]`; a gate runs its reward
only on the completions that passed it.

Adding a source is one entry in `REWARDS`: its factory's keyword-only parameters (with type
hints) are the options a recipe may set, validated by pydantic.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, ValidationError, create_model

from feedbackrl import plugins
from feedbackrl.config import ConfigError
from feedbackrl.rewards import instructions
from feedbackrl.rewards.combine import Gate, ValueWeighted, WeightedSum
from feedbackrl.rewards.format import RegexFormat, TagFormat
from feedbackrl.rewards.judge import check_judge_logprob, judge_logprob_source, judge_source
from feedbackrl.rewards.python_fn import Signature, TRLFormat, python_reward
from feedbackrl.rewards.verdict import Problem, RewardSource, Verdict

if TYPE_CHECKING:
    from feedbackrl.config import RewardConfig

BatchReward = Callable[[Sequence[Problem], Sequence[str]], list[Verdict]]
Node = Mapping[str, Any]


@dataclass(frozen=True)
class Context:
    """What a factory gets besides its options: the task's verifier and where its node sits."""

    task_verifier: BatchReward
    path: str

    def build(self, node: Any, key: str) -> BatchReward:
        """Build a child node (a composite's part) found under `key`."""
        return _build_node(node, Context(self.task_verifier, f"{self.path}.{key}"))


@dataclass(frozen=True)
class Source:
    """A registry entry. `build(ctx, **options)`; its keyword-only parameters are the options."""

    build: Callable[..., BatchReward]
    summary: str
    check: Callable[..., None] | None = None  # check(path, **options): deeper checks without building


def each(source: RewardSource) -> BatchReward:
    """A per-completion reward source applied to every (problem, completion) of a batch."""
    return lambda problems, completions: [source(p, c) for p, c in zip(problems, completions, strict=True)]


def _fixed(verdict: Verdict) -> RewardSource:
    return lambda problem, completion: verdict


def _never(problem: Problem, completion: str) -> Verdict:
    raise AssertionError("a closed gate must not run its reward")


# --- leaves ---------------------------------------------------------------------------------------


def _task(ctx: Context) -> BatchReward:
    return ctx.task_verifier


def _math(ctx: Context, *, order: list[str] | None = None, timeout_s: float = 3.0,
          max_answer_chars: int = 500) -> BatchReward:
    from feedbackrl.rewards.math import DEFAULT_ORDER, MathVerifier

    return each(MathVerifier(tuple(order) if order else DEFAULT_ORDER, timeout_s, max_answer_chars))


def _code(ctx: Context, *, timeout_s: float = 2.0, memory_mb: int = 512, max_output_bytes: int = 1_000_000,
          allow_unsafe: bool = False, workers: int = 4, sandbox_checks: bool = False) -> BatchReward:
    from feedbackrl.rewards.code import CodeVerifier

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    verifier = CodeVerifier(timeout_s, memory_mb, max_output_bytes, allow_unsafe, sandbox_checks)
    return lambda problems, completions: verifier.batch(problems, completions, workers)


def _regex(ctx: Context, *, pattern: str, mode: Literal["fullmatch", "search"] = "fullmatch") -> BatchReward:
    return each(RegexFormat(pattern, mode))


def _check_regex(path: str, *, pattern: str, mode: str = "fullmatch") -> None:
    RegexFormat(pattern, mode)  # compiles the pattern


def _tags(ctx: Context, *, think_tag: str = "think", answer_tag: str = "answer", think_prefilled: bool = False,
          require_reasoning: bool = True) -> BatchReward:
    return each(TagFormat(think_tag, answer_tag, think_prefilled, require_reasoning))


def _learned(ctx: Context, *, path: str, batch_size: int = 256) -> BatchReward:
    from feedbackrl.rewards.learned import LearnedReward

    reward = LearnedReward.from_dir(path)
    reward.batch_size = batch_size
    if reward.model.kind != "reward":
        raise ValueError(f"{path!r} holds a {reward.model.kind} model; use source = 'cost' for it")
    return reward.batch


def _cost(ctx: Context, *, path: str, batch_size: int = 256) -> BatchReward:
    """A cost model turned into a reward: score = 1 - calibrated cost, passed = predicted safe."""
    from feedbackrl.rewards.learned import LearnedReward

    model = LearnedReward.from_dir(path)
    model.batch_size = batch_size
    if model.model.kind != "cost":
        raise ValueError(f"{path!r} holds a {model.model.kind} model; use source = 'learned' for it")

    def score(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        costs = model.batch(list(problems), list(completions))
        return [Verdict(1.0 - v.score, v.passed, f"1 - {v.reason}", {**v.details, "cost": v.score}) for v in costs]

    return score


def _secret_leak(ctx: Context, *, key: str = "secret") -> BatchReward:
    from feedbackrl.rewards.secret import SecretLeak

    return SecretLeak(key).batch


def _constraints(ctx: Context) -> BatchReward:
    return each(instructions.ConstraintsVerifier())


def _instruction(constraint_id: str, ctx: Context, **params: Any) -> BatchReward:
    return each(instructions.ConstraintsVerifier.from_specs([{"id": constraint_id, **params}]))


def _check_instruction(constraint_id: str, path: str, **params: Any) -> None:
    instructions.load_constraint({"id": constraint_id, **params}, where="source")


def _python(ctx: Context, *, function: str, signature: Signature = "completion",
            score_range: tuple[float, float] = (0.0, 1.0), pass_at: float | None = None,
            trl_format: TRLFormat = "standard") -> BatchReward:
    name = f"{function!r} ({ctx.path}.function)"
    return python_reward(plugins.load_object(function, f"{ctx.path}.function"), name, signature=signature,
                         score_range=score_range, pass_at=pass_at, trl_format=trl_format)


def _check_python(path: str, *, function: str, **options: Any) -> None:
    _python(Context(_never_batch, path), function=function, **options)  # imports and checks it; builds nothing else


def _plugin(fn: Callable[..., Any], entry: str, ctx: Context, *, signature: Signature = "completion",
            score_range: tuple[float, float] = (0.0, 1.0), pass_at: float | None = None,
            trl_format: TRLFormat = "standard") -> BatchReward:
    """A plain function an installed package registers (entry point group `feedbackrl.rewards`)."""
    return python_reward(fn, f"{entry!r} ({ctx.path}.source, an installed entry point)", signature=signature,
                         score_range=score_range, pass_at=pass_at, trl_format=trl_format)


def _never_batch(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
    raise AssertionError("a reward is checked, not run, while a recipe is validated")


# --- composites -----------------------------------------------------------------------------------


def _part_weights(parts: Mapping[str, Any], path: str) -> dict[str, float]:
    if not isinstance(parts, Mapping) or not parts:
        raise ValueError(f"{path}.parts: needs a table of named parts, got {parts!r}")
    weights = {}
    for name, node in parts.items():
        weight = node.get("weight", 1.0) if isinstance(node, Mapping) else 1.0
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"{path}.parts.{name}.weight: must be a number >= 0, got {weight!r}")
        weights[name] = float(weight)
    try:
        WeightedSum(dict.fromkeys(weights, _never), weights)  # its own weight checks
    except ValueError as e:
        raise ConfigError(f"{path}.parts: {e}") from None
    return weights


def _without_weight(node: Any) -> Any:
    return {k: v for k, v in node.items() if k != "weight"} if isinstance(node, Mapping) else node


def _weighted_sum(ctx: Context, *, parts: dict[str, Any]) -> BatchReward:
    weights = _part_weights(parts, ctx.path)
    built = {name: ctx.build(_without_weight(node), f"parts.{name}") for name, node in parts.items()}

    def score(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        verdicts = {name: part(problems, completions) for name, part in built.items()}
        return [WeightedSum({name: _fixed(vs[i]) for name, vs in verdicts.items()}, weights)(p, c)
                for i, (p, c) in enumerate(zip(problems, completions, strict=True))]

    return score


def _check_weighted_sum(path: str, *, parts: dict[str, Any]) -> None:
    _part_weights(parts, path)
    for name, node in parts.items():
        _check_node(_without_weight(node), f"{path}.parts.{name}")


def _gate(ctx: Context, *, gate: dict[str, Any], reward: dict[str, Any]) -> BatchReward:
    opener, inner = ctx.build(gate, "gate"), ctx.build(reward, "reward")

    def score(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        opened = opener(problems, completions)
        todo = [i for i, v in enumerate(opened) if v.passed]
        scored = dict(zip(todo, inner([problems[i] for i in todo], [completions[i] for i in todo]), strict=True))
        return [Gate(_fixed(g), _fixed(scored[i]) if i in scored else _never, "gate", "reward")(p, c)
                for i, (g, p, c) in enumerate(zip(opened, problems, completions, strict=True))]

    return score


def _check_gate(path: str, *, gate: dict[str, Any], reward: dict[str, Any]) -> None:
    _check_node(gate, f"{path}.gate")
    _check_node(reward, f"{path}.reward")


def _value_weighted(ctx: Context, *, reward: dict[str, Any], alpha: float = 1.0, value_key: str = "value",
                    total_key: str | None = None, default_value: float | None = None) -> BatchReward:
    inner = ctx.build(reward, "reward")
    ValueWeighted(_never, alpha, value_key, total_key, default_value)  # its own option checks, now

    def score(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        return [ValueWeighted(_fixed(v), alpha, value_key, total_key, default_value, "reward")(p, c)
                for v, p, c in zip(inner(problems, completions), problems, completions, strict=True)]

    return score


def _check_value_weighted(path: str, *, reward: dict[str, Any], **options: Any) -> None:
    _check_node(reward, f"{path}.reward")
    ValueWeighted(_never, **options)


# --- the registry ---------------------------------------------------------------------------------

REWARDS: dict[str, Source] = {
    "task": Source(_task, "the task's own verifier (exact, math, code, ... as the task defines)"),
    "math": Source(_math, "final answer extracted and compared with problem.answer (math-verify)"),
    "code": Source(_code, "the completion's program run against problem.answer's tests, sandboxed"),
    "regex": Source(_regex, "passes when a regular expression matches the completion", _check_regex),
    "tags": Source(_tags, "<think>...</think><answer>...</answer> and nothing else"),
    "learned": Source(_learned, "a reward model directory written by a reward_model run"),
    "cost": Source(_cost, "a cost model directory; score = 1 - calibrated cost, passes when predicted safe"),
    "judge": Source(judge_source, "an LLM judge on an OpenAI-compatible endpoint scoring a weighted rubric"),
    "judge_logprob": Source(judge_logprob_source, "a local model (dir, .gguf or 'smollm2') judging each completion "
                            "from its log-probs of Yes / No to a criterion; score P(Yes) / (P(Yes) + P(No)), "
                            "cached", check_judge_logprob),
    "python": Source(_python, "your own function: function = 'package.module:name' or 'file.py:name' (sync or "
                     "async; signature completion, batch or trl)", _check_python),
    "secret_leak": Source(_secret_leak, "a cost: 1 when problem.meta[key] (the task's secret) appears in the "
                          "completion, in any casing, split by separators, or reversed"),
    "constraints": Source(_constraints, "the problem's own constraint specs (meta['constraints'])"),
    **{cid: Source(functools.partial(_instruction, cid), f"instruction check: {inspect.getdoc(fn)}",
                   functools.partial(_check_instruction, cid))
       for cid, fn in instructions.CHECKERS.items()},
    "weighted_sum": Source(_weighted_sum, "sum of parts' scores by weight; passes when every part passes",
                           _check_weighted_sum),
    "gate": Source(_gate, "the reward counts only if the gate passes, else 0 (the reward is not run)", _check_gate),
    "value_weighted": Source(_value_weighted, "RLEV: the reward scaled by the prompt's human value",
                             _check_value_weighted),
}


def register_reward(name: str, source: Source) -> None:
    """Add a source (e.g. a judge) under `name`; recipes can name it at once."""
    REWARDS[name] = source


def installed_sources() -> dict[str, str]:
    """Reward sources installed packages declare (entry point group `feedbackrl.rewards`) that the registry
    does not already hold, by name -> the object they refer to (nothing is imported)."""
    return {name: ep.value for name, ep in plugins.entry_points(plugins.REWARD_GROUP).items() if name not in REWARDS}


def load_installed(name: str, path: str = "reward") -> Source:
    """Load entry point `name` of group `feedbackrl.rewards` into the registry: a `Source` as it is, a plain
    function as a python source (options signature, score_range, pass_at, trl_format)."""
    obj = plugins.load_entry_point(plugins.REWARD_GROUP, name, f"{path}.source")
    if isinstance(obj, Source):
        source = obj
    elif callable(obj):
        doc = (inspect.getdoc(obj) or "").split("\n")[0]
        source = Source(functools.partial(_plugin, obj, plugins.entry_points(plugins.REWARD_GROUP)[name].value),
                        f"installed function: {doc or name}")
    else:
        raise ConfigError(f"{path}.source = {name!r}: its entry point refers to a {type(obj).__name__}, not a "
                          "reward function or a feedbackrl.rewards.registry.Source")
    REWARDS[name] = source
    return source


# --- validation and building ----------------------------------------------------------------------


def _options_model(name: str) -> type | None:
    """A pydantic model of the source's options, from its factory's signature (None: **kwargs)."""
    build = REWARDS[name].build
    target = build.func if isinstance(build, functools.partial) else build
    params = list(inspect.signature(build).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    hints = typing.get_type_hints(target)
    fields = {p.name: (hints[p.name], ... if p.default is p.empty else p.default)
              for p in params if p.kind is p.KEYWORD_ONLY}
    return create_model(f"{name}_options", __config__=ConfigDict(extra="forbid", strict=False), **fields)


def _validate_options(name: str, options: dict[str, Any], path: str) -> None:
    model = _options_model(name)
    if model is None:
        return
    try:
        model.model_validate(options)
    except ValidationError as err:
        e = err.errors()[0]
        key = ".".join(str(k) for k in e["loc"])
        allowed = ", ".join(model.model_fields) or "none"
        if e["type"] == "extra_forbidden":
            raise ConfigError(f"{path}.{key}: unknown option for source {name!r}; its options: {allowed}") from None
        raise ConfigError(f"{path}.{key}: {e['msg']} (got {e.get('input')!r}); source {name!r} options: "
                          f"{allowed}") from None


def _split(node: Any, path: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, Mapping):
        raise ConfigError(f"{path}: expected a table with a 'source' key, got {node!r}")
    if "source" not in node:
        raise ConfigError(f"{path}.source: missing; known sources: {sorted(REWARDS)}")
    name = node["source"]
    if name not in REWARDS and isinstance(name, str) and name in installed_sources():
        load_installed(name, path)
    if name not in REWARDS:
        hint = ("; for your own function use source = 'python' with function = " + repr(name)
                if isinstance(name, str) and plugins.is_reference(name) else "")
        raise ConfigError(f"{path}.source: unknown reward source {name!r}; known sources: {sorted(REWARDS)}{hint}")
    return name, {k: v for k, v in node.items() if k != "source"}


def _check_node(node: Any, path: str) -> None:
    name, options = _split(node, path)
    _validate_options(name, options, path)
    check = REWARDS[name].check
    if check is not None:
        try:
            check(path, **options)
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path}: {e}") from None


def _build_node(node: Any, ctx: Context) -> BatchReward:
    name, options = _split(node, ctx.path)
    _validate_options(name, options, ctx.path)
    try:
        return REWARDS[name].build(ctx, **options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # ModelLoadError is a ValueError: a bad reward model dir
        raise ConfigError(f"{ctx.path} (source {name!r}): {e}") from None


def _root(cfg: RewardConfig, section: str = "reward") -> dict[str, Any] | None:
    """The section as one node: None for the task's verifier, `model` as its learned-reward node.
    `section`: the recipe's name for it in messages (`[cost]` names its sources the same way)."""
    options = dict(cfg.model_extra or {})
    if cfg.model and (cfg.source or options):
        raise ConfigError(f"{section}.model is the short form of source = 'learned', path = {cfg.model!r}; "
                          f"set either {section}.model or {section}.source, not both (got source={cfg.source!r}, "
                          f"options {sorted(options)})")
    if cfg.model:
        return None
    if not cfg.source:
        if options:
            raise ConfigError(f"{section}.{min(options)}: unknown key (keys: model, source); a source's options "
                              f"go beside {section}.source, one of {sorted(REWARDS)}")
        return None
    return {"source": cfg.source, **options}


def check_reward(cfg: RewardConfig, section: str = "reward") -> None:
    """Validate the section without building anything; raises ConfigError naming the field path."""
    root = _root(cfg, section)
    if root is not None:
        _check_node(root, section)


def build_reward(cfg: RewardConfig, task_verifier: BatchReward, section: str = "reward") -> BatchReward:
    """The reward a recipe's `[reward]` (or `[cost]`) section describes; `task_verifier` itself when it names
    none."""
    if cfg.model:
        _root(cfg, section)
        from feedbackrl.rewards.learned import LearnedReward

        return LearnedReward.from_dir(cfg.model).batch  # the short form, unchanged: any kind of model
    root = _root(cfg, section)
    return task_verifier if root is None else _build_node(root, Context(task_verifier, section))


def part_metrics(verdicts: Sequence[Verdict], prefix: str = "reward") -> dict[str, float]:
    """`reward/<part>/mean` and `reward/<part>/pass_rate` (`prefix` for another signal: `cost/...`) of a
    composite's top-level parts, over the completions each part judged (a closed gate's reward judged none)."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for v in verdicts:
        for name, part in v.details.get("parts", {}).items():
            seen.setdefault(name, []).append(part)
    out = {}
    for name, parts in seen.items():
        out[f"{prefix}/{name}/mean"] = sum(p["score"] for p in parts) / len(parts)
        out[f"{prefix}/{name}/pass_rate"] = sum(p["passed"] for p in parts) / len(parts)
    return out
