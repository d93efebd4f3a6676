"""The detector protocol, alerts, and the window arithmetic detectors share.

A detector works in two halves, so a live run and a replay of its logs give the same alerts:

- `measure(record)`: statistics of one step's completions (a length-reward correlation, the
  fraction of completions that address the judge). The monitor adds them to the step's metrics
  under `monitor/...`, so they land in `metrics.jsonl`.
- `check(rows)`: a threshold over the metric rows so far (one dict per step, oldest first),
  returning a `Finding` (statistic, threshold, message) or None.

Windows are counted in rows that carry the statistic: a detector compares the mean of the first
`window` values (the baseline, what the run looked like before training moved it) with the mean
of the last `window` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from feedbackrl.monitors.record import StepRecord

Kind = Literal["hacking", "health"]


@dataclass(frozen=True)
class Finding:
    """What `check` saw: the statistic, the threshold it crossed, and a sentence for people."""

    statistic: float
    threshold: float
    message: str


@dataclass(frozen=True)
class Alert:
    """A detector fired at `step`; `action` is what the recipe chose (log, stop, rollback, raise_kl)."""

    detector: str
    kind: Kind
    step: int
    statistic: float
    threshold: float
    message: str
    action: str = "log"
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Detector:
    """Defaults for the optional halves; subclasses set `name`, `kind` and override `check`."""

    name: str = ""
    kind: Kind = "hacking"

    def measure(self, record: StepRecord) -> dict[str, float]:
        """Statistics of one step's completions, keys under `monitor/`; none by default."""
        return {}

    def check(self, rows: Sequence[dict[str, Any]]) -> Finding | None:
        raise NotImplementedError

    def examples(self, record: StepRecord, k: int) -> list[str]:
        """The completions that show the problem best; by default the k highest-reward ones."""
        order = sorted(range(len(record)), key=lambda i: -record.rewards[i])
        return [record.texts[i] for i in order[:k]]


def series(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    """The values of `key` in the rows that have it (a number, not None), oldest first."""
    return [float(r[key]) for r in rows if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def base_and_recent(values: Sequence[float], window: int) -> tuple[float, float] | None:
    """(mean of the first `window` values, mean of the last `window`); None until 2 * window values exist."""
    if len(values) < 2 * window:
        return None
    return mean(values[:window]), mean(values[-window:])


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation of two equal-length sequences; 0 when either is constant or has < 2 points."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = mean(xs), mean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return 0.0 if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5
