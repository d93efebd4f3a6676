"""A scripted judge behind a real OpenAI-compatible chat endpoint, served on loopback.

`chat_app(reply)` is a FastAPI app answering `POST /v1/chat/completions` with `reply(messages)`
in the OpenAI response shape (choices, usage), so the `openai` client and `rewards.judge` talk to
it exactly as to vLLM or a hosted API. `rule_judge` is a reply function that grades with a Python
rule and can be made imperfect on purpose (random answers, a position bias, malformed output):
tests and the judge-quality command use it where no judge model is available.
Serve with `feedback.server.LiveServer(chat_app(...))`.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

Reply = Callable[[list[dict[str, str]]], str]


class ChatRequest(BaseModel):
    model: str
    messages: list[dict[str, Any]]
    temperature: float | None = None
    max_tokens: int | None = None


def chat_app(reply: Reply, delay_s: float = 0.0) -> FastAPI:
    """An app whose chat completions are `reply(messages)`; `delay_s` slows every answer (timeout tests)."""
    app = FastAPI()
    app.state.requests = []

    @app.post("/v1/chat/completions")
    def complete(req: ChatRequest) -> dict[str, Any]:
        app.state.requests.append(req.messages)
        if delay_s:
            time.sleep(delay_s)
        text = reply(req.messages)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in req.messages)
        return {"id": f"chatcmpl-{len(app.state.requests)}", "object": "chat.completion", "created": 0,
                "model": req.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split()),
                          "total_tokens": prompt_tokens + len(text.split())}}

    return app


def tag(text: str, name: str) -> str | None:
    """The content of <name>...</name> in a judge prompt (as `rewards.judge` writes them), or None."""
    m = re.search(rf"<{name}>\n(.*?)\n</{name}>", text, flags=re.DOTALL)
    return m.group(1) if m else None


@dataclass
class RuleJudge:
    """Grades with `gold(task, response) -> [0, 1]`, mapped onto the rubric's integer scale.

    Imperfections, each with its own probability: `noise` answers at random, `position_bias` says
    "A" in a comparison regardless, `malformed` answers with prose instead of JSON.
    """

    gold: Callable[[str, str], float]
    criteria: tuple[str, ...] = ("quality",)
    low: int = 1
    high: int = 10
    noise: float = 0.0
    position_bias: float = 0.0
    malformed: float = 0.0
    seed: int = 0
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def __call__(self, messages: list[dict[str, str]]) -> str:
        user = str(messages[-1]["content"]) if messages[-1]["role"] == "user" else ""
        prompt = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
        task = tag(prompt, "task") or ""
        if self._draw() < self.malformed and "could not be parsed" not in user:
            return "I think this response is quite good, maybe an 8."
        if tag(prompt, "response_a") is not None:
            return self._compare(task, tag(prompt, "response_a") or "", tag(prompt, "response_b") or "")
        g = self.gold(task, tag(prompt, "response") or "")
        if self._draw() < self.noise:
            g = self._draw()
        score = self.low + round(g * (self.high - self.low))
        return json.dumps({"rationale": f"gold-rule grade {g:.2f}", "scores": {c: score for c in self.criteria}})

    def _compare(self, task: str, a: str, b: str) -> str:
        if self._draw() < self.position_bias:
            return json.dumps({"rationale": "the first one reads better", "winner": "A"})
        ga, gb = self.gold(task, a), self.gold(task, b)
        if self._draw() < self.noise:
            ga, gb = self._draw(), self._draw()
        winner = "A" if ga > gb else "B" if gb > ga else "tie"
        return json.dumps({"rationale": f"gold-rule grades {ga:.2f} vs {gb:.2f}", "winner": winner})
