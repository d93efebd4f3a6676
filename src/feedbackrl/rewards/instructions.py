"""Instruction-following rewards: a response must satisfy a list of verifiable constraints.

A constraint spec is JSON such as `{"id": "length_words", "relation": "at least", "num": 100}`.
`CHECKERS` maps each id to a checker in `instructions_checks.py`; the checker's keyword-only
parameters (names, types, defaults) are the spec's parameters. Specs are validated when loaded,
so a typo in an id or a parameter is an error naming what is allowed, never a silent pass.

The score is the fraction of constraints satisfied (IFEval's "loose" per-instruction accuracy
is the analogous metric; `passed` is its strict per-prompt accuracy).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.rewards import instructions_checks as checks
from feedbackrl.rewards.verdict import Problem, Verdict, fail

CHECKERS: dict[str, Callable[..., checks.Result]] = {
    "length_words": checks.length_words,
    "length_sentences": checks.length_sentences,
    "length_paragraphs": checks.length_paragraphs,
    "length_chars": checks.length_chars,
    "paragraphs_divided": checks.paragraphs_divided,
    "sentence_max_words": checks.sentence_max_words,
    "keyword_frequency": checks.keyword_frequency,
    "include_keywords": checks.include_keywords,
    "forbidden_words": checks.forbidden_words,
    "letter_frequency": checks.letter_frequency,
    "capital_word_frequency": checks.capital_word_frequency,
    "no_commas": checks.no_commas,
    "no_digits": checks.no_digits,
    "all_lowercase": checks.all_lowercase,
    "all_uppercase": checks.all_uppercase,
    "json_format": checks.json_format,
    "bullet_count": checks.bullet_count,
    "section_count": checks.section_count,
    "title": checks.title,
    "placeholders": checks.placeholders,
    "highlighted_sections": checks.highlighted_sections,
    "postscript": checks.postscript,
    "quotation_wrap": checks.quotation_wrap,
    "two_responses": checks.two_responses,
    "nth_paragraph_first_word": checks.nth_paragraph_first_word,
    "starts_with": checks.starts_with,
    "ends_with": checks.ends_with,
    "repeat_prompt": checks.repeat_prompt,
    "choose_from": checks.choose_from,
}

# Value rules for parameters that share a name across checkers: (test, what is allowed).
_VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "relation": (lambda v: v in checks.RELATIONS, f"one of {list(checks.RELATIONS)}"),
    "letter": (lambda v: len(v) == 1 and v.isalpha(), "a single letter"),
    "nth": (lambda v: v >= 1, "an integer >= 1"),
}


class ConstraintError(ValueError):
    """A constraint spec that cannot be checked; the message names the spec, the id or parameter and what is
    allowed."""


@dataclass(frozen=True)
class Param:
    """One parameter a checker takes: its type, and its default if it is optional."""

    name: str
    type: type
    required: bool
    default: Any = None

    def describe(self) -> str:
        kind = str(self.type) if typing.get_origin(self.type) else self.type.__name__
        return f"{self.name}: {kind}" + ("" if self.required else f" = {self.default!r}")


def checker_params(constraint_id: str) -> list[Param]:
    """The parameters of a checker, read from its signature so the two can never disagree."""
    func = CHECKERS[constraint_id]
    hints = typing.get_type_hints(func)
    return [Param(p.name, hints[p.name], p.default is inspect.Parameter.empty,
                  None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(func).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def _type_ok(value: Any, expected: type) -> bool:
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if expected is str:
        return isinstance(value, str) and bool(value.strip())
    if typing.get_origin(expected) is list:
        return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)
    return isinstance(value, expected)


_TYPE_NAMES: dict[Any, str] = {int: "an integer >= 0", str: "a non-empty string"}


def _check_value(where: str, param: Param, value: Any) -> None:
    if not _type_ok(value, param.type):
        wanted = _TYPE_NAMES.get(param.type, "a non-empty list of strings")
        raise ConstraintError(f"{where}: param {param.name!r} must be {wanted}, got {value!r}")
    rule = _VALUE_RULES.get(param.name)
    if rule is not None and not rule[0](value):
        raise ConstraintError(f"{where}: param {param.name!r} must be {rule[1]}, got {value!r}")


@dataclass(frozen=True)
class Constraint:
    """A validated constraint: a checker id and the full set of its parameters."""

    id: str
    params: dict[str, Any] = field(default_factory=dict)

    def check(self, response: str) -> checks.Result:
        return CHECKERS[self.id](response, **self.params)

    def to_spec(self) -> dict[str, Any]:
        return {"id": self.id, **self.params}


def load_constraint(spec: Mapping[str, Any], where: str = "constraint") -> Constraint:
    """Validate one spec dict. Raises ConstraintError naming the id or parameter and what is allowed."""
    if not isinstance(spec, Mapping) or "id" not in spec:
        raise ConstraintError(f"{where}: expected an object with an 'id' key, got {spec!r}")
    constraint_id = spec["id"]
    if not isinstance(constraint_id, str) or constraint_id not in CHECKERS:
        raise ConstraintError(f"{where}: unknown constraint id {constraint_id!r}; allowed: {sorted(CHECKERS)}")
    where = f"{where} {constraint_id!r}"
    params = {p.name: p for p in checker_params(constraint_id)}
    allowed = ", ".join(p.describe() for p in params.values()) or "none"
    given = {k: v for k, v in spec.items() if k != "id"}
    unknown = sorted(set(given) - set(params))
    missing = [name for name, p in params.items() if p.required and name not in given]
    if unknown or missing:
        problem = f"unknown params {unknown}" if unknown else f"missing params {missing}"
        raise ConstraintError(f"{where}: {problem}; params: {allowed}")
    for name, value in given.items():
        _check_value(where, params[name], value)
    return Constraint(constraint_id, {**{n: p.default for n, p in params.items() if not p.required}, **given})


def load_constraints(specs: Iterable[Mapping[str, Any]]) -> list[Constraint]:
    """Validate a list of specs; the error names the index of the bad one."""
    if isinstance(specs, str | bytes | Mapping) or not isinstance(specs, Iterable):
        raise ConstraintError(f"constraints must be a list of spec objects, got {type(specs).__name__}")
    constraints = [load_constraint(spec, where=f"constraint #{i}") for i, spec in enumerate(specs)]
    if not constraints:
        raise ConstraintError("constraints list is empty: a prompt needs at least one constraint to score")
    return constraints


def _specs_of(problem: Problem) -> Any:
    """Per-problem specs live in meta["constraints"] if present, else in problem.answer."""
    return problem.meta.get("constraints", problem.answer)


@dataclass(frozen=True)
class ConstraintsVerifier:
    """Scores the fraction of constraints a response satisfies; passes when it satisfies all.

    constraints: a fixed list for every problem; when None, each problem carries its own specs
    (meta["constraints"] or answer) and bad specs raise ConstraintError: that is a task bug, not
    the completion's fault. Validate them at dataset load with `load_constraints`.
    """

    constraints: tuple[Constraint, ...] | None = None

    @classmethod
    def from_specs(cls, specs: Iterable[Mapping[str, Any]]) -> ConstraintsVerifier:
        """A verifier applying the same validated specs to every problem."""
        return cls(tuple(load_constraints(specs)))

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        constraints = self.constraints or tuple(load_constraints(_specs_of(problem)))
        if not isinstance(completion, str):
            return fail(f"completion is {type(completion).__name__}, not str")
        results = [_run(c, completion) for c in constraints]
        satisfied = sum(r["passed"] for r in results)
        failed = [r["id"] for r in results if not r["passed"]]
        reason = f"{satisfied}/{len(results)} constraints satisfied"
        reason += f"; failed: {failed}" if failed else ""
        return Verdict(satisfied / len(results), not failed, reason,
                       {"constraints": results, "satisfied": satisfied, "total": len(results)})


def _run(constraint: Constraint, response: str) -> dict[str, Any]:
    try:
        passed, why = constraint.check(response)
    except Exception as e:  # noqa: BLE001 - a checker bug must not crash training; it shows in details
        passed, why = False, f"checker error {type(e).__name__}: {e}"
    return {"id": constraint.id, "params": dict(constraint.params), "passed": bool(passed), "why": why}
