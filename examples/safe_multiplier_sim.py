"""The safe RL toy's multiplier on a simulated policy (docs/safety.md, "The toy"): how far the final held-out cost
scatters under each PID setting, when the window's cost moves with the draw of words.

    python examples/safe_multiplier_sim.py          # about a minute; no model, no torch compute

The simulated policy: each step draws 16 words, 40.4% of them with an "a" (the training words' share), and 8
completions each; a completion of a word with an "a" costs 1 with probability p (its propensity), of a word
without, 0.01. p moves a quarter of the way per step towards 0.92 - G * lambda (0.92: the unconstrained runs'
propensity; G the effect of lambda, 0.2, 0.35 or 0.6 per unit); after 120 steps the held-out cost is the mean of
1,000 draws at p times the held-out words' share 0.442. The multiplier is `algos.constrained.pid_lagrange_update`
itself. Printed per setting and G: the mean and SD of the final held-out cost over 300 simulated runs.
"""

from __future__ import annotations

import random
import statistics

from feedbackrl.algos.constrained import PIDLagrangeState, pid_lagrange_update

SETTINGS = {  # name -> (kp, ki, window, target = threshold - margin, bound_delta)
    "previous: kp 4, ki 0.5, window 512, mean, target 0.33": (4.0, 0.5, 512, 0.33, 0.0),
    "kp 4, ki 0.5, window 2048, mean, target 0.33": (4.0, 0.5, 2048, 0.33, 0.0),
    "kp 1, ki 0.2, window 512, mean, target 0.33": (1.0, 0.2, 512, 0.33, 0.0),
    "kp 1, ki 0.2, window 4096, mean, target 0.33": (1.0, 0.2, 4096, 0.33, 0.0),
    "the recipe: kp 1, ki 0.2, window 1000, bound 0.1, target 0.35": (1.0, 0.2, 1000, 0.35, 0.1),
}


def simulate(kp: float, ki: float, window: int, target: float, bound_delta: float, gain: float, seed: int,
             steps: int = 120) -> float:
    rng, state, p = random.Random(seed), PIDLagrangeState(lam=0.0), 0.85
    for _ in range(steps):
        costs = []
        for _ in range(16):
            has_a = rng.random() < 0.404
            costs += [float(rng.random() < (p if has_a else 0.01)) for _ in range(8)]
        state, _ = pid_lagrange_update(state, costs, target, kp, ki, 0.0, window, 0, 5.0, bound_delta)
        p += (max(0.3, 0.92 - gain * state.lam) - p) / 4
    return sum(rng.random() < p * 0.442 for _ in range(1000)) / 1000


def main() -> None:
    for name, (kp, ki, window, target, bound_delta) in SETTINGS.items():
        cells = []
        for gain in (0.2, 0.35, 0.6):
            held = [simulate(kp, ki, window, target, bound_delta, gain, seed) for seed in range(300)]
            cells.append(f"G {gain}: {statistics.mean(held):.3f} +- {statistics.stdev(held):.3f}")
        print(f"{name:64s} " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
