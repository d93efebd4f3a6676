"""The policy behind an OpenAI-compatible endpoint: the official `openai` client reads its
non-streaming and streaming answers; the raw server-sent events end with finish_reason and
[DONE]; log-probs are one finite value per completion token (EOS included) and equal the
training forward's; tool calls stream as tool_calls deltas."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch
from fp32 import assert_logprobs_within_fp32

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs  # noqa: E402
from feedbackrl.models.tiny import build_model  # noqa: E402
from feedbackrl.rollout.generate import Rollout  # noqa: E402
from feedbackrl.serve import openai_api  # noqa: E402
from feedbackrl.serve.openai_api import create_app, render_messages  # noqa: E402

MESSAGES = [{"role": "user", "content": "12+30="}]


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(tokenizer, "tiny", seed=0)


def _events(client: TestClient, body: dict) -> list[str]:
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]


def test_logprobs_are_one_finite_value_per_token_and_match_training(model, tokenizer) -> None:
    client = TestClient(create_app(model, tokenizer))
    body = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 12, "logprobs": True,
                                                     "seed": 3}).json()
    choice = body["choices"][0]
    lps = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert len(lps) == body["usage"]["completion_tokens"] and all(math.isfinite(x) and x <= 0 for x in lps)
    ids = tokenizer.convert_tokens_to_ids([t["token"] for t in choice["logprobs"]["content"]])
    if choice["finish_reason"] == "stop":
        assert ids[-1] == tokenizer.eos_token_id  # the stop token has its log-prob too
    p_ids, p_mask = encode_prompts(tokenizer, ["12+30="])
    c_ids = torch.tensor([ids])
    ref, _ = sequence_logprobs(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids))
    # served (JSON round trip: float32 -> float -> float32 is exact) and training forward, each within float32
    # rounding of a float64 run of the same tokens
    assert_logprobs_within_fp32(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids),
                                {"served": torch.tensor([lps]), "training forward": ref})


def test_stream_ends_with_finish_reason_then_done_and_matches_the_non_streaming_text(model, tokenizer) -> None:
    client = TestClient(create_app(model, tokenizer))
    req = {"messages": MESSAGES, "max_tokens": 10, "seed": 5}
    whole = client.post("/v1/chat/completions", json=req).json()["choices"][0]
    events = _events(client, {**req, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == whole["message"]["content"]  # same seed, same sample


def test_openai_client_reads_both_modes(model, tokenizer) -> None:
    openai = pytest.importorskip("openai")
    app = create_app(model, tokenizer)

    async def run() -> tuple[str, str]:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://policy")
        client = openai.AsyncOpenAI(base_url="http://policy/v1", api_key="local", http_client=http)
        full = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=1)
        stream = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=1,
                                                      stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream]
        await http.aclose()
        return full.choices[0].message.content, "".join(parts)

    full, streamed = asyncio.run(run())
    assert full == streamed


def test_tool_calls_stream_as_deltas(model, tokenizer, monkeypatch) -> None:
    text = "calc(12+30)"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def scripted(model, tokenizer, prompts, max_new_tokens, *args, **kwargs) -> Rollout:
        c = torch.tensor([ids])
        return Rollout(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long), c,
                       torch.ones_like(c), torch.full(c.shape, -0.5), [text], torch.tensor([False]))

    monkeypatch.setattr(openai_api, "generate", scripted)
    client = TestClient(create_app(model, tokenizer))
    msg = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] is None
    call = msg["message"]["tool_calls"][0]
    assert call["function"] == {"name": "calc", "arguments": json.dumps({"input": "12+30"})}
    chunks = [json.loads(e) for e in _events(client, {"messages": MESSAGES, "stream": True})[:-1]]
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert deltas[0]["function"]["name"] == "calc" and deltas[0]["id"].startswith("call_")
    assert "".join(d["function"]["arguments"] for d in deltas) == json.dumps({"input": "12+30"})
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_tool_round_trip_renders_like_an_episode(tokenizer) -> None:
    msgs = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"input": "12+30"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    assert render_messages(tokenizer, msgs, None) == "12+30=calc(12+30)<eos>=42\n"


def test_token_in_token_out_generate(model, tokenizer) -> None:
    client = TestClient(create_app(model, tokenizer))
    prompt = tokenizer("12+30=", add_special_tokens=False)["input_ids"]
    body = client.post("/inference/v1/generate", json={
        "model": "policy", "token_ids": prompt,
        "sampling_params": {"max_tokens": 12, "temperature": 1.0, "logprobs": 1, "seed": 7,
                            "stop_token_ids": [tokenizer.eos_token_id], "skip_special_tokens": False}}).json()
    choice = body["choices"][0]
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert body["prompt_token_ids"] == prompt and 1 <= len(ids) <= 12 and len(content) == len(ids)
    assert [c["token"] for c in content] == [f"token_id:{i}" for i in ids]
    assert all(math.isfinite(c["logprob"]) and c["logprob"] <= 0 for c in content)
    assert choice["finish_reason"] == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
    p_ids = torch.tensor([prompt])
    c_ids = torch.tensor([ids])
    ref, _ = sequence_logprobs(model, p_ids, torch.ones_like(p_ids), c_ids, torch.ones_like(c_ids))
    assert_logprobs_within_fp32(model, p_ids, torch.ones_like(p_ids), c_ids, torch.ones_like(c_ids),
                                {"served": torch.tensor([[c["logprob"] for c in content]]), "training forward": ref})
    # an extra stop id ends the completion at its first occurrence, itself included
    stop = ids[0]
    again = client.post("/inference/v1/generate", json={"token_ids": prompt, "sampling_params": {
        "max_tokens": 12, "seed": 7, "stop_token_ids": [stop]}}).json()["choices"][0]
    assert again["token_ids"] == [stop] and again["finish_reason"] == "stop"
    assert client.post("/inference/v1/generate", json={"token_ids": []}).status_code == 422
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == 512


def test_sampling_it_cannot_honour_is_refused_not_ignored(model, tokenizer) -> None:
    client = TestClient(create_app(model, tokenizer))
    prompt = tokenizer("12+30=", add_special_tokens=False)["input_ids"]
    r = client.post("/inference/v1/generate", json={"token_ids": prompt, "sampling_params": {"top_k": 5}})
    assert r.status_code == 400 and "top_k" in r.json()["detail"]
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 2, "stream": True})
    assert r.status_code == 400 and "'n': 2" in r.json()["detail"]
    # the values that mean "off" (as vLLM clients send them) are accepted
    off = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "n": 1, "max_tokens": 3, "seed": 1}
    assert client.post("/inference/v1/generate", json={"token_ids": prompt, "sampling_params": off}).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": MESSAGES, **off}).status_code == 200


# --- chat-template models: tool calls parsed as episodes parse them ----------------------------------------------

CALC_TOOL = {"type": "function", "function": {"name": "calc", "description": "evaluate arithmetic", "parameters": {
    "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}}


def _scripted_client(monkeypatch, tokenizer, text: str, truncated: bool = False) -> TestClient:
    """An app over a chat-template tokenizer whose policy writes `text` (then its end token unless cut off)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([] if truncated else [tokenizer.eos_token_id])

    def scripted(model, tokenizer_, prompts, max_new_tokens, *args, **kwargs) -> Rollout:
        c = torch.tensor([ids])
        shown = tokenizer.decode(ids, skip_special_tokens=True)
        return Rollout(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long), c,
                       torch.ones_like(c), torch.full(c.shape, -0.5), [shown], torch.tensor([truncated]))

    monkeypatch.setattr(openai_api, "generate", scripted)
    return TestClient(create_app(build_model(tokenizer, "tiny", seed=0), tokenizer))


