"""Math verification throughput: verdicts per second on one thread, easy and LaTeX answers.

Run: .venv/bin/python benchmarks/bench_math.py [--n 300]
Prints one markdown table row and writes benchmarks/results/math.json.

Cases come from fixed seeds, a fresh set per measurement, so no string is checked twice (neither
our gold cache nor math-verify's parse cache makes repeats free across measurements); each gold is
shared by G=4 completions, as in a GRPO group. The ratio compares `MathVerifier` (extraction,
size guard, our timer) with calling math-verify's `parse` + `verify` directly on similar strings.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

from common import provenance
from math_verify import parse, verify

from feedbackrl.rewards.math import MathVerifier
from feedbackrl.rewards.verdict import Problem

GROUP = 4
RESULTS = Path(__file__).parent / "results" / "math.json"


def easy_case(rng: random.Random) -> tuple[str, list[str]]:
    """Integer word-problem answers, GSM8K style: 'The answer is 1,234.' and near misses."""
    gold = rng.randint(-500, 5000)
    shown = [f"{gold:,}", str(gold), str(gold + rng.choice([-1, 1])), f"{gold}.0"]
    return str(gold), [f"Adding up the parts gives {s} in total. The answer is {s}." for s in shown]


def latex_case(rng: random.Random) -> tuple[str, list[str]]:
    """Fractions, radicals, intervals and sets in \\boxed{}, equivalent forms and near misses."""
    a, b, k = rng.randint(1, 40), rng.randint(41, 97), rng.randint(2, 9)
    kind = rng.choice(["frac", "sqrt", "interval", "set"])
    if kind == "frac":
        gold = rf"\frac{{{a}}}{{{b}}}"
        shown = [rf"\dfrac{{{k * a}}}{{{k * b}}}", f"{a}/{b}", rf"\frac{{{a + 1}}}{{{b}}}", f"{a / b:.10f}"]
    elif kind == "sqrt":
        gold = rf"{a}\sqrt{{{b}}}"
        shown = [rf"\sqrt{{{a * a * b}}}", gold, rf"{a}\sqrt{{{b + 1}}}", rf"\sqrt{{{b}}}\cdot {a}"]
    elif kind == "interval":
        gold = f"({a}, {b}]"
        shown = [f"({a},{b}]", f"[{a}, {b}]", rf"\left({a}, {b}\right]", f"({a}, {b})"]
    else:
        gold = rf"\{{{a}, {b}\}}"
        shown = [rf"\{{{b}, {a}\}}", rf"\{{{a}, {b}, {k}\}}", rf"\{{{a},{b}\}}", rf"\{{{a}\}}"]
    return gold, [rf"Let me work through it... so the result is \boxed{{{s}}}." for s in shown]


def make_cases(n_groups: int, seed: int) -> dict[str, list[tuple[str, str]]]:
    rng = random.Random(seed)
    cases: dict[str, list[tuple[str, str]]] = {"easy": [], "latex": []}
    for i in range(n_groups):
        kind, make = ("easy", easy_case) if i % 2 == 0 else ("latex", latex_case)
        gold, completions = make(rng)
        cases[kind] += [(gold, c) for c in completions]
    return cases


def _mixed(cases: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """Easy and LaTeX groups interleaved, as a mixed training batch would arrive."""
    return [c for pair in zip(cases["easy"], cases["latex"], strict=True) for c in pair]


def rate(check: Callable[[str, str], object], cases: list[tuple[str, str]]) -> float:
    start = time.perf_counter()
    for gold, completion in cases:
        check(gold, completion)
    return len(cases) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="prompt groups (x4 completions each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    verifier = MathVerifier()
    ours = lambda gold, completion: verifier(Problem("", gold), completion)
    raw = lambda gold, completion: verify(parse(f"${gold}$"), parse(completion))
    warmup = make_cases(20, seed=args.seed + 1)  # imports, grammar load, SymPy caches
    for gold, completion in warmup["easy"] + warmup["latex"]:
        ours(gold, completion), raw(gold, completion)

    # A fresh seed per measurement: strings already checked would hit the parse caches.
    easy, latex = make_cases(args.n, args.seed)["easy"], make_cases(args.n, args.seed + 2)["latex"]
    mixed, mixed_raw = _mixed(make_cases(args.n, args.seed + 3)), _mixed(make_cases(args.n, args.seed + 4))
    rates = {"easy": rate(ours, easy), "latex": rate(ours, latex), "mixed": rate(ours, mixed),
             "math_verify_mixed": rate(raw, mixed_raw)}
    result = {"provenance": provenance(), **{name: round(r, 1) for name, r in rates.items()}}
    result |= {"ratio_ours_over_math_verify": round(rates["mixed"] / rates["math_verify_mixed"], 2),
               "n_verdicts": len(mixed), "python": platform.python_version(), "machine": platform.machine()}

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("| bench | easy verdicts/s | LaTeX verdicts/s | mixed verdicts/s | math-verify alone | ratio |")
    print("|---|---|---|---|---|---|")
    print(f"| math (1 thread, {result['n_verdicts']} verdicts) | {result['easy']} | {result['latex']} | "
          f"{result['mixed']} | {result['math_verify_mixed']} | {result['ratio_ours_over_math_verify']}x |")


if __name__ == "__main__":
    main()
