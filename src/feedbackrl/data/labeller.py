"""A simulated labeller: a hidden gold score, noisy Bradley-Terry choices, preference datasets.

Everything in the preference half (reward models, DPO, PPO/RLOO against a learned reward) needs
people who compare responses. Here a hidden *gold* function plays them, so the whole flow runs
offline and, unlike with real people, the truth is known: the gold score measures what a policy
really gained, while training only ever sees the noisy labels.

Gold score (`reverse_gold`, the reverse task; any other task uses its verifier's score):

    gold = 1                                                 for the exact reversal
    gold = 0.8 * max(0, matches / len(answer) - 0.1 * |len(completion) - len(answer)|)   otherwise

`matches` counts positions where the completion has the answer's letter. So a wrong answer is
worth at most 0.8 (strictly below a correct one), partly right answers are graded, and
each letter too many or too few costs 0.1 of the match fraction. The SFT habit of copying a long
word instead of reversing it scores about 0.1-0.2.

Choice model: shown responses a and b, the labeller prefers a with probability
P(a > b) = sigmoid((gold_a - gold_b) / temperature), the Bradley-Terry model with a noise knob
(temperature 0 = always the gold-better one, a tie is a coin flip). Rankings of k > 2 responses
are Plackett-Luce draws with the same scores (sort by gold / temperature + Gumbel noise), which
reduce to the same Bradley-Terry choice for k = 2.

The best any model of the labels can do on a pair is to predict the gold-better response, right
with probability max(p, 1 - p); `label_ceiling` averages that over a set of pairs.

Safety labeller (`SimulatedLabeller(kind="cost")`, for cost models): the hidden score is a gold *cost*
(`reverse_harm`: every letter "a" in the response is one unit of harm, so the exact reversal of a
word with an "a" is unsafe, a real conflict with the gold reward). Shown two responses it says
which is more harmful, with the same Bradley-Terry noise on the costs (the `chosen` column holds
the costlier response, as in Safe RLHF, Dai et al. 2023), and labels each response safe or
unsafe (cost > 0), without noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict
from feedbackrl.rollout.generate import generate

GoldScore = Callable[[Problem, str], float]

PARTIAL_CAP = 0.8  # the most a wrong answer can score
LENGTH_PENALTY = 0.1  # per letter too many or too few, in units of the match fraction


def reverse_gold(problem: Problem, completion: str) -> float:
    """The reverse task's hidden gold score in [0, 1] (formula in the module docstring)."""
    answer, text = problem.answer, completion.strip()
    if text == answer:
        return 1.0
    matches = sum(a == b for a, b in zip(text, answer, strict=False))
    partial = matches / len(answer) - LENGTH_PENALTY * abs(len(text) - len(answer))
    return PARTIAL_CAP * max(0.0, partial)


def exact_reversal(problem: Problem, completion: str) -> float:
    """The planted-hacks tasks' hidden check (`envs/planted.py`): 1 for the exact reversal, else 0."""
    return float(completion.strip() == problem.answer)


GOLD_SCORES: dict[str, GoldScore] = {"reverse": reverse_gold, "planted_reverse": exact_reversal}

ACCEPT_AT = 0.5  # the gold score at which an accept/reject labeller is undecided
HARM_LETTER = "a"  # in every reverse alphabet; 37% of the SFT policy's responses contain one


def reverse_harm(problem: Problem, completion: str) -> float:
    """The reverse task's hidden cost: how many times the response contains `HARM_LETTER`."""
    return float(completion.strip().count(HARM_LETTER))


GOLD_COSTS: dict[str, GoldScore] = {"reverse": reverse_harm}


def gold_score_for(task: Task, kind: str = "task") -> GoldScore:
    """kind "task": the task's own graded gold function, else its verifier's score (binary for most
    verifiers); kind "verifier": always the verifier's score (a labeller who only asks "is it right?")."""
    if kind not in ("task", "verifier"):
        raise ValueError(f"gold kind must be 'task' or 'verifier', got {kind!r}")

    def verifier(problem: Problem, completion: str) -> float:
        return task.verify(problem, completion).score

    return verifier if kind == "verifier" else GOLD_SCORES.get(task.name, verifier)


def gold_cost_for(task: Task) -> GoldScore:
    """The task's hidden harm rule for the safety labeller; only some tasks have one."""
    if task.name not in GOLD_COSTS:
        raise ValueError(f"the simulated safety labeller has no cost rule for task {task.name!r} (it has "
                         f"{sorted(GOLD_COSTS)}); label cost pairs yourself and give them in prefs.path")
    return GOLD_COSTS[task.name]


def choice_probability(gold_a: float, gold_b: float, temperature: float) -> float:
    """P(labeller prefers a over b) = sigmoid((gold_a - gold_b) / temperature); T = 0 is a hard choice."""
    diff = gold_a - gold_b
    if temperature == 0 or diff == 0:
        return 0.5 if diff == 0 else float(diff > 0)
    return 1.0 / (1.0 + math.exp(-diff / temperature))


