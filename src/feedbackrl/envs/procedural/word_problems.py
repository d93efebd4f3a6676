"""Grade-school word problems of one to three steps, in GSM8K's style, from templates with fresh numbers.

"Mia has 12 stickers. She buys 4 packs of 5 stickers each and gives 7 to a friend. How many stickers
does Mia have now?" -> 12 + 4 * 5 - 7 = 25. Each template is a story with named quantities and the
arithmetic that answers it (+, -, *, exact /); `steps` picks the templates by how many operations they
take (1, 2 or 3), and `max_number` bounds the numbers drawn. Every answer is a non-negative integer.

Why it exists beside reasoning-gym's `gsm_symbolic`: GSM8K's own templates are beyond a 135M-parameter
model (SmolLM2-135M-Instruct answers 1 in 20 of the finished ones), so it has no signal to learn from;
these stories keep GSM8K's form (a short narrative, quantities to combine, one number to answer) at a
difficulty such a model sometimes gets right.

Verdict: the math verifier (`rewards.math.MathVerifier`: the final answer read from free text, "...
so the answer is 25.", compared by value). Held-out problems are a fixed ~10% of all questions by a
hash of the question text (as reasoning-gym's adapter), never drawn for training; they come from a
stream of their own, so they are the same whatever the training seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from feedbackrl.envs.base import Task
from feedbackrl.envs.reasoning_gym import is_heldout
from feedbackrl.rewards.verdict import Problem, Verdict

_NAMES = ["Mia", "Sam", "Ava", "Leo", "Zoe", "Max", "Ella", "Ben", "Lily", "Noah", "Emma", "Owen", "Ruby", "Jack"]
_ITEMS = ["apples", "stickers", "marbles", "pencils", "cookies", "books", "cards", "shells", "coins", "crayons"]
_MAX_DRAWS = 1000  # a draw gives up after this many held-out (or invalid) questions in a row


@dataclass(frozen=True)
class Template:
    """A story: `make(rng, hi)` -> (question, answer) or None when the numbers drawn do not fit."""

    steps: int
    make: Callable[[random.Random, int], tuple[str, int] | None]


def _n(rng: random.Random, hi: int, lo: int = 2) -> int:
    return rng.randint(lo, max(lo, hi))


def _who(rng: random.Random) -> tuple[str, str, str]:
    """A name, a different second name, and an item."""
    a, b = rng.sample(_NAMES, 2)
    return a, b, rng.choice(_ITEMS)


def _t_buy(rng, hi):
    p, _, x = _who(rng)
    a, b = _n(rng, hi), _n(rng, hi)
    return f"{p} has {a} {x}. {p} gets {b} more {x}. How many {x} does {p} have now?", a + b


def _t_give(rng, hi):
    p, q, x = _who(rng)
    a = _n(rng, hi, 3)
    b = rng.randint(1, a - 1)
    return f"{p} has {a} {x} and gives {b} of them to {q}. How many {x} does {p} have left?", a - b


def _t_boxes(rng, hi):
    _, _, x = _who(rng)
    a, b = _n(rng, min(hi, 12)), _n(rng, min(hi, 12))
    return f"A box holds {a} {x}. How many {x} are in {b} boxes?", a * b


def _t_share(rng, hi):
    p, _, x = _who(rng)
    each, k = _n(rng, min(hi, 12)), _n(rng, min(hi, 10))
    return f"{p} shares {each * k} {x} equally among {k} friends. How many {x} does each friend get?", each


def _t_buy_give(rng, hi):
    p, q, x = _who(rng)
    a, b = _n(rng, hi), _n(rng, hi)
    c = rng.randint(1, a + b - 1)
    return (f"{p} has {a} {x}. {p} buys {b} more and then gives {c} to {q}. How many {x} does {p} have now?",
            a + b - c)


def _t_more_than(rng, hi):
    p, q, x = _who(rng)
    a, b = _n(rng, hi), _n(rng, hi)
    return (f"{p} has {a} {x}. {q} has {b} more {x} than {p}. How many {x} do {p} and {q} have together?",
            a + (a + b))


def _t_spend(rng, hi):
    p, _, _ = _who(rng)
    b, c = _n(rng, hi), _n(rng, hi)
    a = b + c + _n(rng, hi, 1)
    return (f"{p} had {a} dollars. {p} spent {b} dollars on a book and {c} dollars on lunch. "
            f"How many dollars does {p} have left?", a - b - c)


def _t_rows(rng, hi):
    rows, per = _n(rng, min(hi, 12)), _n(rng, min(hi, 12))
    taken = rng.randint(1, rows * per - 1)
    return (f"A hall has {rows} rows of chairs with {per} chairs in each row. {taken} chairs are taken. "
            "How many chairs are free?", rows * per - taken)


def _t_days(rng, hi):
    p, _, _ = _who(rng)
    a, d, extra = _n(rng, min(hi, 12)), _n(rng, min(hi, 10)), _n(rng, hi)
    return (f"{p} reads {a} pages every day for {d} days, then reads {extra} more pages. "
            f"How many pages does {p} read in all?", a * d + extra)


def _t_packs_left(rng, hi):
    p, q, x = _who(rng)
    packs, per, own = _n(rng, min(hi, 10)), _n(rng, min(hi, 10)), _n(rng, hi)
    c = rng.randint(1, own + packs * per - 1)
    return (f"{p} has {own} {x}. {p} buys {packs} packs of {per} {x} each and gives {c} {x} to {q}. "
            f"How many {x} does {p} have now?", own + packs * per - c)


def _t_bake(rng, hi):
    a, b = _n(rng, hi), _n(rng, hi)
    sold = rng.randint(1, a + b - 1)
    each = _n(rng, min(hi, 9))
    return (f"A baker makes {a} cakes in the morning and {b} cakes in the afternoon, and sells {sold} of them "
            f"for {each} dollars each. How many dollars does the baker get?", sold * each)


def _t_split_rest(rng, hi):
    p, _, x = _who(rng)
    k, each = _n(rng, min(hi, 8)), _n(rng, min(hi, 8))
    keep = _n(rng, hi)
    total = keep + k * each
    return (f"{p} has {total} {x}, keeps {keep} and shares the rest equally among {k} friends. "
            f"How many {x} does each friend get?", each)


TEMPLATES: tuple[Template, ...] = (
    Template(1, _t_buy), Template(1, _t_give), Template(1, _t_boxes), Template(1, _t_share),
    Template(2, _t_buy_give), Template(2, _t_more_than), Template(2, _t_spend), Template(2, _t_rows),
    Template(2, _t_days), Template(2, _t_split_rest),
    Template(3, _t_packs_left), Template(3, _t_bake),
)


@dataclass
class WordProblemTask(Task):
    """Word problems of `steps` operations each (any of 1, 2, 3), numbers up to `max_number`."""

    steps: tuple[int, ...] | list[int] = (1, 2, 3)
    max_number: int = 20
    heldout_fraction: float = 0.1
    seed: int = 0
    name: str = "word_problems"

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not steps or any(s not in (1, 2, 3) or isinstance(s, bool) for s in steps):
            raise ValueError(f"word_problems steps must be a non-empty list of 1, 2 or 3, got {self.steps!r}")
        if not 5 <= self.max_number <= 1000:
            raise ValueError(f"word_problems max_number must be in [5, 1000], got {self.max_number}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"word_problems heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        self.steps = steps
        self._templates = [t for t in TEMPLATES if t.steps in steps]
        self._heldout: list[Problem] = []
        self._heldout_rng = random.Random(f"word_problems-heldout-{self.seed}")

    def _draw(self, rng: random.Random, heldout: bool) -> Problem:
        for _ in range(_MAX_DRAWS):
            template = rng.choice(self._templates)
            made = template.make(rng, self.max_number)
            if made is not None and is_heldout(made[0], self.heldout_fraction) == heldout:
                question, answer = made
                return Problem(question, str(answer), {"steps": template.steps, "template": template.make.__name__})
        raise ValueError(f"word_problems: {_MAX_DRAWS} draws in a row gave no {'held-out' if heldout else 'training'}"
                         f" question (max_number {self.max_number} allows too few)")

    def sample(self, rng: random.Random) -> Problem:
        return self._draw(rng, heldout=False)

    def heldout(self, n: int) -> list[Problem]:
        seen, tries = {p.prompt for p in self._heldout}, 0
        while len(self._heldout) < n:
            tries += 1
            if tries > 20 * n + _MAX_DRAWS:
                raise ValueError(f"word_problems with steps {list(self.steps)} and max_number {self.max_number} gave "
                                 f"only {len(self._heldout)} distinct held-out questions; asked {n}")
            p = self._draw(self._heldout_rng, heldout=True)
            if p.prompt not in seen:
                seen.add(p.prompt)
                self._heldout.append(p)
        return self._heldout[:n]

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        return f"The answer is {problem.answer}."

    def verify(self, problem: Problem, completion: str) -> Verdict:
        from feedbackrl.rewards.math import MathVerifier

        return MathVerifier()(problem, completion)
