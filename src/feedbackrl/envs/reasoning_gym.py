"""Any reasoning-gym generator as a task (https://github.com/open-thought/reasoning-gym).

`reasoning_gym.create_dataset(name, seed=, size=, **config)` builds a procedural dataset whose
entry `idx` is a dict with `question`, `answer` and `metadata`, and whose `score_answer(answer,
entry)` grades an extracted answer in [0, 1]. This adapter turns one into a `Task`:

- prompt: `prompt_template` with `{question}` replaced by the entry's question;
- verdict: the generator's own `score_answer`, clamped to [0, 1]; passed when it is 1. The answer
  is extracted from the completion first: "bare" takes the whole completion (what a tiny model
  writes), "answer_tag" the last `<answer>...</answer>` span (reasoning-gym's own convention).
  Many generators keep the base class's partial credit, len(gold)/len(answer) when the answer
  contains the gold ("980" for 98 scores 2/3); `partial_credit=False` keeps only full marks.
  `verifier="math"` grades with `rewards.math.MathVerifier` instead (the final answer pulled out of
  free text, "... so the answer is 42.", and compared by value): what a chat model writes;
- demonstration (SFT warm start): the gold answer, written in the same format. Generators that
  accept many answers (their gold is "None", e.g. graph_color) cannot demonstrate.

Train and held-out problems never share a question. Membership is a hash of the question text
(like addition's held-out pairs): training draws from the stream seeded `seed` and skips
held-out questions; held-out problems come from the stream seeded `seed + size` (for the usual
`Random(seed + idx)` generators, disjoint from the training stream) and keep only held-out ones.

Where we depart from reasoning-gym: its `ReseedingDataset` and curricula are not used; the
seeds above and `envs/adaptive.py` cover the same needs with our own checkpointable state.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, Verdict, fail

_MAX_DRAWS_PER_PROBLEM = 200  # a training draw gives up after this many held-out questions in a row


def extract_bare(completion: str) -> str | None:
    return completion.strip() or None


def extract_answer_tag(completion: str) -> str | None:
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


EXTRACTORS: dict[str, Callable[[str], str | None]] = {"bare": extract_bare, "answer_tag": extract_answer_tag}
WRITERS: dict[str, Callable[[str], str]] = {"bare": str, "answer_tag": lambda a: f"<answer>{a}</answer>"}


def is_heldout(question: str, fraction: float) -> bool:
    """A fixed `fraction` of all questions, chosen by a hash that is the same in every process."""
    digest = hashlib.blake2b(question.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def create_rg_dataset(dataset: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """`reasoning_gym.create_dataset` with errors that name the dataset, the key and the allowed keys."""
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        names = sorted(DATASETS)
        close = difflib.get_close_matches(dataset, names, n=3)
        hint = f"did you mean {close}? " if close else ""
        raise ValueError(f"unknown reasoning-gym dataset {dataset!r}; {hint}{len(names)} available, "
                         f"e.g. {names[:12]}")
    clash = sorted({"seed", "size"} & set(config))
    if clash:
        raise ValueError(f"reasoning_gym config for {dataset!r} sets {clash}: set them as task options "
                         "(task.options.seed / size), not inside config")
    config_cls = DATASETS[dataset][1]
    allowed = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"reasoning_gym config for {dataset!r}: unknown key(s) {unknown}; allowed: {allowed}")
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(dataset, seed=seed, size=size, **config)
    except (AssertionError, TypeError, ValueError) as e:  # reasoning-gym validates configs with assert
        raise ValueError(f"reasoning_gym config for {dataset!r} is invalid: {e or type(e).__name__} "
                         f"(config {config})") from None


@dataclass
class ReasoningGymTask(Task):
    """Problems from reasoning-gym generator `dataset` built with `config` (its config dataclass's keys).

    `size` is the index space of each stream; generators that build every item up front (acre,
    list_functions, gsm_symbolic) need a smaller one. `heldout_fraction` of all questions are
    held out. The other options are described in the module docstring.
    """

    dataset: str
    config: dict[str, Any] = field(default_factory=dict)
    prompt_template: str = "{question}"
    extract: str = "bare"
    seed: int = 0
    size: int = 100_000
    heldout_fraction: float = 0.1
    partial_credit: bool = True
    verifier: str = "score_answer"
    name: str = "reasoning_gym"
    _train: Any = field(init=False, repr=False)
    _heldout_source: Any = field(init=False, repr=False)
    _heldout: list[Problem] = field(init=False, repr=False, default_factory=list)
    _heldout_next: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        if "{question}" not in self.prompt_template:
            raise ValueError(f"reasoning_gym prompt_template must contain '{{question}}', got {self.prompt_template!r}")
        if self.extract not in EXTRACTORS:
            raise ValueError(f"reasoning_gym extract must be one of {sorted(EXTRACTORS)}, got {self.extract!r}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"reasoning_gym heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.verifier not in ("score_answer", "math"):
            raise ValueError(f"reasoning_gym verifier must be 'score_answer' or 'math', got {self.verifier!r}")
        if self.size < 1:
            raise ValueError(f"reasoning_gym size must be >= 1, got {self.size}")
        self._train = create_rg_dataset(self.dataset, self.config, self.seed, self.size)
        self._heldout_source = create_rg_dataset(self.dataset, self.config, self.seed + self.size, self.size)

    def _problem(self, entry: dict[str, Any]) -> Problem:
        prompt = self.prompt_template.replace("{question}", entry["question"])
        return Problem(prompt, str(entry["answer"]), {"dataset": self.dataset, "entry": entry})

    def sample(self, rng: random.Random) -> Problem:
        for _ in range(_MAX_DRAWS_PER_PROBLEM):
            entry = self._train[rng.randrange(self.size)]
            if not is_heldout(entry["question"], self.heldout_fraction):
                return self._problem(entry)
        raise ValueError(f"reasoning_gym {self.dataset!r}: {_MAX_DRAWS_PER_PROBLEM} draws in a row were held-out "
                         "questions; the config allows too few distinct questions")

    def heldout(self, n: int) -> list[Problem]:
        seen = {p.meta["entry"]["question"] for p in self._heldout}
        while len(self._heldout) < n and self._heldout_next < self.size:
            entry = self._heldout_source[self._heldout_next]
            self._heldout_next += 1
            question = entry["question"]
            if is_heldout(question, self.heldout_fraction) and question not in seen:
                seen.add(question)
                self._heldout.append(self._problem(entry))
        if len(self._heldout) < n:
            raise ValueError(f"reasoning_gym {self.dataset!r} with config {self.config} gave only "
                             f"{len(self._heldout)} distinct held-out questions in {self.size} draws; asked {n}. "
                             "Lower task.heldout_size, widen the config or raise heldout_fraction.")
        return self._heldout[:n]

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        return WRITERS[self.extract](problem.answer)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        try:
            return self._verify(problem, completion)
        except Exception as e:  # a verifier never raises: one odd completion must not stop training
            return fail(f"reasoning_gym {self.dataset} score_answer raised {type(e).__name__}: {e}",
                        dataset=self.dataset, expected=problem.answer)

    def _verify(self, problem: Problem, completion: str) -> Verdict:
        if self.verifier == "math":
            from feedbackrl.rewards.math import MathVerifier

            return MathVerifier()(problem, completion)
        details: dict[str, Any] = {"dataset": self.dataset, "expected": problem.answer}
        answer = EXTRACTORS[self.extract](completion) if isinstance(completion, str) else None
        if answer is None:
            what = "empty completion" if self.extract == "bare" else "no <answer>...</answer> in the completion"
            return fail(what, completion=str(completion)[:200], **details)
        details["extracted"] = answer[:200]
        raw = self._train.score_answer(answer, problem.meta["entry"])
        score = float(raw) if isinstance(raw, int | float) and math.isfinite(raw) else 0.0
        score = min(1.0, max(0.0, score))
        if not self.partial_credit:
            score = float(score >= 1.0)
        details["raw_score"] = raw if isinstance(raw, int | float) else repr(raw)
        ok = score >= 1.0
        verb = "accepted" if ok else f"scored {score:.3g}"
        return Verdict(score, ok, f"{self.dataset} {verb}: {answer[:40]!r} vs gold {problem.answer[:40]!r}", details)
