"""Multi-turn tasks: an episode is a conversation between the policy and an environment.

An `EpisodicTask` is a `Task` whose problems are played as episodes. For each problem it makes an
`Env`: `reset()` returns the first messages (the prompt), `step(turn)` takes the policy's
assistant turn (a tool call, a move or a final answer) and returns a `StepResult`: the messages the
environment answers with (tool results, feedback), whether the episode is over, the `Verdict` for
the whole trajectory when it is, and an optional per-turn reward (a process reward).

The episode runner (`episodes/multi_turn.py`) decodes the turns of all active episodes together,
enforces the `EpisodeLimits` (turns, total tokens, tokens per turn; tools enforce their own time
limit) and records how each episode ended (`END_KINDS`). An episode's "completion" is every token
after the first prompt: the policy's turns interleaved with the environment's messages, with the
loss mask on the policy's own tokens only.

How an episode becomes text and tokens is the model's `TurnFormat` (`envs/turn_format.py`):
the minimal format for tokenizers without a chat template (the tiny model: the prompt is the first
user message's text, each assistant turn ends with EOS, environment messages follow as plain text,
`render_plain`, and tool calls are ``name(arguments)``, see `envs/tools.py`), the model's own chat
template otherwise (messages rendered with `apply_chat_template(..., tools=...)`, tool calls in the
template's syntax). The runner parses each turn with the format into a `Turn` (its text and any tool
calls) and hands that to `Env.step`, so an environment never depends on the model's syntax.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from feedbackrl.envs.base import Task
from feedbackrl.envs.tools import ToolCall
from feedbackrl.rewards.verdict import Problem, Verdict

Message = dict[str, Any]  # {"role": "user" | "assistant" | "tool", "content": str, ...}; JSON-serialisable

END_ANSWERED = "answered"  # the environment ended the episode (a final answer, a solved game)
END_TRUNCATED = "truncated"  # the episode ran out of tokens (EpisodeLimits.max_tokens)
END_OUT_OF_TURNS = "out_of_turns"  # EpisodeLimits.max_turns turns without an end
END_ERROR = "error"  # the environment itself raised; the episode scores 0 and the run goes on
END_KINDS = (END_ANSWERED, END_TRUNCATED, END_OUT_OF_TURNS, END_ERROR)


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits the runner enforces (tools enforce `tool_timeout_s` per call)."""

    max_turns: int = 4  # assistant turns
    turn_tokens: int = 16  # tokens per assistant turn
    max_tokens: int = 64  # completion tokens in all: the policy's turns and the environment's messages
    tool_timeout_s: float = 5.0  # wall-clock seconds per tool call

    def __post_init__(self) -> None:
        for name in ("max_turns", "turn_tokens", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"episode limit {name} must be >= 1, got {getattr(self, name)}")
        if not self.tool_timeout_s > 0:
            raise ValueError(f"episode limit tool_timeout_s must be > 0, got {self.tool_timeout_s}")


TURN_FORMATS = ("auto", "minimal", "chat_template")  # EpisodicTask.turn_format: "auto" = chat template if any


@dataclass(frozen=True)
class Turn:
    """One assistant turn as the environment receives it, parsed by the model's `TurnFormat`."""

    text: str  # what the policy wrote (decoded; a closing end token left out), tool-call syntax included
    calls: tuple[ToolCall, ...] = ()  # the tool calls in it, in order
    error: str | None = None  # why a tool call in it could not be parsed (malformed JSON, unclosed call)


@dataclass
class StepResult:
    """What the environment answers to one assistant turn."""

    observation: list[Message]  # messages appended after the turn (empty when the episode ends)
    done: bool
    verdict: Verdict | None = None  # the trajectory's verdict; required when done
    reward: float = 0.0  # per-turn (process) reward for this turn; 0 for environments without one
    tool_calls: int = 0  # tool calls made in this turn
    tool_errors: int = 0  # of which failed (malformed, unknown tool, raised, timed out)

    def __post_init__(self) -> None:
        if self.done and self.verdict is None:
            raise ValueError("StepResult(done=True) needs the trajectory's verdict")


class Env(Protocol):
    """One episode's environment (state lives here, one instance per episode)."""

    def reset(self) -> list[Message]:
        """The first messages: the prompt the policy answers."""
        ...

    def step(self, turn: Turn) -> StepResult:
        """Answer the policy's assistant turn (its text and parsed tool calls). Never raises on malformed turns."""
        ...

    def close(self) -> None:
        """Release what the episode holds (tool processes, sandboxes)."""
        ...


