"""Dataset-backed tasks: prompts and gold answers from a file or a `datasets` dataset, judged by a
named verifier.

Sources: a JSONL file (any suffix other than those below), a Parquet (`.parquet`) or CSV (`.csv`,
header row first) file, a directory written by `datasets.Dataset.save_to_disk` (a DatasetDict
needs `split`), or a `datasets.Dataset` object passed from Python. Nothing is ever downloaded.

Columns are mapped with `prompt_field` and `answer_field`; `meta_fields` are copied into
`Problem.meta`, and `demo_field` names a column of reference completions for SFT warm starts
(without it, the "exact" and "math" verifiers demonstrate the gold answer itself). A meta field
named `constraints` holds the row's instruction constraints (a list of specs such as
`{"id": "no_commas"}`, or its JSON text): they are validated at load and read by the `constraints`
reward source of a recipe's `[reward]` section, beside the row's answer.

Chat-format rows: with `messages_field` (e.g. "messages") a row holds a conversation, a list of
``{"role", "content"}`` messages (checked as preference pairs check theirs, `data/preferences.py`). Its
last user turn is the prompt: `Problem.prompt` is that turn's text and `meta["messages"]` the conversation
up to it (system and earlier turns included), which `envs/chat.py` renders with the model's chat template.
An assistant turn after it is the row's reference reply: the SFT demonstration (unless `demo_field` names
another column) and, when the row has no `answer_field` value (absent or null), the gold answer too. Without a chat
template (`model.chat_template = "off"`, or a tokenizer without one) the prompt is the last user turn's
text alone, earlier turns left out.

Verifiers, chosen by name in `VERIFIERS`: "exact" (stripped string equality), "math"
(`rewards.math.MathVerifier`) and "code" (`rewards.code.CodeVerifier`: the answer column holds
the tests, as a dict or JSON text). `verifier_options` go to the verifier's constructor.

Rows are read eagerly and checked up front (code tests are parsed too), so a bad row fails the
run before any training with its index and the columns that do exist, instead of crashing mid-run.

Verdicts are cached per (row, completion), up to `_CACHE_SIZE` of them: a tiny policy repeats
itself a lot, and a code verdict costs a sandboxed process per test. This assumes verifiers are
deterministic, which holds for exact and math, and for code whose tests are.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.data.preferences import parse_messages
from feedbackrl.data.rows import DatasetError, read_rows, source_label
from feedbackrl.envs.base import Task
from feedbackrl.rewards.verdict import Problem, RewardSource, Verdict, fail

_CACHE_SIZE = 50_000


def read_task_rows(source: Any, split: str | None = None) -> list[dict[str, Any]]:
    """Rows of a task's data source (`data.rows.read_rows`); every row must be an object."""
    rows = read_rows(source, split)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetError(f"{source_label(source)}: row {i} is a {type(row).__name__}, expected a JSON object "
                               "(named columns)")
    return rows


def exact_match(problem: Problem, completion: str) -> Verdict:
    got, want = completion.strip(), str(problem.answer).strip()
    if not got:
        return fail("empty completion", expected=want)
    ok = got == want
    return Verdict(float(ok), ok, "exact match" if ok else "does not match the reference",
                   {"completion": got[:200], "expected": want})


def make_exact(**options: Any) -> RewardSource:
    if options:
        raise ValueError(f"verifier 'exact' takes no verifier_options, got {sorted(options)}")
    return exact_match


def make_math(**options: Any) -> RewardSource:
    from feedbackrl.rewards.math import MathVerifier

    if "order" in options:
        options["order"] = tuple(options["order"])
    return MathVerifier(**options)


def make_code(**options: Any) -> RewardSource:
    from feedbackrl.rewards.code import CodeVerifier

    return CodeVerifier(**options)


VERIFIERS: dict[str, Callable[..., RewardSource]] = {"exact": make_exact, "math": make_math, "code": make_code}


def check_answer(verifier: str, answer: Any) -> str | None:
    """Why `answer` cannot be a gold reference for `verifier`, or None when it can."""
    if verifier == "code":
        from feedbackrl.rewards.code import BadTests, parse_tests

        try:
            parse_tests(answer)
        except BadTests as e:
            return f"holds no valid tests: {e}"
        return None
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        return "is empty"
    return None