def test_hermes_tool_calls_from_a_chat_template_model(tool_chat_tokenizer, monkeypatch) -> None:
    text = ('Let me compute both.\n<tool_call>\n{"name": "calc", "arguments": {"input": "12+30"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calc", "arguments": {"input": "7*6"}}\n</tool_call>')
    client = _scripted_client(monkeypatch, tool_chat_tokenizer, text)
    req = {"messages": MESSAGES, "tools": [CALC_TOOL]}
    choice = client.post("/v1/chat/completions", json=req).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me compute both."
    calls = choice["message"]["tool_calls"]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "calc", {"input": "12+30"}), (1, "calc", {"input": "7*6"})]
    assert len({c["id"] for c in calls}) == 2
    chunks = [json.loads(e) for e in _events(client, {**req, "stream": True})[:-1]]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    args: dict[int, str] = {}
    for d in deltas:
        args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    assert {i: json.loads(a) for i, a in args.items()} == {0: {"input": "12+30"}, 1: {"input": "7*6"}}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Let me compute both."
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_llama3_json_call_is_the_whole_turn(tool_chat_tokenizer, monkeypatch) -> None:
    client = _scripted_client(monkeypatch, tool_chat_tokenizer, '{"name": "calc", "parameters": {"input": "2+2"}}')
    choice = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"input": "2+2"}


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "calc", "arguments": {"input": "1+1"}\n</tool_call>',  # JSON missing its brace
    '<tool_call>\n{"name": "calc", "arguments": {"input": "1+1"}}',  # no closing tag
    '<tool_call>\n{"arguments": {"input": "1+1"}}\n</tool_call>',  # no name
])
def test_a_malformed_call_comes_back_as_text_not_as_a_call(tool_chat_tokenizer, monkeypatch, text) -> None:
    client = _scripted_client(monkeypatch, tool_chat_tokenizer, text)
    choice = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == text


