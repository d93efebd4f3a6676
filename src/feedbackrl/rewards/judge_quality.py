"""Measuring a judge instead of trusting it: agreement with gold, position bias, self-consistency.

- agreement: on held-out pairs whose gold scores differ, the fraction where the pairwise judge
  (both orders averaged) prefers the gold-better response; a judge tie counts one half.
- position bias rate: the fraction of pairs where the two orders disagree (the answer depended
  on which response came first).
- self-consistency: the pointwise judge asked twice about the same response with the cache
  bypassed; the fraction of identical scores (1.0 for a deterministic judge).
- pointwise agreement: the fraction of pairs where the pointwise judge scores the gold-better
  response higher (equal scores count one half).

On the reversal task the pairs are the exact reversal against a corruption of it (the word
copied, two letters swapped, a letter dropped or added), so gold always separates them. `gold_pairs`
takes any task's wrong answers, e.g. the addition task's `wrong_sum` (the sum without its carries,
or one or ten off).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from feedbackrl.rewards.judge import LogprobPairwiseJudge, LogprobPointwiseJudge, PairwiseJudge, PointwiseJudge
from feedbackrl.rewards.verdict import Problem

Pair = tuple[Problem, str, str]


def corrupt(answer: str, rng: random.Random) -> str:
    """A wrong variant of `answer`: reversed back, two letters swapped, one dropped, or one added."""
    kind = rng.randrange(4)
    if kind == 0 and answer != answer[::-1]:
        return answer[::-1]
    if kind == 1 and len(set(answer)) > 1:
        i, j = rng.sample(range(len(answer)), 2)
        while answer[i] == answer[j]:
            i, j = rng.sample(range(len(answer)), 2)
        chars = list(answer)
        chars[i], chars[j] = chars[j], chars[i]
        return "".join(chars)
    if kind == 2 and len(answer) > 1:
        i = rng.randrange(len(answer))
        return answer[:i] + answer[i + 1 :]
    return answer + rng.choice(answer)


def gold_pairs(problems: Sequence[Problem], wrong: Callable[[Problem, random.Random], str],
               seed: int = 0) -> list[Pair]:
    """One (problem, a, b) per problem: the exact answer and `wrong(problem, rng)`, in a random order."""
    rng, out = random.Random(seed), []
    for p in problems:
        right, bad = p.answer, wrong(p, rng)
        out.append((p, right, bad) if rng.random() < 0.5 else (p, bad, right))
    return out


def reversal_pairs(problems: Sequence[Problem], seed: int = 0) -> list[Pair]:
    """One (problem, a, b) per problem: the exact answer and a corruption, in a random order."""
    return gold_pairs(problems, lambda p, rng: corrupt(p.answer, rng), seed)


def judge_quality(pairwise: PairwiseJudge | LogprobPairwiseJudge,
                  pointwise: PointwiseJudge | LogprobPointwiseJudge | None, pairs: Sequence[Pair],
                  gold: Callable[[Problem, str], float], concurrency: int = 8) -> dict[str, Any]:
    """The three measures over `pairs` (see the module docstring); pairs with equal gold are skipped."""
    pairs = [p for p in pairs if gold(p[0], p[1]) != gold(p[0], p[2])]
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: pairwise.compare(*p), pairs))
    agree = [r.p_first if gold(p[0], p[1]) > gold(p[0], p[2]) else 1 - r.p_first for p, r in zip(pairs, results,
                                                                                               strict=True)]
    out: dict[str, Any] = {"pairs": len(pairs), "agreement": sum(agree) / max(len(pairs), 1),
                           "position_bias_rate": sum(not r.consistent for r in results) / max(len(pairs), 1)}
    if pointwise is not None:
        items = [(p[0], p[1]) for p in pairs] + [(p[0], p[2]) for p in pairs]
        with ThreadPoolExecutor(concurrency) as pool:
            first = list(pool.map(lambda it: pointwise(*it).score, items))
            pointwise.clear_cache()
            second = list(pool.map(lambda it: pointwise(*it).score, items))
        out["self_consistency"] = sum(a == b for a, b in zip(first, second, strict=True)) / max(len(items), 1)
        n = len(pairs)  # first[i] scores pairs[i]'s first response, first[n + i] its second
        wins = [(first[i] > first[n + i]) + 0.5 * (first[i] == first[n + i]) for i in range(n)]
        out["pointwise_agreement"] = sum(w if gold(p[0], p[1]) > gold(p[0], p[2]) else 1 - w
                                         for p, w in zip(pairs, wins, strict=True)) / max(n, 1)
    return out
