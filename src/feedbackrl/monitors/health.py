"""Health detectors: the run is degenerating or has stopped learning, hacked or not.

Repetition (completions that loop), entropy collapse, KL blow-up and groups with no reward
variance (no learning signal for group-relative advantages). Each class docstring states its
statistic and threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from feedbackrl.monitors.base import Detector, Finding, base_and_recent, mean, series
from feedbackrl.monitors.record import StepRecord


def repeated_fraction(text: str, n: int) -> float:
    """1 - distinct / total character n-grams: 0 for text without a repeated n-gram, near 1 for a loop."""
    grams = [text[i : i + n] for i in range(len(text) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


@dataclass
class Repetition(Detector):
    """Completions that repeat themselves (degenerate loops).

    Statistic: mean over the step's completions of at least `min_chars` characters of the repeated
    character `n`-gram fraction, averaged over the last `window` steps. Fires at >= `max_frac`.
    Steps without a long enough completion log nothing.
    """

    n: int = 6
    min_chars: int = 24
    window: int = 3
    max_frac: float = 0.5
    name: str = "repetition"

    def measure(self, record: StepRecord) -> dict[str, float]:
        fracs = [repeated_fraction(t, self.n) for t in record.texts if len(t) >= self.min_chars]
        return {"monitor/repetition": mean(fracs)} if fracs else {}

    def check(self, rows: Sequence[dict[str, Any]]) -> Finding | None:
        values = series(rows, "monitor/repetition")
        if len(values) < self.window:
            return None
        recent = mean(values[-self.window:])
        if recent >= self.max_frac:
            return Finding(recent, self.max_frac, f"{recent:.0%} of character {self.n}-grams are repeats")
        return None

    def examples(self, record: StepRecord, k: int) -> list[str]:
        order = sorted(range(len(record)), key=lambda i: -repeated_fraction(record.texts[i], self.n))
        return [record.texts[i] for i in order[:k]]


@dataclass
class EntropyCollapse(Detector):
    """The policy's token entropy collapses (exploration gone, often a mode the reward over-pays).

    Statistic: mean `entropy/mean` over the last `window` steps divided by its mean over the first
    `window`. Fires at <= `ratio_max`.
    """

    window: int = 5
    ratio_max: float = 0.05
    name: str = "entropy_collapse"
    kind: str = "health"

    def check(self, rows: Sequence[dict[str, Any]]) -> Finding | None:
        br = base_and_recent(series(rows, "entropy/mean"), self.window)
        if br is None or br[0] <= 0:
            return None
        ratio = br[1] / br[0]
        if ratio <= self.ratio_max:
            return Finding(ratio, self.ratio_max, f"entropy {br[0]:.3f} -> {br[1]:.4f} nats/token")
        return None


@dataclass
class KLBlowup(Detector):
    """The policy runs away from the reference.

    Statistic: `kl/mean` (nats per token), the smallest of the last `patience` steps, so one
    noisy step does not fire. Fires at >= `max_kl`.
    """

    max_kl: float = 1.0
    patience: int = 2
    name: str = "kl_blowup"
    kind: str = "health"

    def check(self, rows: Sequence[dict[str, Any]]) -> Finding | None:
        values = series(rows, "kl/mean")
        if len(values) < self.patience:
            return None
        low = min(values[-self.patience:])
        if low >= self.max_kl:
            return Finding(low, self.max_kl, f"KL to the reference >= {low:.3f} nats/token for {self.patience} steps")
        return None


@dataclass
class ZeroVariance(Detector):
    """Groups whose completions all get the same reward carry no learning signal (GRPO/RLOO).

    Statistic: the fraction of the step's groups with zero reward variance, averaged over the last
    `window` steps. Fires at >= `max_frac`.
    """

    window: int = 5
    max_frac: float = 0.9
    name: str = "zero_variance"
    kind: str = "health"

    def measure(self, record: StepRecord) -> dict[str, float]:
        g = record.group_size
        if g < 2 or len(record) % g:
            return {}
        groups = [record.rewards[i : i + g] for i in range(0, len(record), g)]
        return {"monitor/zero_var_frac": sum(max(x) == min(x) for x in groups) / len(groups)}

    def check(self, rows: Sequence[dict[str, Any]]) -> Finding | None:
        values = series(rows, "monitor/zero_var_frac")
        if len(values) < self.window:
            return None
        recent = mean(values[-self.window:])
        if recent >= self.max_frac:
            return Finding(recent, self.max_frac, f"{recent:.0%} of groups have one reward for every completion")
        return None
