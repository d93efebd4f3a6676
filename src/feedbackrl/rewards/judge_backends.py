"""Where a judge's answers come from: any OpenAI-compatible chat endpoint, or a local HF model.

A local model can also judge without writing a reply: `HFChoiceLogprobs` reads the log-probabilities of
fixed replies ("Yes" / "No", "A" / "B"), which the log-prob judges of `rewards/judge.py` compare.

A backend turns chat messages into one reply text with token counts. `CachedChat` wraps a
backend with a cache keyed by (judge, messages) and per-step accounting (calls, cache hits,
tokens, cost, timeouts); the judges in `rewards/judge.py` that read replies only ever talk to a
`CachedChat`.

The OpenAI client (`pip install 'feedbackrl[judge]'`) speaks to the OpenAI API, vLLM, SGLang,
llama.cpp's server or anything else with `/v1/chat/completions`; it is imported only when an
endpoint judge is built, so `import feedbackrl` never needs it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachetools import LRUCache

Messages = list[dict[str, str]]


class JudgeUnavailable(RuntimeError):
    """The judge could not answer (timeout, connection refused, HTTP error): the verdict says so."""


@dataclass(frozen=True)
class ChatReply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatBackend(Protocol):
    """One chat completion. `name` identifies the judge in cache keys (model + endpoint)."""

    name: str

    def complete(self, messages: Messages) -> ChatReply: ...


@dataclass
class OpenAIChat:
    """An OpenAI-compatible endpoint. `timeout` is per request in seconds; the client's own retries are off
    (the judge decides what to retry: an unparsable answer, not a dead server)."""

    model: str
    base_url: str | None = None
    api_key: str = "not-needed"  # local servers ignore it; hosted APIs read OPENAI_API_KEY when None
    timeout: float = 30.0
    temperature: float = 0.0
    max_tokens: int = 512
    name: str = ""

    def __post_init__(self) -> None:
        try:
            from openai import OpenAI
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError("an endpoint judge needs `pip install 'feedbackrl[judge]'` (the openai client)") from e
        self.name = self.name or f"{self.model}@{self.base_url or 'api.openai.com'}"
        self._client = OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=0)

    def complete(self, messages: Messages) -> ChatReply:
        import openai

        try:
            r = self._client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                     temperature=self.temperature, max_tokens=self.max_tokens)
        except openai.APITimeoutError as e:
            raise JudgeUnavailable(f"timeout after {self.timeout:g}s") from e
        except openai.APIError as e:
            raise JudgeUnavailable(f"{type(e).__name__}: {e}") from e
        usage = r.usage
        return ChatReply(r.choices[0].message.content or "", usage.prompt_tokens if usage else 0,
                         usage.completion_tokens if usage else 0)


@dataclass
class HFChat:
    """A local Hugging Face causal LM as the judge (greedy; the chat template when the tokenizer has one)."""

    path: str
    max_new_tokens: int = 256
    name: str = ""

    def __post_init__(self) -> None:
        from feedbackrl.models.load import load_policy, load_tokenizer

        self.name = self.name or f"hf:{self.path}"
        self._model, self._tok = load_policy(self.path).eval(), load_tokenizer(self.path)
        self._lock = threading.Lock()  # one generate at a time on the shared model

    def _prompt(self, messages: Messages) -> str:
        if getattr(self._tok, "chat_template", None):
            return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "

    def complete(self, messages: Messages) -> ChatReply:
        import torch

        enc = self._tok(self._prompt(messages), return_tensors="pt", add_special_tokens=False)
        with self._lock, torch.no_grad():
            out = self._model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                       pad_token_id=self._tok.pad_token_id)
        new = out[0, enc["input_ids"].shape[1] :]
        return ChatReply(self._tok.decode(new, skip_special_tokens=True), int(enc["input_ids"].shape[1]), len(new))


@dataclass
class JudgeStats:
    """Counters since the last `pop`: the judge's per-step cost line in the metrics."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unparsable: int = 0
    unavailable: int = 0


# Replies (or choice log-probs) a judge keeps: the least recently used go first. A GRPO group repeats completions
# within a step and across a few steps; a long run's distinct completions are unbounded (10,000 steps of 128
# completions would hold over a million keyed prompts), so the cache is not.
JUDGE_CACHE_ENTRIES = 100_000


def judge_cache(maxsize: int = JUDGE_CACHE_ENTRIES) -> MutableMapping[str, Any]:
    """An empty LRU cache for a judge's replies: at most `maxsize` entries. Not thread-safe: use it under a lock."""
    return LRUCache(maxsize=maxsize)