def _constraint_specs(value: Any, where: str) -> list[dict[str, Any]]:
    """A row's constraint specs (a list, or its JSON text as CSV holds it), validated."""
    from feedbackrl.rewards.instructions import load_constraints

    try:
        specs = json.loads(value) if isinstance(value, str) else value
        load_constraints(specs)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise DatasetError(f"{where}: {e}") from None
    return specs


@dataclass
class DatasetTask(Task):
    """Problems from a dataset source; a fixed `heldout_fraction` of rows is kept for eval."""

    path: Any
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    heldout_fraction: float = 0.1
    name: str = "dataset"
    verifier: str = "exact"
    verifier_options: dict[str, Any] = field(default_factory=dict)
    meta_fields: list[str] = field(default_factory=list)
    demo_field: str | None = None
    split: str | None = None
    verify_workers: int = 4
    messages_field: str | None = None
    _train: list[Problem] = field(init=False, repr=False)
    _heldout: list[Problem] = field(init=False, repr=False)
    _demos: dict[int, str] = field(init=False, repr=False, default_factory=dict)
    _verify: RewardSource = field(init=False, repr=False)
    _cache: dict[tuple[int, str], Verdict] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise DatasetError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.verifier not in VERIFIERS:
            raise DatasetError(f"unknown verifier {self.verifier!r}; choose one of {sorted(VERIFIERS)}")
        self._verify = VERIFIERS[self.verifier](**self.verifier_options)
        label = source_label(self.path)
        problems = [self._problem(i, row, label) for i, row in enumerate(read_task_rows(self.path, self.split))]
        order = list(range(len(problems)))
        random.Random(0).shuffle(order)
        n_held = int(round(len(problems) * self.heldout_fraction))
        self._heldout = [problems[i] for i in order[:n_held]]
        self._train = [problems[i] for i in order[n_held:]]
        if not self._train:
            raise DatasetError(f"{label}: no training rows left after holding out {n_held}")

    def _chat_problem(self, i: int, row: dict[str, Any], label: str) -> Problem:
        """A `messages_field` row: the last user turn is the prompt, an assistant turn after it the reply."""
        where = f"{label}: row {i}"
        if self.messages_field not in row:
            raise DatasetError(f"{where} has no column {self.messages_field!r}; its columns are {sorted(row)}. Check "
                               "task.options.messages_field.")
        try:
            msgs = parse_messages(row[self.messages_field], self.messages_field)
        except ValueError as e:
            raise DatasetError(f"{where}: {e}") from None
        users = [j for j, m in enumerate(msgs) if m["role"] == "user"]
        if not users or not msgs[users[-1]]["content"].strip():
            raise DatasetError(f"{where} column {self.messages_field!r} has no (non-empty) user turn to prompt with; "
                               f"roles: {[m['role'] for m in msgs]}")
        last = users[-1]
        reply = msgs[last + 1]["content"] if last + 1 < len(msgs) and msgs[last + 1]["role"] == "assistant" else None
        answer = row.get(self.answer_field)  # None (absent, or null in a Parquet/datasets column): the reply
        answer = reply if answer is None else answer
        if answer is None:
            raise DatasetError(f"{where} has no column {self.answer_field!r} and no assistant reply after its last "
                               f"user turn to take as the answer; its columns are {sorted(row)}")
        why = check_answer(self.verifier, answer)
        if why:
            raise DatasetError(f"{where}: the answer {why} (verifier {self.verifier!r})")
        if reply is not None and not self.demo_field:
            self._demos[i] = reply
        meta = self._meta(i, row, label)
        return Problem(msgs[last]["content"], answer, {**meta, "messages": msgs[: last + 1]})

    def _meta(self, i: int, row: dict[str, Any], label: str) -> dict[str, Any]:
        extra = [f for f in [*self.meta_fields, *([self.demo_field] if self.demo_field else [])] if f not in row]
        if extra:
            raise DatasetError(f"{label}: row {i} has no column {extra[0]!r}; its columns are {sorted(row)}. "
                               "Check task.options.meta_fields / demo_field.")
        if self.demo_field:
            demo = row[self.demo_field]
            if not isinstance(demo, str) or not demo:
                raise DatasetError(f"{label}: row {i} column {self.demo_field!r} must be a non-empty string")
            self._demos[i] = demo
        meta = {"row": i, **{f: row[f] for f in self.meta_fields}}
        if "constraints" in meta:
            meta["constraints"] = _constraint_specs(meta["constraints"], f"{label}: row {i} column 'constraints'")
        return meta

    def _problem(self, i: int, row: dict[str, Any], label: str) -> Problem:
        if self.messages_field:
            return self._chat_problem(i, row, label)
        missing = [f for f in (self.prompt_field, self.answer_field) if f not in row]
        if missing:
            raise DatasetError(f"{label}: row {i} has no column {missing[0]!r}; "
                               f"its columns are {sorted(row)}. Set task.options.prompt_field / "
                               "answer_field to map your columns.")
        if not isinstance(row[self.prompt_field], str) or not row[self.prompt_field]:
            raise DatasetError(f"{label}: row {i} column {self.prompt_field!r} must be a non-empty string")
        why = check_answer(self.verifier, row[self.answer_field])
        if why:
            raise DatasetError(f"{label}: row {i} column {self.answer_field!r} {why} "
                               f"(verifier {self.verifier!r}; columns {sorted(row)})")
        return Problem(row[self.prompt_field], row[self.answer_field], self._meta(i, row, label))

    def sample(self, rng: random.Random) -> Problem:
        return self._train[rng.randrange(len(self._train))]

    def heldout(self, n: int) -> list[Problem]:
        """The first `n` held-out rows; asking for more than the split holds is an error, never a silent cap."""
        if n > len(self._heldout):
            raise DatasetError(f"asked for {n} held-out problems but the dataset's held-out split has "
                               f"{len(self._heldout)} rows (heldout_fraction={self.heldout_fraction}); lower "
                               "task.heldout_size or raise task.options.heldout_fraction")
        return self._heldout[:n]

    def demonstrate(self, problem: Problem, rng: random.Random) -> str:
        """The row's `demo_field` (or a chat row's reference reply), else the gold answer itself (exact and math
        verifiers only)."""
        if problem.meta["row"] in self._demos:
            return self._demos[problem.meta["row"]]
        if self.verifier == "code":
            raise DatasetError("verifier 'code' has tests, not completions, as answers: set task.options.demo_field "
                               "to a column of reference programs, or sft.steps = 0")
        return str(problem.answer)

    def verify(self, problem: Problem, completion: str) -> Verdict:
        key = (problem.meta.get("row", -1), completion)
        if key[0] < 0 or not isinstance(completion, str):  # a problem built elsewhere: nothing to key on
            return self._verify(problem, completion)
        if key not in self._cache:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))  # oldest first
            self._cache[key] = self._verify(problem, completion)
        return self._cache[key]

    def verify_batch(self, problems: list[Problem], completions: list[str]) -> list[Verdict]:
        """All verdicts of a rollout batch. Code runs `verify_workers` sandboxes at a time (the threads
        only wait on subprocesses); other verifiers are CPU-bound Python and run in order."""
        if self.verifier != "code" or self.verify_workers <= 1:
            return [self.verify(p, c) for p, c in zip(problems, completions, strict=True)]
        todo = {(p.meta.get("row", -1), c): (p, c) for p, c in zip(problems, completions, strict=True)
                if (p.meta.get("row", -1), c) not in self._cache}
        with ThreadPoolExecutor(max_workers=self.verify_workers) as pool:
            fresh = dict(zip(todo, pool.map(lambda pc: self._verify(*pc), todo.values()), strict=True))
        for key, verdict in fresh.items():  # fill the cache here, on one thread
            if key[0] >= 0:
                self._cache[key] = verdict
        return [fresh.get((p.meta.get("row", -1), c)) or self.verify(p, c)
                for p, c in zip(problems, completions, strict=True)]
