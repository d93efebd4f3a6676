"""LLM judges as reward sources: rubric scoring, pairwise and groupwise comparison, hybrids.

- `PointwiseJudge`: scores one response against a `Rubric` (criteria with weights, an integer
  scale, the JSON answer format spelled out in the prompt). The answer is parsed strictly
  (`parse_scores`); an unparsable answer is retried once with the parse error shown to the
  judge, then the verdict says "unparsable" with score 0. `reference=True` puts the problem's
  gold answer in the prompt (reference-guided judging, Zheng et al. 2023, "Judging LLM-as-a-Judge").
- `PairwiseJudge`: which of two responses is better, asked in both orders so position bias
  cancels (Zheng et al. 2023, section 3.4: swap positions, count inconsistent verdicts as ties);
  `group_scores` turns a group's round robin into per-response win rates for GRPO.
- `Hybrid`: rule checks for hard constraints gate the judge, which only scores the soft ones.
- `LogprobPointwiseJudge`, `LogprobPairwiseJudge`: a local model judging without writing a reply, from
  the log-probabilities of the replies "Yes" / "No" (pointwise) or "A" / "B" (pairwise, both orders
  averaged), for models too small to follow a JSON answer format.

Every verdict carries the judge's rationale. Judges never raise on a bad answer or a dead
endpoint; they return a zero verdict that says which. Calls run concurrently (`concurrency`
threads) through a `CachedChat` (`rewards/judge_backends.py`): cache, timeouts and per-step
token/cost metrics (`judge/*`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from feedbackrl.rewards.judge_backends import (
    CachedChat,
    ChoiceScorer,
    JudgeUnavailable,
    Messages,
    choice_logprobs_batch,
    judge_cache,
)
from feedbackrl.rewards.verdict import Problem, RewardSource, Verdict, fail


class ParseError(ValueError):
    """A judge answer that is not exactly the requested JSON object."""


@dataclass(frozen=True)
class Criterion:
    name: str
    weight: float
    description: str


@dataclass(frozen=True)
class Rubric:
    """Weighted criteria scored on the integer scale `low`..`high`."""

    criteria: tuple[Criterion, ...]
    low: int = 1
    high: int = 10
    task: str = "Judge the response to the task."

    def __post_init__(self) -> None:
        names = [c.name for c in self.criteria]
        if not names or len(set(names)) != len(names) or any(c.weight < 0 for c in self.criteria):
            raise ValueError(f"a rubric needs distinct criterion names and weights >= 0, got {names}")
        if sum(c.weight for c in self.criteria) <= 0 or self.low >= self.high:
            raise ValueError(f"rubric weights must not all be 0 and low < high, got {self.low}..{self.high}")

    def system(self) -> str:
        lines = [f"- {c.name} (weight {c.weight:g}): {c.description}" for c in self.criteria]
        fmt = ", ".join(f'"{c.name}": <integer {self.low}-{self.high}>' for c in self.criteria)
        return (f"You are a strict grader. {self.task}\nScore each criterion on an integer scale from {self.low} "
                f"(worst) to {self.high} (best):\n" + "\n".join(lines) +
                f'\nAnswer with only this JSON object and nothing else:\n{{"rationale": "<one sentence>", '
                f'"scores": {{{fmt}}}}}')

    def normalise(self, scores: Mapping[str, int]) -> float:
        """Weighted mean of (score - low) / (high - low): a number in [0, 1]."""
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight * (scores[c.name] - self.low) / (self.high - self.low) for c in self.criteria) / total


def _json_object(text: str) -> dict[str, Any]:
    """The answer as a JSON object: the whole text, or the whole of one ```json fenced block."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.DOTALL)
    body = fenced.group(1) if fenced else body
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ParseError(f"not a JSON object ({e.msg} at char {e.pos})") from None
    if not isinstance(obj, dict):
        raise ParseError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def parse_scores(text: str, rubric: Rubric) -> tuple[dict[str, int], str]:
    """Strictly parse {"rationale": str, "scores": {criterion: int}}: every criterion, nothing else, in range."""
    obj = _json_object(text)
    scores, rationale = obj.get("scores"), obj.get("rationale", "")
    if not isinstance(scores, dict):
        raise ParseError('missing "scores" object')
    want = {c.name for c in rubric.criteria}
    if set(scores) != want:
        raise ParseError(f"scores for {sorted(scores)}, expected exactly {sorted(want)}")
    for name, s in scores.items():
        if isinstance(s, bool) or not isinstance(s, int) or not rubric.low <= s <= rubric.high:
            raise ParseError(f"score {name}={s!r} is not an integer in {rubric.low}..{rubric.high}")
    if not isinstance(rationale, str):
        raise ParseError("rationale must be a string")
    return scores, rationale


def parse_winner(text: str) -> tuple[str, str]:
    """Strictly parse {"rationale": str, "winner": "A" | "B" | "tie"}."""
    obj = _json_object(text)
    winner, rationale = obj.get("winner"), obj.get("rationale", "")
    if winner not in ("A", "B", "tie") or not isinstance(rationale, str):
        raise ParseError(f'winner must be "A", "B" or "tie", got {winner!r}')
    return winner, rationale


def _ask(chat: CachedChat, messages: Messages, parse: Any, retries: int) -> tuple[Any, int, str]:
    """Ask, parse, and on a parse error ask again showing the error. Returns (parsed or None, attempts, last error)."""
    convo, err = list(messages), ""
    for attempt in range(1 + retries):
        reply = chat.complete(convo, use_cache=attempt == 0)
        try:
            return parse(reply.text), attempt + 1, ""
        except ParseError as e:
            err = f"{e}; answer was {reply.text[:200]!r}"
            if attempt == 0:
                chat.forget(messages)  # never serve the bad answer from the cache again
            convo = [*convo, {"role": "assistant", "content": reply.text},
                     {"role": "user", "content": f"Your answer could not be parsed: {e}. Reply with only the JSON "
                                                 "object in the requested format."}]
    chat.count_unparsable()
    return None, 1 + retries, err


def _user(problem: Problem, reference: bool, **responses: str) -> str:
    parts = [f"<task>\n{problem.prompt}\n</task>"]
    if reference:
        parts.append(f"<reference>\n{problem.answer}\n</reference>")
    parts += [f"<{tag}>\n{text}\n</{tag}>" for tag, text in responses.items()]
    return "\n".join(parts)


@dataclass
class PointwiseJudge:
    """A `RewardSource` scoring one response against a rubric; passes at score >= `pass_score`."""

    chat: CachedChat
    rubric: Rubric
    reference: bool = False
    retries: int = 1
    pass_score: float = 0.5
    concurrency: int = 8

    def messages(self, problem: Problem, completion: str) -> Messages:
        return [{"role": "system", "content": self.rubric.system()},
                {"role": "user", "content": _user(problem, self.reference, response=completion)}]

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        try:
            parsed, attempts, err = _ask(self.chat, self.messages(problem, completion),
                                         lambda t: parse_scores(t, self.rubric), self.retries)
        except JudgeUnavailable as e:
            return fail(f"judge unavailable: {e}", judge=self.chat.backend.name, unavailable=True)
        if parsed is None:
            return fail(f"judge answer unparsable after {attempts} attempts: {err}", judge=self.chat.backend.name,
                        unparsable=True)
        scores, rationale = parsed
        score = self.rubric.normalise(scores)
        return Verdict(score, score >= self.pass_score, rationale or f"judge score {score:.2f}",
                       {"judge": self.chat.backend.name, "scores": scores, "attempts": attempts})

    def clear_cache(self) -> None:
        """Forget cached replies, so the next calls ask the judge again."""
        self.chat.clear()

    def verify_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """One verdict per completion, `concurrency` judge calls at a time, in order."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self, problems, completions))


@dataclass(frozen=True)
class PairResult:
    """P(first response better) from both orders; `consistent` when the two orders agree."""

    p_first: float
    consistent: bool
    rationales: tuple[str, str]


PAIR_SYSTEM = ("You are a strict grader. Compare two responses to the task: {criteria}\nAnswer with only this JSON "
               'object and nothing else:\n{{"rationale": "<one sentence>", "winner": "A" or "B" or "tie"}}')
_WIN = {"A": 1.0, "B": 0.0, "tie": 0.5}


@dataclass
class PairwiseJudge:
    """Compares responses in both orders (A/B, then B/A) and averages, so a judge's position bias cancels."""

    chat: CachedChat
    criteria: str = "which response does the task better?"
    reference: bool = False
    retries: int = 1
    concurrency: int = 8

    def _one(self, problem: Problem, a: str, b: str) -> tuple[float, str]:
        msgs = [{"role": "system", "content": PAIR_SYSTEM.format(criteria=self.criteria)},
                {"role": "user", "content": _user(problem, self.reference, response_a=a, response_b=b)}]
        parsed, _, err = _ask(self.chat, msgs, parse_winner, self.retries)
        return (0.5, f"unparsable: {err}") if parsed is None else (_WIN[parsed[0]], parsed[1])

    def compare(self, problem: Problem, first: str, second: str) -> PairResult:
        """Both orders; an unparsable or unavailable answer counts as a tie."""
        try:
            ab, r1 = self._one(problem, first, second)
            ba, r2 = self._one(problem, second, first)
        except JudgeUnavailable as e:
            return PairResult(0.5, False, (f"judge unavailable: {e}", ""))
        return PairResult((ab + (1 - ba)) / 2, ab == 1 - ba, (r1, r2))

    def group_scores(self, problem: Problem, completions: Sequence[str]) -> list[float]:
        """Round robin over a group: each response's mean P(better) against the others (0.5 for a group of 1)."""
        n = len(completions)
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if completions[i] != completions[j]]
        with ThreadPoolExecutor(self.concurrency) as pool:
            results = list(pool.map(lambda ij: self.compare(problem, completions[ij[0]], completions[ij[1]]), pairs))
        wins = [0.0] * n
        for (i, j), r in zip(pairs, results, strict=True):
            wins[i] += r.p_first
            wins[j] += 1 - r.p_first
        ties = [sum(completions[i] == completions[j] for j in range(n) if j != i) for i in range(n)]
        return [(wins[i] + 0.5 * ties[i]) / (n - 1) if n > 1 else 0.5 for i in range(n)]


LOGPROB_POINT_SYSTEM = ("You are a strict grader. {task}\nCriterion: {criterion}\nDoes the response meet the "
                        "criterion? Answer with only Yes or No.")
LOGPROB_PAIR_SYSTEM = ("You are a strict grader. Compare two responses to the task: {criterion}\nWhich response is "
                       "better? Answer with only A or B.")


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


@dataclass
class LogprobPointwiseJudge:
    """A `RewardSource` from a local model's log-probs of the replies "Yes" and "No": no text is generated.

    score = P(Yes) / (P(Yes) + P(No)) = sigmoid(log P(Yes) - log P(No)), passing at >= `pass_score`. The
    model's probability of any other reply is left out, so a model that would rather write prose still gives
    a reading. Deterministic, so asking twice gives the same score.

    The two log-probs are cached by (judge, messages): a GRPO group repeats completions, and a repeated one
    costs no forward pass. `verify_batch` scores the batch's distinct uncached prompts `batch_size` at a time;
    `pop_metrics` gives the per-step counters (`judge/calls`, `judge/cache_hits`, `judge/seconds`).
    """

    scorer: ChoiceScorer
    criterion: str
    task: str = "Judge the response to the task."
    reference: bool = False
    pass_score: float = 0.5
    choices: tuple[str, str] = ("Yes", "No")
    batch_size: int = 16
    cache: MutableMapping[str, tuple[float, float]] = field(default_factory=judge_cache)

    def __post_init__(self) -> None:
        self._stats = {"calls": 0, "cache_hits": 0, "seconds": 0.0}
        self._lock = threading.Lock()  # judge_quality asks from several threads; the LRU cache is read under it

    def messages(self, problem: Problem, completion: str) -> Messages:
        return [{"role": "system", "content": LOGPROB_POINT_SYSTEM.format(task=self.task, criterion=self.criterion)},
                {"role": "user", "content": _user(problem, self.reference, response=completion)}]

    def _key(self, messages: Messages) -> str:
        blob = json.dumps([self.scorer.name, list(self.choices), messages], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()  # 64 characters a key, whatever the prompt's length

    def _verdict(self, yes: float, no: float) -> Verdict:
        score = 1.0 / (1.0 + math.exp(no - yes))
        return Verdict(score, score >= self.pass_score, f"log P({self.choices[0]}) - log P({self.choices[1]}) = "
                       f"{yes - no:.3f}", {"judge": self.scorer.name, "logprob_yes": yes, "logprob_no": no})

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        return self.verify_batch([problem], [completion])[0]

    def verify_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """One verdict per completion, in order; each distinct prompt the cache lacks is scored once."""
        keys, todo, found = [], {}, {}
        for p, c in zip(problems, completions, strict=True):
            msgs = self.messages(p, c)
            keys.append(k := self._key(msgs))
            if k in found or k in todo:  # a repeat within the batch
                continue
            with self._lock:
                hit = self.cache.get(k)
            if hit is not None:
                found[k] = hit
            else:
                todo[k] = msgs
        t0 = time.perf_counter()
        if todo:
            scored = choice_logprobs_batch(self.scorer, list(todo.values()), self.choices, self.batch_size)
            for k, (yes, no) in zip(todo, scored, strict=True):
                found[k] = (yes, no)
        with self._lock:
            for k in todo:
                self.cache[k] = found[k]
            self._stats["calls"] += len(todo)
            self._stats["cache_hits"] += len(keys) - len(todo)
            self._stats["seconds"] += time.perf_counter() - t0
        # read from this batch's own results: a batch larger than the cache would evict some before the end
        return [self._verdict(*found[k]) for k in keys]

    def clear_cache(self) -> None:
        """Forget the cached log-probs, so the next calls run the model again."""
        with self._lock:
            self.cache.clear()

    def pop_metrics(self) -> dict[str, float]:
        """`judge/calls` (prompts the model scored), `judge/cache_hits`, `judge/seconds` since the last call."""
        with self._lock:
            stats, self._stats = self._stats, {"calls": 0, "cache_hits": 0, "seconds": 0.0}
        return {f"judge/{k}": v for k, v in stats.items()}


@dataclass
class LogprobPairwiseJudge:
    """Pairwise comparison from a local model's log-probs of the replies "A" and "B", in both orders.

    In each order the margin is log P(A) - log P(B) (> 0: the response shown first is preferred). The first
    response's score is the mean over both orders, (margin(first, second) - margin(second, first)) / 2: it
    wins above 0, loses below, ties at exactly 0, so a constant lean towards one letter cancels. `consistent`
    when the two orders pick the same response (on their own, before averaging).
    """

    scorer: ChoiceScorer
    criteria: str = "which response does the task better?"
    reference: bool = False
    choices: tuple[str, str] = ("A", "B")

    def margin(self, problem: Problem, a: str, b: str) -> float:
        msgs = [{"role": "system", "content": LOGPROB_PAIR_SYSTEM.format(criterion=self.criteria)},
                {"role": "user", "content": _user(problem, self.reference, response_a=a, response_b=b)}]
        la, lb = self.scorer.choice_logprobs(msgs, self.choices)
        return la - lb

    def compare(self, problem: Problem, first: str, second: str) -> PairResult:
        ab, ba = self.margin(problem, first, second), self.margin(problem, second, first)
        score = (ab - ba) / 2
        p_first = 1.0 if score > 0 else 0.0 if score < 0 else 0.5
        return PairResult(p_first, _sign(ab) == -_sign(ba),
                          (f"first shown first: margin {ab:.3f}", f"second shown first: margin {ba:.3f}"))


def groupwise_reward(judge: PairwiseJudge) -> Any:
    """A batch reward for GRPO that judges each group together: consecutive rows answering the same
    problem object form a group, and each completion scores its round-robin win rate in it.

    (problems, completions) -> verdicts, one per row; a verdict passes when it beats its group on average.
    """
    def score(problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        verdicts: list[Verdict] = []
        i = 0
        while i < len(problems):
            j = i + 1
            while j < len(problems) and problems[j] is problems[i]:
                j += 1
            for s in judge.group_scores(problems[i], completions[i:j]):
                verdicts.append(Verdict(s, s > 0.5, f"win rate {s:.2f} in a group of {j - i}", {"win_rate": s}))
            i = j
        return verdicts

    return score


@dataclass
class Hybrid:
    """Rule checks for hard constraints, the judge for the soft ones: any failed rule scores 0 without asking."""

    rules: Mapping[str, RewardSource]
    judge: RewardSource

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        parts = {name: rule(problem, completion) for name, rule in self.rules.items()}
        failed = {n: v.reason for n, v in parts.items() if not v.passed}
        details = {"parts": {n: v.to_dict() for n, v in parts.items()}}
        if failed:
            return Verdict(0.0, False, f"hard constraint failed: {failed}", details)
        verdict = self.judge(problem, completion)
        details["parts"]["judge"] = verdict.to_dict()
        return Verdict(verdict.score, verdict.passed, verdict.reason, details)


def judge_source(ctx: Any, *, judge_model: str, criteria: dict[str, str], base_url: str | None = None,
                 weights: dict[str, float] | None = None, low: int = 1, high: int = 10, reference: bool = False,
                 timeout_s: float = 30.0, concurrency: int = 8, api_key: str | None = None) -> Any:
    """The `judge` entry of the reward registry: a pointwise rubric judge on an OpenAI-compatible endpoint.

    `judge_model`: the model name the endpoint serves; `criteria`: name -> description; `weights`:
    name -> weight (default 1 each); `api_key` None reads OPENAI_API_KEY (hosted APIs), local
    servers ignore it. Returns the judge's batch scorer.
    """
    from feedbackrl.rewards.judge_backends import OpenAIChat

    weights = weights or {}
    rubric = Rubric(tuple(Criterion(n, float(weights.get(n, 1.0)), d) for n, d in criteria.items()), low, high)
    chat = CachedChat(OpenAIChat(judge_model, base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s))
    return BatchJudge(PointwiseJudge(chat, rubric, reference=reference, concurrency=concurrency).verify_batch,
                      chat.pop_metrics)


@dataclass(frozen=True)
class BatchJudge:
    """A judge as a recipe's batch reward: `(problems, completions) -> verdicts`, and `pop_metrics()`, its
    per-step `judge/*` counters, which the training loop logs beside the reward (`train/prefs.py:gold_scorer`)."""

    score: Callable[[Sequence[Problem], Sequence[str]], list[Verdict]]
    pop_metrics: Callable[[], dict[str, Any]]

    def __call__(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        return self.score(problems, completions)


def check_judge_logprob(path: str, *, local_model: str, criterion: str, task: str = "Judge the response to the task.",
                        reference: bool = False, pass_score: float = 0.5, batch_size: int = 16) -> None:
    """The `judge_logprob` options, checked before any model is loaded."""
    if not local_model.strip():
        raise ValueError("local_model: needs a model directory, a .gguf file or a packaged model name ('smollm2')")
    if not criterion.strip():
        raise ValueError("criterion: needs the text the judge answers Yes or No to, e.g. 'the response is the "
                         "correct sum of the two numbers in the task'")
    if not task.strip():
        raise ValueError("task: must not be empty (the judge's one-line description of the task)")
    if not 0.0 < pass_score < 1.0:
        raise ValueError(f"pass_score: must be in (0, 1) (a score is P(Yes) / (P(Yes) + P(No))), got {pass_score}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")


def judge_logprob_source(ctx: Any, *, local_model: str, criterion: str, task: str = "Judge the response to the task.",
                         reference: bool = False, pass_score: float = 0.5, batch_size: int = 16) -> BatchJudge:
    """The `judge_logprob` entry of the reward registry: a local model judging each completion pointwise from its
    log-probs of "Yes" and "No" (`LogprobPointwiseJudge` on `HFChoiceLogprobs`), score P(Yes) / (P(Yes) + P(No)).

    `reference = true` shows the judge the problem's gold answer (reference-guided judging; the setting in which
    SmolLM2-135M's reading is useful on sums, docs/real_models.md). Cached and batched.
    """
    from feedbackrl.rewards.judge_backends import HFChoiceLogprobs

    check_judge_logprob(ctx.path, local_model=local_model, criterion=criterion, task=task, reference=reference,
                        pass_score=pass_score, batch_size=batch_size)
    judge = LogprobPointwiseJudge(HFChoiceLogprobs(local_model), criterion, task=task, reference=reference,
                                  pass_score=pass_score, batch_size=batch_size)
    return BatchJudge(judge.verify_batch, judge.pop_metrics)