@dataclass
class CachedChat:
    """A backend with a thread-safe cache keyed by (judge name, messages) and token/cost accounting; the cache
    keeps the `JUDGE_CACHE_ENTRIES` most recently used replies.

    `usd_per_mtok`: (prompt, completion) prices per million tokens, for hosted APIs; 0 for local judges.
    """

    backend: ChatBackend
    usd_per_mtok: tuple[float, float] = (0.0, 0.0)
    cache: MutableMapping[str, ChatReply] = field(default_factory=judge_cache)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.stats = JudgeStats()

    def key(self, messages: Messages) -> str:
        blob = json.dumps([self.backend.name, messages], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def complete(self, messages: Messages, use_cache: bool = True) -> ChatReply:
        """The reply, from the cache when the same judge saw the same messages; raises JudgeUnavailable."""
        k = self.key(messages)
        with self._lock:
            if use_cache and k in self.cache:
                self.stats.cache_hits += 1
                return self.cache[k]
        try:
            reply = self.backend.complete(messages)
        except JudgeUnavailable:
            with self._lock:
                self.stats.unavailable += 1
            raise
        with self._lock:
            self.stats.calls += 1
            self.stats.prompt_tokens += reply.prompt_tokens
            self.stats.completion_tokens += reply.completion_tokens
            self.cache[k] = reply
        return reply

    def clear(self) -> None:
        """Drop every cached reply."""
        with self._lock:
            self.cache.clear()

    def forget(self, messages: Messages) -> None:
        """Drop a cached reply (an unparsable answer must not be served again on retry)."""
        with self._lock:
            self.cache.pop(self.key(messages), None)

    def count_unparsable(self) -> None:
        with self._lock:
            self.stats.unparsable += 1

    def pop_metrics(self) -> dict[str, Any]:
        """The counters as `judge/*` metrics, then reset: call once per training step."""
        with self._lock:
            s, self.stats = self.stats, JudgeStats()
        cost = (s.prompt_tokens * self.usd_per_mtok[0] + s.completion_tokens * self.usd_per_mtok[1]) / 1e6
        return {"judge/calls": s.calls, "judge/cache_hits": s.cache_hits, "judge/prompt_tokens": s.prompt_tokens,
                "judge/completion_tokens": s.completion_tokens, "judge/unparsable": s.unparsable,
                "judge/unavailable": s.unavailable, "judge/cost_usd": cost}


class ChoiceScorer(Protocol):
    """Log-probabilities of fixed reply texts (e.g. "Yes" / "No") as the judge's whole reply: no text is generated."""

    name: str

    def choice_logprobs(self, messages: Messages, choices: Sequence[str]) -> list[float]: ...


def choice_logprobs_batch(scorer: ChoiceScorer, conversations: Sequence[Messages], choices: Sequence[str],
                          batch_size: int = 16) -> list[list[float]]:
    """`scorer.choice_logprobs` for many conversations: in batches of `batch_size` when the scorer has a batched
    path (`HFChoiceLogprobs`), one by one otherwise."""
    batched = getattr(scorer, "choice_logprobs_batch", None)
    if batched is not None:
        return batched(conversations, choices, batch_size)
    return [scorer.choice_logprobs(m, choices) for m in conversations]


@dataclass
class HFChoiceLogprobs:
    """A local Hugging Face causal LM scoring each choice as the reply to `messages`: the sum of the choice's token
    log-probs after the prompt (the chat template with its generation prompt when the tokenizer has one).

    One forward pass per call when every choice is one token (the next-token log-softmax read at each choice's
    token), one per choice otherwise. Deterministic: the same messages give the same numbers.
    """

    path: str
    name: str = ""

    def __post_init__(self) -> None:
        from feedbackrl.models.load import load_policy, load_tokenizer

        self.name = self.name or f"hf-logprobs:{self.path}"
        self._model, self._tok = load_policy(self.path).eval(), load_tokenizer(self.path)
        self._lock = threading.Lock()

    def prompt_ids(self, messages: Messages) -> list[int]:
        if getattr(self._tok, "chat_template", None):
            text = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def choice_logprobs(self, messages: Messages, choices: Sequence[str]) -> list[float]:
        import torch

        prompt = self.prompt_ids(messages)
        ids = [list(self._tok(c, add_special_tokens=False)["input_ids"]) for c in choices]
        if any(not c for c in ids):
            raise ValueError(f"every choice must be at least one token, got {list(choices)!r}")
        with self._lock, torch.no_grad():
            if all(len(c) == 1 for c in ids):
                logits = self._model(torch.tensor([prompt])).logits[0, -1].float()
                lp = torch.log_softmax(logits, dim=-1)
                return [float(lp[c[0]]) for c in ids]
            out = []
            for c in ids:
                logits = self._model(torch.tensor([prompt + c])).logits[0, len(prompt) - 1 : -1].float()
                lp = torch.log_softmax(logits, dim=-1)
                out.append(float(lp[torch.arange(len(c)), torch.tensor(c)].sum()))
            return out

    def choice_logprobs_batch(self, conversations: Sequence[Messages], choices: Sequence[str],
                              batch_size: int = 16) -> list[list[float]]:
        """`choice_logprobs` of each conversation, `batch_size` prompts per forward pass when every choice is one
        token: the prompts are padded on the right, so each one's last token sees only itself (causal attention),
        and the next-token log-softmax is read at that token. Equal to one-by-one within float32 rounding."""
        import torch

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        ids = [list(self._tok(c, add_special_tokens=False)["input_ids"]) for c in choices]
        if not all(len(c) == 1 for c in ids):
            return [self.choice_logprobs(m, choices) for m in conversations]
        prompts = [self.prompt_ids(m) for m in conversations]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths pad less
        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else 0
        want = torch.tensor([c[0] for c in ids])
        out: list[list[float]] = [[] for _ in prompts]
        with self._lock, torch.no_grad():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                lens = torch.tensor([len(prompts[i]) for i in rows])
                width = int(lens.max())
                x = torch.full((len(rows), width), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, i in enumerate(rows):
                    x[r, : len(prompts[i])] = torch.tensor(prompts[i])
                    mask[r, : len(prompts[i])] = 1
                hidden = self._model.base_model(input_ids=x, attention_mask=mask).last_hidden_state
                last = hidden[torch.arange(len(rows)), lens - 1]  # the head on one position per prompt, not all
                lp = torch.log_softmax(self._model.get_output_embeddings()(last).float(), dim=-1)
                for r, i in enumerate(rows):
                    out[i] = [float(v) for v in lp[r, want]]
        return out
