"""The policy as an OpenAI-compatible chat endpoint on loopback, for environments that reach a model over HTTP.

`create_app(model, tokenizer)` returns a FastAPI app with `POST /v1/chat/completions`
(non-streaming, and streaming as server-sent `chat.completion.chunk` events: a role delta,
content deltas or `tool_calls` deltas, a final chunk with `finish_reason`, with
`stream_options.include_usage` a usage chunk with empty `choices` as OpenAI sends it, then
`data: [DONE]`) and `GET /v1/models`. `feedbackrl serve` (`server.py`) serves it.
Sampling uses the same decode loop as training (`rollout/generate.py`);
`logprobs: true` returns each sampled token's log-probability under the tempered distribution,
the EOS token included (one finite value per completion token). `POST /inference/v1/generate` is
vLLM's token-in/token-out route as the `renderers` client of `verifiers` calls it: `token_ids` and
`sampling_params` in; `choices[0].token_ids`, `choices[0].logprobs.content` (one
``{"token": "token_id:N", "logprob": x}`` per completion token, the stop token included) and
`finish_reason` out.

Messages are rendered with the tokenizer's chat template (`apply_chat_template(..., tools=...)`)
when it has one, else in the minimal transcript format of `envs/multi_turn.py` (assistant turns
ended by EOS, tool results as ``=RESULT\\n``). Tool calls in the request's history are rendered with
their arguments as JSON objects (OpenAI clients send them as JSON strings; chat templates expect
objects, as vLLM's server also converts them). Tool calls in a completion are parsed as episodes parse
them (`envs/turn_format.py`): with a chat template, the tokenizer's response parser when it has one,
else Hermes/Qwen ``<tool_call>`` JSON (several per turn) or Llama 3 JSON; without one, the minimal
``name(arguments)``, returned with arguments ``{"input": "<arguments>"}``. A completion whose tool
call cannot be parsed is returned as plain content with finish_reason "stop", as vLLM does.

Sampling parameters the decode loop does not implement (top_k, min_p, penalties, n > 1, ...) are
refused with HTTP 400 when a request turns them on, never silently ignored.

FastAPI is in the `feedback` extra; this module is a leaf that core code never imports. Requests
are served one at a time (one lock around the model).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import torch
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.envs.multi_turn import Turn
from feedbackrl.envs.tools import ToolCall, parse_tool_call
from feedbackrl.envs.turn_format import parse_chat_turn
from feedbackrl.rollout.generate import generate, generate_ids

# Sampling parameters the decode loop does not implement, with the values that mean "off". A request that
# turns one on is refused (400) rather than sampled without it: its log-probs would not be those of the
# distribution the client asked for, and a trainer would learn from the wrong ratios.
UNSUPPORTED_SAMPLING: dict[str, tuple[Any, ...]] = {
    "top_k": (None, 0, -1), "min_p": (None, 0), "min_tokens": (None, 0), "repetition_penalty": (None, 1),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "n": (None, 1), "best_of": (None, 1),
}


def refuse_unsupported(params: dict[str, Any]) -> None:
    """HTTP 400 when `params` turns on a sampling feature `UNSUPPORTED_SAMPLING` lists."""
    bad = {k: v for k, v in params.items() if k in UNSUPPORTED_SAMPLING and v not in UNSUPPORTED_SAMPLING[k]}
    if bad:
        raise HTTPException(400, f"sampling parameters this endpoint does not implement: {bad} "
                                 "(it samples with temperature and top_p only)")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send many optional fields; unknown ones are ignored

    model: str = "policy"
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stream: bool = False
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None
    seed: int | None = None
    stream_options: StreamOptions | None = None


class StreamOptions(BaseModel):
    """`stream_options`: with `include_usage`, a last chunk (empty `choices`) carries the request's usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


ChatRequest.model_rebuild()


class GenerateRequest(BaseModel):
    """vLLM's token-in/token-out request: prompt token ids and vLLM sampling parameters."""

    model_config = ConfigDict(extra="allow")

    model: str = "policy"
    token_ids: list[int] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)


