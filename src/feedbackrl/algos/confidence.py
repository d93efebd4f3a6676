"""Confidence bounds for safety decisions: HC-RLHF's release test and Wilson intervals on rates.

**Release test** (HC-RLHF: Chittepu et al. 2025, "Reinforcement Learning from Human Feedback with
High-Confidence Safety Constraints", the safety test; the bound is the one-sided Student-t bound
their Seldonian framework uses, Thomas et al. 2019, "Preventing undesirable behavior of intelligent
machines"). On n costs c_1..c_n of the candidate model's completions for a held-out safety set that
training never saw, with mean m and unbiased sample std s,

    U = m + t_{1 - delta, n - 1} * s / sqrt(n)                                 `mean_cost_upper_bound`

is an upper bound on the expected cost that holds with probability at least 1 - delta (exactly so
when the costs are normal; approximately by the central limit theorem otherwise). The model is
released only when U < threshold (`release_test`); otherwise it is refused, with U, n and m.

t_{p, nu} (`student_t_quantile`) is found by bisection on the t distribution's survival function,
which for an integer nu >= 1 is a finite sum (Abramowitz & Stegun 26.7.3 and 26.7.4, with
theta = atan(t / sqrt(nu))):

    nu = 1:     P(|T| < t) = 2 theta / pi
    nu odd:     P(|T| < t) = 2/pi (theta + sin theta (cos theta + 2/3 cos^3 theta + ...
                                   + (2*4*...*(nu-3)) / (1*3*...*(nu-2)) cos^(nu-2) theta))
    nu even:    P(|T| < t) = sin theta (1 + 1/2 cos^2 theta + (1*3)/(2*4) cos^4 theta + ...
                                   + (1*3*...*(nu-3)) / (2*4*...*(nu-2)) cos^(nu-2) theta)

torch has the t distribution's density but no quantile, and this layer takes no SciPy; the tests
check the result against the closed forms for nu = 1, 2 and against `scipy.stats.t.ppf` values.

**Rates** (`wilson_interval`): the Wilson score interval (Wilson 1927) for k events in n trials,
which unlike the normal (Wald) interval stays inside [0, 1] and is not empty at k = 0 or k = n:

    (p + z^2 / 2n  -+  z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n),   p = k / n

Departures:
- Ties refuse. At U == threshold the model is refused (the brief of a release test is to release
  only when the bound is *under* the threshold); the Seldonian test passes at equality.
- n = 1 has no variance estimate: the bound is +infinity and the model is refused, instead of an error.
- HC-RLHF also inflates the bound during candidate selection (training); that pessimistic bound is
  not used here: this module is only the final test and evaluation statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from statistics import NormalDist

import torch
from torch import Tensor


def _check_df(df: int) -> None:
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df!r}")


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer `df` >= 1 degrees of freedom (float64, series above)."""
    _check_df(df)
    if t < 0:
        return 1.0 - student_t_sf(-t, df)
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # 1, 1/2 c^2, (1*3)/(2*4) c^4, ... : df/2 terms
        k = torch.arange(1, df // 2, dtype=torch.float64)
        terms = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod((2 * k - 1) / (2 * k) * cos2, 0)])
        inside = sin * float(terms.sum())
    elif df == 1:
        inside = 2 / math.pi * theta
    else:  # c, 2/3 c^3, (2*4)/(3*5) c^5, ... : (df-1)/2 terms
        k = torch.arange(1, (df - 1) // 2, dtype=torch.float64)
        terms = math.cos(theta) * torch.cat([torch.ones(1, dtype=torch.float64),
                                             torch.cumprod(2 * k / (2 * k + 1) * cos2, 0)])
        inside = 2 / math.pi * (theta + sin * float(terms.sum()))
    return max(0.0, (1.0 - inside) / 2)


@lru_cache(maxsize=256)  # a release or a coverage check asks for the same few (p, df) many times
def student_t_quantile(p: float, df: int) -> float:
    """t with P(T <= t) = p, for p in (0, 1) and integer `df` >= 1 (bisection on `student_t_sf`)."""
    _check_df(df)
    if not 0 < p < 1:
        raise ValueError(f"a quantile's probability must be in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    tail, lo, hi = 1 - p, 0.0, 1.0
    while student_t_sf(hi, df) > tail:
        lo, hi = hi, 2 * hi
    for _ in range(200):  # ~60 halvings reach float64's spacing; stop when the midpoint cannot move
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if student_t_sf(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class CostBound:
    """The (1 - delta) one-sided upper bound on the mean cost, with what it was computed from."""

    bound: float  # +inf when n == 1
    mean: float
    std: float  # unbiased; 0 when n == 1
    n: int
    delta: float


def _costs_list(costs: Tensor | Sequence[float]) -> list[float]:
    values = costs.detach().double().reshape(-1).tolist() if isinstance(costs, Tensor) else [float(c) for c in costs]
    if not values:
        raise ValueError("no costs: the release test needs the costs of the held-out safety set's completions")
    bad = [(i, c) for i, c in enumerate(values) if not math.isfinite(c)]
    if bad:
        raise ValueError(f"costs must be finite numbers; got (index, value) {bad[:5]}")
    return values


def mean_cost_upper_bound(costs: Tensor | Sequence[float], delta: float) -> CostBound:
    """U = mean + t_{1-delta, n-1} * std / sqrt(n) over n held-out costs; delta in (0, 0.5]."""
    if not 0 < delta <= 0.5:
        raise ValueError(f"delta must be in (0, 0.5] (the bound holds with probability 1 - delta; "
                         f"0.1 or 0.05 are usual), got {delta}")
    values = _costs_list(costs)
    n = len(values)
    if n == 1:
        return CostBound(bound=math.inf, mean=values[0], std=0.0, n=1, delta=delta)
    if min(values) == max(values):  # exactly, not via a rounded sum: costs all at the threshold must refuse
        return CostBound(bound=values[0], mean=values[0], std=0.0, n=n, delta=delta)
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((c - mean) ** 2 for c in values) / (n - 1))
    bound = mean + student_t_quantile(1 - delta, n - 1) * std / math.sqrt(n)
    return CostBound(bound=bound, mean=mean, std=std, n=n, delta=delta)


@dataclass(frozen=True)
class ReleaseDecision:
    """HC-RLHF's safety test: released only when the cost bound is under the threshold."""

    released: bool
    bound: float
    mean: float
    std: float
    n: int
    delta: float
    threshold: float
    reason: str

    def to_dict(self) -> dict[str, object]:
        """JSON-safe: an infinite bound is written as null (the reason says why)."""
        out: dict[str, object] = asdict(self)
        out["bound"] = self.bound if math.isfinite(self.bound) else None
        return out


def release_test(costs: Tensor | Sequence[float], threshold: float, delta: float) -> ReleaseDecision:
    """Release when the (1 - delta) upper bound on the mean held-out cost is < threshold, else refuse."""
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold}")
    b = mean_cost_upper_bound(costs, delta)
    conf = f"{1 - delta:g}"
    if b.n == 1:
        released, reason = False, "refused: one cost gives no variance estimate, so no bound (n must be >= 2)"
    elif b.bound < threshold:
        released, reason = True, (f"released: the {conf} upper bound {b.bound:.6g} on the mean cost (mean "
                                  f"{b.mean:.6g}, n {b.n}) is under the threshold {threshold:g}")
    else:
        released, reason = False, (f"refused: the {conf} upper bound {b.bound:.6g} on the mean cost (mean "
                                   f"{b.mean:.6g}, n {b.n}) is not under the threshold {threshold:g}")
    return ReleaseDecision(released=released, bound=b.bound, mean=b.mean, std=b.std, n=b.n, delta=delta,
                           threshold=threshold, reason=reason)


def wilson_interval(events: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval at confidence `level` for `events` out of `n` trials."""
    if isinstance(events, bool) or isinstance(n, bool) or not isinstance(events, int) or not isinstance(n, int):
        raise ValueError(f"events and n must be integers, got {events!r} and {n!r}")
    if n < 1 or not 0 <= events <= n:
        raise ValueError(f"need 0 <= events <= n and n >= 1, got events={events}, n={n}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p, z2 = events / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if events == 0 else max(0.0, centre - half)
    high = 1.0 if events == n else min(1.0, centre + half)
    return low, high
