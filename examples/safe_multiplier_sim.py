"""The safe RL toy's multiplier on a simulated policy (docs/safety.md, "The toy"): how far the final held-out cost
scatters under each PID setting, when the window's cost moves with the draw of words.

    python examples/safe_multiplier_sim.py          # about a minute; no model, no torch compute
    python examples/safe_multiplier_sim.py --probes # the multiplier on probe prompts (below); two minutes

The simulated policy: each step draws 16 words, 40.4% of them with an "a" (the training words' share), and 8
completions each; a completion of a word with an "a" costs 1 with probability p (its propensity), of a word
without, 0.01. p moves a quarter of the way per step towards 0.92 - G * lambda (0.92: the unconstrained runs'
propensity; G the effect of lambda, 0.2, 0.35 or 0.6 per unit); after 120 steps the held-out cost is the mean of
1,000 draws at p times the held-out words' share 0.442. The multiplier is `algos.constrained.pid_lagrange_update`
itself. Printed per setting and G: the mean and SD of the final held-out cost over 300 simulated runs.

`--probes`: the multiplier on 1,000 probe words (`constraint.probe_prompts`), `probe_per_step` of them sampled a
step in a cycle, J_C their window's 90% upper bound aimed at 0.35, against a policy that answers the probe set's
words with an "a" correctly (cost 1) with propensity p. The probe set is one draw (its share of words with an "a"
0.404 + N(0, 0.015)). p is pushed up by learning, 0.04 (0.95 - p) a step, and down by 0.03 p m, where m is an
exponential average of lambda (0.9 a step, as Adam's first moment carries an old gradient), plus N(0, 0.004) a
step: the policy integrates lambda with a lag, which is what makes PI control of it swing. After 120 steps the
held-out cost is 1,000 draws at p times the held-out words' share 0.442. Printed per setting: the final held-out
cost's mean and SD over 200 runs, the share under 0.3805 (released: the release bound sits 0.0195 above the mean),
and the SD of lambda after step 40 (the swing).
"""

from __future__ import annotations

import argparse
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


PROBE_SETTINGS = {  # name -> (kp, ki, kd, probe_per_step), 1,000 probes, window 1000, bound_delta 0.1, aim 0.35
    "kp 8, ki 1, 125 a step (the 2026-12-03 recipe)": (8.0, 1.0, 0.0, 125),
    "kp 8, ki 1, 250 a step": (8.0, 1.0, 0.0, 250),
    "kp 8, ki 1, 500 a step": (8.0, 1.0, 0.0, 500),
    "kp 8, ki 1, 1000 a step": (8.0, 1.0, 0.0, 1000),
    "kp 8, ki 1, kd 20, 125 a step": (8.0, 1.0, 20.0, 125),
    "kp 16, ki 0.5, 125 a step": (16.0, 0.5, 0.0, 125),
    "kp 16, ki 0.5, 1000 a step": (16.0, 0.5, 0.0, 1000),
    "kp 4, ki 0.5, 125 a step": (4.0, 0.5, 0.0, 125),
}


def simulate_probes(kp: float, ki: float, kd: float, per_step: int, seed: int, steps: int = 120,
                    n: int = 1000) -> tuple[float, float]:
    """-> (final held-out cost, SD of lambda after step 40) of one simulated run on probe prompts."""
    rng, state, p, m = random.Random(seed), PIDLagrangeState(lam=0.0), 0.80, 0.0
    share = 0.404 + rng.gauss(0, 0.015)
    has_a = [rng.random() < share for _ in range(n)]
    pos, lams = 0, []
    for step in range(steps):
        k = n if step == 0 else per_step
        costs = [float(rng.random() < (p if has_a[(pos + i) % n] else 0.01)) for i in range(k)]
        pos = (pos + k) % n
        state, _ = pid_lagrange_update(state, costs, 0.35, kp, ki, kd, n, 0, 5.0, 0.1)
        m = 0.9 * m + 0.1 * state.lam
        p = min(max(p + 0.04 * (0.95 - p) - 0.03 * m * p + rng.gauss(0, 0.004), 0.2), 0.97)
        lams.append(state.lam)
    return sum(rng.random() < p * 0.442 for _ in range(1000)) / 1000, statistics.pstdev(lams[40:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", action="store_true", help="the multiplier on probe prompts")
    if parser.parse_args().probes:
        for name, (kp, ki, kd, per_step) in PROBE_SETTINGS.items():
            runs = [simulate_probes(kp, ki, kd, per_step, seed) for seed in range(200)]
            held = [h for h, _ in runs]
            print(f"{name:48s} held-out cost {statistics.mean(held):.3f} +- {statistics.stdev(held):.3f}, "
                  f"released {sum(h < 0.3805 for h in held) / len(held):.0%}, "
                  f"lambda SD after step 40 {statistics.mean(sd for _, sd in runs):.2f}", flush=True)
        return
    for name, (kp, ki, window, target, bound_delta) in SETTINGS.items():
        cells = []
        for gain in (0.2, 0.35, 0.6):
            held = [simulate(kp, ki, window, target, bound_delta, gain, seed) for seed in range(300)]
            cells.append(f"G {gain}: {statistics.mean(held):.3f} +- {statistics.stdev(held):.3f}")
        print(f"{name:64s} " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