def render_messages(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> str:
    """The prompt text for `messages`: the chat template when the tokenizer has one, else the minimal format."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([_with_object_arguments(m) for m in messages], tools=tools,
                                             add_generation_prompt=True, tokenize=False)
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            text = content + "".join(f"{c['function']['name']}({_input(c['function'].get('arguments'))})"
                                     for c in calls)
            parts.append(text + tokenizer.eos_token)
        elif m["role"] == "tool":
            parts.append(f"={content}\n")
        else:
            parts.append(str(content))
    return "".join(parts)


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its tool calls' JSON-string arguments as objects (what chat templates render)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for c in calls:
        fn = dict(c.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
            except json.JSONDecodeError as e:
                raise HTTPException(400, f"tool call {fn.get('name')!r} in the messages: arguments are not "
                                         f"valid JSON ({e.msg} at character {e.pos})") from e
        out.append({**c, "function": fn})
    return {**message, "tool_calls": out}


def _input(arguments: str | None) -> str:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments or ""
    return str(value.get("input", "")) if isinstance(value, dict) else str(value)


def _sample(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, req: ChatRequest,
            lock: threading.Lock) -> tuple[list[int], list[float], str, Turn, str]:
    """(token ids, log-probs, text, the parsed turn, finish_reason) of one completion."""
    prompt = render_messages(tokenizer, req.messages, req.tools)
    limit = req.max_completion_tokens or req.max_tokens or 64
    gen = torch.Generator().manual_seed(req.seed if req.seed is not None else time.time_ns() % 2**63)
    with lock:
        ro = generate(model, tokenizer, [prompt], limit, max(req.temperature, 1e-5), req.top_p,
                      greedy=req.temperature == 0.0, generator=gen)
    n = int(ro.completion_mask[0].sum())
    ids, logprobs = ro.completion_ids[0, :n].tolist(), ro.logprobs[0, :n].tolist()
    turn = _parse_turn(tokenizer, ids, ro.texts[0], bool(ro.truncated[0]), prompt, req.tools)
    finish = "tool_calls" if turn.calls and not turn.error else ("length" if bool(ro.truncated[0]) else "stop")
    return ids, logprobs, ro.texts[0], turn, finish


def _parse_turn(tokenizer: PreTrainedTokenizerBase, ids: list[int], text: str, truncated: bool, prompt: str,
                tools: list[dict[str, Any]] | None) -> Turn:
    """The completion's tool calls: as a chat-template episode turn (decoded with its special tokens, the
    closing end token left out) when the tokenizer has a template, else in the minimal format."""
    if not getattr(tokenizer, "chat_template", None):
        call = parse_tool_call(text)
        return Turn(text, (call,)) if isinstance(call, ToolCall) else Turn(text, error=call)
    content = tokenizer.decode(ids if truncated else ids[:-1], skip_special_tokens=False)
    return parse_chat_turn(tokenizer, content, prompt, tools)


def _content(turn: Turn) -> str | None:
    """The text of a tool-calling turn outside its calls (None when there is none, as OpenAI returns)."""
    if turn.text.strip().startswith(("{", "<|python_tag|>")) or "<tool_call>" not in turn.text:
        return None  # a minimal-format or Llama 3 JSON call is the whole turn
    rest = turn.text[: turn.text.index("<tool_call>")].strip()
    return rest or None


def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(turn.calls):
        args = call.arguments if isinstance(call.arguments, dict) else {"input": call.arguments}
        out.append({"index": i, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(args)}})
    return out


def _logprobs(tokenizer: PreTrainedTokenizerBase, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    content = []
    for i, lp in zip(ids, logprobs, strict=True):
        tok = tokenizer.convert_ids_to_tokens(i)
        content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return {"content": content}


def create_app(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_name: str = "policy") -> FastAPI:
    """The FastAPI app serving `model` (see the module docstring)."""
    app, lock = FastAPI(title="feedbackrl policy"), threading.Lock()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        max_len = getattr(model.config, "max_position_embeddings", None)  # vLLM's ModelCard extension
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "feedbackrl",
                                            "max_model_len": max_len}]}

    @app.post("/v1/chat/completions", response_model=None)
    def chat(req: ChatRequest) -> dict[str, Any] | StreamingResponse:
        refuse_unsupported(req.model_extra or {})
        ids, lps, text, turn, finish = _sample(model, tokenizer, req, lock)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        if req.stream:
            return StreamingResponse(_chunks(tokenizer, cid, created, model_name, ids, lps, turn, finish, req),
                                     media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if finish == "tool_calls":
            message = {"role": "assistant", "content": _content(turn), "tool_calls": _tool_calls(turn)}
        choice = {"index": 0, "message": message, "finish_reason": finish,
                  "logprobs": _logprobs(tokenizer, ids, lps) if req.logprobs else None}
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [choice], "usage": _usage(tokenizer, req, ids)}

    @app.post("/inference/v1/generate")
    def generate_tokens(req: GenerateRequest) -> dict[str, Any]:
        return _generate_tokens(model, tokenizer, req, lock)

    return app


def _generate_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, req: GenerateRequest,
                     lock: threading.Lock) -> dict[str, Any]:
    """Token ids in; completion token ids and one finite log-prob per completion token out (the stop token
    included), each entry's token written ``token_id:N`` as vLLM does with `return_tokens_as_token_ids`."""
    sp = req.sampling_params
    refuse_unsupported(sp)
    limit = int(sp.get("max_tokens") or 64)
    temperature, top_p = float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0))
    stops = set(sp.get("stop_token_ids") or []) | {tokenizer.eos_token_id}
    seed = sp.get("seed")
    gen = torch.Generator().manual_seed(int(seed) if seed is not None else time.time_ns() % 2**63)
    ids = torch.tensor([req.token_ids])
    with lock:
        ro = generate_ids(model, tokenizer, ids, torch.ones_like(ids), limit, max(temperature, 1e-5), top_p,
                          greedy=temperature == 0.0, generator=gen)
    n = int(ro.completion_mask[0].sum())
    out, lps = ro.completion_ids[0, :n].tolist(), ro.logprobs[0, :n].tolist()
    cut = next((i + 1 for i, t in enumerate(out) if t in stops), None)  # extra stop ids end it like EOS
    out, lps = (out[:cut], lps[:cut]) if cut else (out, lps)
    finish = "stop" if cut else "length"
    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(out, lps, strict=True)]
    return {"request_id": f"gen-{uuid.uuid4().hex[:16]}", "prompt_token_ids": req.token_ids,
            "choices": [{"index": 0, "token_ids": out, "logprobs": {"content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(req.token_ids), "completion_tokens": len(out),
                      "total_tokens": len(req.token_ids) + len(out)}}


def _usage(tokenizer: PreTrainedTokenizerBase, req: ChatRequest, ids: list[int]) -> dict[str, int]:
    prompt = len(tokenizer(render_messages(tokenizer, req.messages, req.tools), add_special_tokens=False)["input_ids"])
    return {"prompt_tokens": prompt, "completion_tokens": len(ids), "total_tokens": prompt + len(ids)}


def _chunks(tokenizer: PreTrainedTokenizerBase, cid: str, created: int, model_name: str, ids: list[int],
            lps: list[float], turn: Turn, finish: str, req: ChatRequest) -> Iterator[str]:
    """Server-sent events: role delta, content (one chunk per token) or tool_calls deltas, finish_reason, then
    (with `stream_options.include_usage`, as OpenAI does) a chunk with empty `choices` and the usage, every
    chunk before it carrying `"usage": null`; then [DONE]."""
    with_usage = req.stream_options is not None and req.stream_options.include_usage

    def event(delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> str:
        chunk: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                                 "model": model_name, "choices": [{"index": 0, "delta": delta,
                                                                   "finish_reason": finish_reason,
                                                                   "logprobs": logprobs}]}
        if with_usage:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk)}\n\n"

    yield event({"role": "assistant", "content": ""})
    if finish == "tool_calls":
        if _content(turn):
            yield event({"content": _content(turn)})
        for call in _tool_calls(turn):  # each call: its id and name, then its arguments
            yield event({"tool_calls": [{**call, "function": {"name": call["function"]["name"], "arguments": ""}}]})
            args = call["function"]["arguments"]
            yield event({"tool_calls": [{"index": call["index"], "function": {"arguments": args}}]})
    else:
        for i, lp in zip(ids, lps, strict=True):
            piece = tokenizer.decode([i], skip_special_tokens=True)  # EOS (and a sampled pad) add no text
            yield event({"content": piece}, logprobs=_logprobs(tokenizer, [i], [lp]) if req.logprobs else None)
    yield event({}, finish)
    if with_usage:
        last = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_name, "choices": [],
                "usage": _usage(tokenizer, req, ids)}
        yield f"data: {json.dumps(last)}\n\n"
    yield "data: [DONE]\n\n"
