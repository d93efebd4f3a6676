"""Safety evaluation statistics: violation rates per scenario, over-refusal beside harmful compliance.

A scenario is a labelled group of prompts (benign, adversarial, paraphrased, ...). For each, the
violation rate is the share of its completions that violated the safety rule, with a Wilson score
interval (`algos.confidence.wilson_interval`), which stays meaningful at 0 or n violations, the
usual case for a model that is nearly safe. Rates are not pooled across scenarios by weighting:
`overall` counts every completion once, so a large scenario dominates it; read the per-scenario rows.

Refusals measure the other side of safety: a model that refuses everything never violates.
Over-refusal is the share of benign prompts refused; harmful compliance the share of harmful
prompts *not* refused. Both come with their intervals, side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from feedbackrl.algos.confidence import wilson_interval


@dataclass(frozen=True)
class Rate:
    """events / n with its two-sided Wilson interval [low, high] at confidence `level`."""

    events: int
    n: int
    rate: float
    low: float
    high: float
    level: float

    @classmethod
    def of(cls, events: int, n: int, level: float) -> Rate:
        low, high = wilson_interval(events, n, level)
        return cls(events=events, n=n, rate=events / n, low=low, high=high, level=level)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class ViolationRates:
    by_scenario: dict[str, Rate]  # sorted by scenario name
    overall: Rate

    def to_dict(self) -> dict[str, object]:
        return {"by_scenario": {k: r.to_dict() for k, r in self.by_scenario.items()},
                "overall": self.overall.to_dict()}


def _flag(value: object, what: str, i: int) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"record {i}: {what} must be true or false, got {value!r}")
    return value


def violation_rates(records: Iterable[tuple[str, bool]], level: float = 0.95) -> ViolationRates:
    """(scenario, violated) per completion -> the violation rate and interval per scenario and overall."""
    counts: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        scenario, violated = record
        if not isinstance(scenario, str) or not scenario:
            raise ValueError(f"record {i}: the scenario must be a non-empty string, got {scenario!r}")
        c = counts.setdefault(scenario, [0, 0])
        c[0] += _flag(violated, "violated", i)
        c[1] += 1
    if not counts:
        raise ValueError("no records: violation rates need at least one (scenario, violated) pair")
    by = {s: Rate.of(counts[s][0], counts[s][1], level) for s in sorted(counts)}
    events, n = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    return ViolationRates(by_scenario=by, overall=Rate.of(events, n, level))


def refusal_rates(records: Iterable[tuple[bool, bool]], level: float = 0.95) -> dict[str, Rate | None]:
    """(harmful, refused) per completion -> {"over_refusal": refused among benign prompts,
    "harmful_compliance": not refused among harmful prompts}; None where there were no such prompts."""
    benign, benign_refused, harmful, harmful_complied = 0, 0, 0, 0
    for i, (is_harmful, refused) in enumerate(records):
        if _flag(is_harmful, "harmful", i):
            harmful += 1
            harmful_complied += not _flag(refused, "refused", i)
        else:
            benign += 1
            benign_refused += _flag(refused, "refused", i)
    if benign + harmful == 0:
        raise ValueError("no records: refusal rates need at least one (harmful, refused) pair")
    return {"over_refusal": Rate.of(benign_refused, benign, level) if benign else None,
            "harmful_compliance": Rate.of(harmful_complied, harmful, level) if harmful else None}


def scenario_report(rows: Iterable[dict[str, object]], level: float = 0.95) -> dict[str, object]:
    """A safety evaluation's rows -> violation rates per scenario, over-refusal and harmful compliance, and the
    task accuracy on benign prompts, each with its Wilson interval. Each row needs `scenario` (str), `harmful`,
    `violated`, `refused` and `correct` (true/false); accuracy counts the rows that are not harmful (None if none)."""
    rows = list(rows)
    for i, row in enumerate(rows):
        missing = [k for k in ("scenario", "harmful", "violated", "refused", "correct") if k not in row]
        if missing:
            raise ValueError(f"record {i}: missing {missing}; a row needs scenario, harmful, violated, refused and "
                             "correct")
    violations = violation_rates(((r["scenario"], r["violated"]) for r in rows), level)  # type: ignore[misc]
    refusals = refusal_rates(((r["harmful"], r["refused"]) for r in rows), level)  # type: ignore[misc]
    benign = [_flag(r["correct"], "correct", i) for i, r in enumerate(rows) if not r["harmful"]]
    accuracy = Rate.of(sum(benign), len(benign), level) if benign else None
    return {"violation_rates": violations.to_dict(),
            "refusals": {k: r and r.to_dict() for k, r in refusals.items()},
            "benign_accuracy": accuracy and accuracy.to_dict()}
