"""Format rewards: does the completion have the required shape, regardless of its content?

Usually a gate in front of a correctness reward (see `combine.gate`), as in DeepSeek-R1's
format reward (arXiv:2501.12948) and TRL's `think_format_reward`. Both sources are binary; the
details say which check failed so a person can see what the policy got wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from feedbackrl.rewards.verdict import Problem, Verdict, fail

_SHOWN_CHARS = 200


@dataclass(frozen=True)
class RegexFormat:
    """Passes when `pattern` matches the completion (whole of it, or anywhere with mode="search").

    Patterns come from recipes, not from the policy; keep them free of nested quantifiers, since
    Python's `re` has no time limit and a pathological pattern can backtrack for a long time.
    """

    pattern: str
    mode: Literal["fullmatch", "search"] = "fullmatch"
    flags: int = re.DOTALL
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("fullmatch", "search"):
            raise ValueError(f"RegexFormat.mode must be 'fullmatch' or 'search', got {self.mode!r}")
        try:
            compiled = re.compile(self.pattern, self.flags)
        except re.error as e:
            raise ValueError(f"RegexFormat.pattern {self.pattern!r} does not compile: {e}") from e
        object.__setattr__(self, "_compiled", compiled)

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        if not isinstance(completion, str):
            return fail(f"completion is {type(completion).__name__}, not str")
        match = getattr(self._compiled, self.mode)(completion)
        details = {"pattern": self.pattern, "mode": self.mode}
        if match is None:
            return fail(f"completion does not {self.mode} {self.pattern!r}", **details)
        return Verdict(1.0, True, f"completion {self.mode}es the pattern",
                       {**details, "match": match.group()[:_SHOWN_CHARS]})


@dataclass(frozen=True)
class TagFormat:
    """`<think>reasoning</think>` then `<answer>final answer</answer>`, and nothing else.

    think_prefilled: the chat template already opened `<think>` in the prompt (DeepSeek-R1,
    Qwen3), so the completion must not open it again.
    require_reasoning: the think block must hold some text.
    """

    think_tag: str = "think"
    answer_tag: str = "answer"
    think_prefilled: bool = False
    require_reasoning: bool = True

    def __call__(self, problem: Problem, completion: str) -> Verdict:
        if not isinstance(completion, str):
            return fail(f"completion is {type(completion).__name__}, not str")
        checks, answer = self.checks(completion)
        details = {"checks": checks, "answer": answer[:_SHOWN_CHARS]}
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            return fail(f"format check failed: {failed[0]}", **details)
        return Verdict(1.0, True, "think and answer blocks well formed", details)

    def checks(self, text: str) -> tuple[dict[str, bool], str]:
        """Each format check by name, in order, and the answer block's text ("" if absent)."""
        t_open, t_close = f"<{self.think_tag}>", f"</{self.think_tag}>"
        a_open, a_close = f"<{self.answer_tag}>", f"</{self.answer_tag}>"
        # Counting tags (rather than one big regex) keeps this linear on adversarial input.
        counts_ok = (text.count(t_open) == (0 if self.think_prefilled else 1) and text.count(t_close) == 1
                     and text.count(a_open) == 1 and text.count(a_close) == 1)
        stripped = text.strip()
        opens_ok = self.think_prefilled or stripped.startswith(t_open)
        reasoning, _, rest = stripped.removeprefix(t_open).partition(t_close)
        between, _, rest = rest.partition(a_open)
        answer, _, after = rest.partition(a_close)
        checks = {
            "one_of_each_tag": counts_ok,
            "starts_with_think": opens_ok,
            "think_then_answer": counts_ok and text.find(t_close) < text.find(a_open) < text.find(a_close),
            "nothing_between_blocks": counts_ok and not between.strip(),
            "nothing_after_answer": counts_ok and not after.strip(),
            "reasoning_present": bool(reasoning.strip()) or not self.require_reasoning,
            "answer_present": counts_ok and bool(answer.strip()),
        }
        return checks, answer.strip() if counts_ok else ""


def extract_tagged(text: str, tag: str = "answer") -> str | None:
    """Text inside the last `<tag>...</tag>`, for scoring only the answer block."""
    close = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, close) if close >= 0 else -1
    return text[start + len(tag) + 2 : close].strip() if start >= 0 else None