def test_a_call_cut_off_by_max_tokens_is_length_not_a_call(tool_chat_tokenizer, monkeypatch) -> None:
    client = _scripted_client(monkeypatch, tool_chat_tokenizer, '<tool_call>\n{"name": "calc", "argu', truncated=True)
    choice = client.post("/v1/chat/completions", json={"messages": MESSAGES}).json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]


def test_history_tool_calls_render_with_object_arguments(tool_chat_tokenizer) -> None:
    """OpenAI clients send a call's arguments as a JSON string; the template must see the object, or it
    would render the string escaped (a transcript the model never wrote)."""
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"input": "12+30"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    text = render_messages(tool_chat_tokenizer, history, [CALC_TOOL])
    assert '{"name": "calc", "arguments": {"input": "12+30"}}' in text
    bad = [*history[:1], {**history[1], "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"input": '}}]}]
    client = TestClient(create_app(build_model(tool_chat_tokenizer, "tiny", seed=0), tool_chat_tokenizer))
    r = client.post("/v1/chat/completions", json={"messages": bad})
    assert r.status_code == 400 and "calc" in r.json()["detail"] and "not valid JSON" in r.json()["detail"]


def _openai_client(app):
    openai = pytest.importorskip("openai")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://policy")
    return openai.AsyncOpenAI(base_url="http://policy/v1", api_key="local", http_client=http), http


def test_usage_chunk_when_the_client_asks_for_it(model, tokenizer) -> None:
    app = create_app(model, tokenizer)

    async def run() -> tuple[list, object]:
        client, http = _openai_client(app)
        full = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=2)
        stream = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=2,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        await http.aclose()
        return chunks, full

    chunks, full = asyncio.run(run())
    *body, last = chunks
    assert last.choices == [] and last.usage is not None and all(c.usage is None for c in body)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens)
    assert last.usage.prompt_tokens == len("12+30=")  # one token per character, no special tokens added
    assert "".join(c.choices[0].delta.content or "" for c in body) == full.choices[0].message.content
    # without the option there is no usage chunk and no usage key
    events = _events(TestClient(app), {"messages": MESSAGES, "max_tokens": 4, "stream": True})
    assert all("usage" not in json.loads(e) for e in events[:-1])
    bad = TestClient(app).post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True,
                                                              "stream_options": {"include_usage": "often"}})
    assert bad.status_code == 422


def test_the_openai_client_reads_tool_calls_streamed_and_not(model, tokenizer, monkeypatch) -> None:
    text = "calc(12+30)"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def scripted(model, tokenizer, prompts, max_new_tokens, *args, **kwargs) -> Rollout:
        c = torch.tensor([ids])
        return Rollout(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long), c,
                       torch.ones_like(c), torch.full(c.shape, -0.5), [text], torch.tensor([False]))

    monkeypatch.setattr(openai_api, "generate", scripted)
    app = create_app(model, tokenizer)
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]

    async def run() -> tuple[object, list]:
        client, http = _openai_client(app)
        full = await client.chat.completions.create(model="policy", messages=MESSAGES, tools=tools)
        stream = await client.chat.completions.create(model="policy", messages=MESSAGES, tools=tools, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        await http.aclose()
        return full, chunks

    full, chunks = asyncio.run(run())
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("calc", {"input": "12+30"})
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "calc" and deltas[0].id.startswith("call_")
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"input": "12+30"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == len(ids)