@runtime_checkable
class EpisodicTask(Task, Protocol):
    """A task played as episodes. `verify` judges a bare final answer (one turn, no tools)."""

    kind: str = "episodic"  # its episodes are played by `episodes/multi_turn.py`
    limits: EpisodeLimits
    tool_call_penalty: float  # subtracted from the trajectory reward per tool call
    turn_penalty: float  # subtracted per assistant turn
    turn_credit: float  # weight of per-turn credit from per-turn rewards (0 = trajectory-level only)
    turn_format: str = "auto"  # one of TURN_FORMATS: "minimal", "chat_template", or "auto" (by the tokenizer)

    def make_env(self, problem: Problem) -> Env:
        """A fresh environment for one episode of `problem`."""
        ...

    def render(self, messages: Sequence[Message]) -> str:
        """The minimal format's text for the environment's messages after a turn (the prompt is the
        first messages' contents joined, which the first turn continues directly). Chat templates
        render messages themselves."""
        return render_plain(messages)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools episodes may call, as `apply_chat_template(..., tools=...)` takes them (`ToolSpec.schema`)."""
        return []


def render_plain(messages: Sequence[Message]) -> str:
    """The minimal transcript format for models without a chat template (see the module docstring)."""
    parts = []
    for m in messages:
        role, content = m["role"], str(m["content"])
        if role == "tool":
            parts.append(f"={content}\n")
        else:
            parts.append(f"{content}\n")
    return "".join(parts)


@dataclass
class EpisodeRecord:
    """One episode's transcript and outcome, as written to `episodes.jsonl`."""

    prompt: str
    messages: list[Message] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # one per assistant turn
    tool_calls: int = 0
    tool_errors: int = 0
    end: str = ""
    verdict: Verdict | None = None
    reward: float = 0.0  # the trajectory reward trained on: verdict score minus penalties
    parse_errors: int = 0  # turns the turn format read as a malformed tool call (`Turn.error`)

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "messages": self.messages, "turn_rewards": self.turn_rewards,
                "turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "parse_errors": self.parse_errors, "end": self.end,
                "verdict": self.verdict.to_dict() if self.verdict else None, "reward": self.reward}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRecord:
        v = d["verdict"]
        return cls(d["prompt"], d["messages"], d["turn_rewards"], d["tool_calls"], d["tool_errors"], d["end"],
                   Verdict(v["score"], v["passed"], v["reason"], v["details"]) if v else None, d["reward"],
                   d.get("parse_errors", 0))


def episode_stats(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Success rate, turns, tool calls and malformed calls per episode, tool error rate, and the share of each end
    kind. A malformed call (one the turn format cannot parse) counts as a call and as a tool error too.

    Keys are metric names (`episode/...`) for the per-step log line and the eval report.
    """
    n = max(len(records), 1)
    calls = sum(r.tool_calls for r in records)
    wins = [r for r in records if r.verdict is not None and r.verdict.passed]
    out = {
        "episode/success_rate": len(wins) / n,
        "episode/turns_mean": sum(r.turns for r in records) / n,
        "episode/turns_per_success": sum(r.turns for r in wins) / len(wins) if wins else float("nan"),
        "episode/tool_calls_mean": calls / n,
        "episode/tool_error_rate": sum(r.tool_errors for r in records) / calls if calls else 0.0,
        "episode/parse_errors_mean": sum(r.parse_errors for r in records) / n,
    }
    out.update({f"episode/end/{k}": sum(r.end == k for r in records) / n for k in END_KINDS})
    return out


def demo_conversation(turns: Sequence[str | Message], observations: Sequence[Sequence[Message]]) -> list[Message]:
    """A demonstration for SFT: the conversation after the prompt, assistant turns (a string is a plain
    answer) with the environment's messages between them. SFT encodes it as episodes are encoded, and
    trains on the assistant turns only.
    """
    if len(observations) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} observations between them, got {len(observations)}")
    out: list[Message] = []
    for i, turn in enumerate(turns):
        out.append({"role": "assistant", "content": turn} if isinstance(turn, str) else dict(turn))
        if i < len(observations):
            out.extend(observations[i])
    return out


def sample_heldout(rng: random.Random, n: int, draw: Any, is_heldout: Any) -> list[Problem]:
    """`n` distinct problems `draw(rng)` for which `is_heldout(problem)` holds, in a fixed order."""
    out: list[Problem] = []
    seen: set[str] = set()
    for _ in range(200 * n + 1000):
        p = draw(rng)
        if is_heldout(p) and p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
            if len(out) == n:
                return out
    raise ValueError(f"could not find {n} distinct held-out problems (found {len(out)})")