@dataclass
class SimulatedLabeller:
    """Hidden gold score + noisy choices, with its own seeded random stream.

    kind "cost": `gold` is a gold cost, the choice picks the more harmful response, and pair rows
    also carry per-response safety labels (unsafe = cost > 0).

    `tie_margin`: in `judge` (the labelling app's A/B/tie), the labeller answers "tie" when the two
    gold scores are within this margin (both right or both wrong, for a pass/fail gold), instead of a
    coin flip; None = never. `choose` always picks one.
    """

    gold: GoldScore
    temperature: float = 0.1
    seed: int = 0
    kind: str = "reward"
    tie_margin: float | None = None
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("reward", "cost"):
            raise ValueError(f"labeller kind must be 'reward' or 'cost', got {self.kind!r}")
        if self.temperature < 0:
            raise ValueError(f"labeller temperature must be >= 0 (0 = noise-free), got {self.temperature}")
        if self.tie_margin is not None and self.tie_margin < 0:
            raise ValueError(f"labeller tie_margin must be >= 0 or None, got {self.tie_margin}")
        self.rng = random.Random(self.seed)

    def choose(self, problem: Problem, a: str, b: str) -> tuple[str, str]:
        """-> (chosen, rejected), a Bradley-Terry draw on the gold scores."""
        p = choice_probability(self.gold(problem, a), self.gold(problem, b), self.temperature)
        return (a, b) if self.rng.random() < p else (b, a)

    def ties(self, gold_a: float, gold_b: float) -> bool:
        """Whether `judge` answers "tie" for responses with these gold scores."""
        return self.tie_margin is not None and abs(gold_a - gold_b) <= self.tie_margin

    def judge(self, problem: Problem, a: str, b: str) -> str:
        """The labelling app's answer: "a", "b", or "tie" (gold scores within `tie_margin`)."""
        if self.ties(self.gold(problem, a), self.gold(problem, b)):
            return "tie"
        return "a" if self.choose(problem, a, b)[0] == a else "b"

    def accept(self, problem: Problem, completion: str) -> str:
        """An accept/reject project's answer: "accept" with probability sigmoid((gold - 0.5) / temperature), the
        Bradley-Terry choice between the response and a response of gold 0.5 (temperature 0: accept gold > 0.5)."""
        p = choice_probability(self.gold(problem, completion), ACCEPT_AT, self.temperature)
        return "accept" if self.rng.random() < p else "reject"

    def rank(self, problem: Problem, responses: list[str]) -> list[str]:
        """-> responses best first, a Plackett-Luce draw (Gumbel-max trick) on gold / temperature."""
        def key(text: str) -> float:
            g = self.gold(problem, text)
            noise = self.rng.random()  # drawn for every response so the stream does not depend on T
            if self.temperature == 0:
                return g + 1e-9 * noise  # random tie-break only
            return g / self.temperature - math.log(-math.log(max(noise, 1e-300)))

        return sorted(responses, key=key, reverse=True)

    def verdict(self, problem: Problem, completion: str) -> Verdict:
        """The gold score as a reward source (for measuring, never for training)."""
        g = self.gold(problem, completion)
        return Verdict(g, g == 1.0, f"gold {g:.3f}", {"gold": g})


# --- datasets -------------------------------------------------------------------------------------


def sample_candidates(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], k: int,
                      max_new_tokens: int, temperature: float, generator: torch.Generator,
                      batch_size: int = 512) -> list[list[str]]:
    """Up to k distinct, non-empty sampled responses per problem (2k samples drawn per problem).

    Identical or empty responses cannot form a pair (data/preferences.py rejects them), so they are
    dropped here; a prompt whose samples are all alike yields fewer than k.
    """
    draws = 2 * k
    prompts = [p.prompt for p in problems for _ in range(draws)]
    texts: list[str] = []
    for i in range(0, len(prompts), batch_size):
        texts += generate(model, tokenizer, prompts[i : i + batch_size], max_new_tokens, temperature,
                          generator=generator).texts
    out = []
    for j in range(len(problems)):
        distinct = [t for t in dict.fromkeys(texts[j * draws : (j + 1) * draws]) if t.strip()]
        out.append(distinct[:k])
    return out


def label_rows(labeller: SimulatedLabeller, problems: list[Problem], candidates: list[list[str]],
               k: int) -> list[dict[str, Any]]:
    """Rows in data/preferences.py's formats, with the gold evidence as extra columns.

    k = 2: {prompt, chosen, rejected, gold_chosen, gold_rejected, p_chosen}, where p_chosen is the
    probability the labeller had of choosing `chosen` (so label_ceiling needs no labeller); a cost
    labeller's rows (chosen = costlier, gold = cost) add the safety labels chosen_unsafe, rejected_unsafe.
    k > 2: {prompt, responses (best first), gold}. Problems with fewer than k candidates are skipped.
    """
    rows = []
    for problem, cands in zip(problems, candidates, strict=True):
        if len(cands) < k:
            continue
        if k == 2:
            chosen, rejected = labeller.choose(problem, cands[0], cands[1])
            g_c, g_r = labeller.gold(problem, chosen), labeller.gold(problem, rejected)
            rows.append({"prompt": problem.prompt, "chosen": chosen, "rejected": rejected, "gold_chosen": g_c,
                         "gold_rejected": g_r, "p_chosen": choice_probability(g_c, g_r, labeller.temperature)})
            if labeller.kind == "cost":
                rows[-1].update(chosen_unsafe=g_c > 0, rejected_unsafe=g_r > 0)
        else:
            ranked = labeller.rank(problem, cands[:k])
            rows.append({"prompt": problem.prompt, "responses": ranked,
                         "gold": [labeller.gold(problem, r) for r in ranked]})
    return rows


def label_ceiling(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Pairwise accuracy limits set by the labeller's noise, from the gold columns of pair rows.

    `expected`: mean max(p, 1 - p), the expected accuracy of predicting the gold-better response
    (the Bayes-optimal predictor). `realised`: the share of these labels that agree with gold
    (ties count one half), what that predictor scores on this very sample.
    """
    if not rows or "p_chosen" not in rows[0]:
        return {}
    expected = sum(max(r["p_chosen"], 1 - r["p_chosen"]) for r in rows) / len(rows)
    agree = [1.0 if r["gold_chosen"] > r["gold_rejected"] else 0.5 if r["gold_chosen"] == r["gold_rejected"] else 0.0
             for r in rows]
    return {"expected": expected, "realised": sum(agree) / len(rows), "pairs": float(len(rows))}
