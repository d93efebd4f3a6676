"""How an episode becomes text for a given model, and how the model's turns become tool calls.

`turn_format(tokenizer, task)` picks one of two formats by the task's `turn_format` option: "auto"
(the default) takes the chat template when the tokenizer has one and the minimal format otherwise;
"minimal" or "chat_template" force one. The episode runner and SFT on episodic demonstrations use
the same format, so SFT trains on exactly the tokens episodes are made of.

`MinimalFormat` (the tiny model, no chat template): the prompt is the first messages' text, an
assistant turn is its decoded text (EOS dropped), the environment's messages follow as the task's
`render` writes them (``=RESULT\\n`` for a tool result), and a tool call is a turn that is exactly
``name(arguments)`` (`envs/tools.py`).

`ChatTemplateFormat`: the tokenizer's own chat template renders the conversation, with
`tools=task.tool_schemas()`. The prompt is the template applied to the first messages with the
generation prompt (P_0). After turn k with text c_k, the environment's reply is the difference
P_{k+1}[len(P_k + c_k):], where P_{k+1} is the template applied to the whole conversation (the turn
as an assistant message with content c_k, then the environment's messages, then the generation
prompt); the end token the turn closed with is dropped from its front. So the tokens of a whole
episode are the template's own rendering of the final conversation, provided P_{k+1} starts with
P_k + c_k (the prefix property). Templates without it (ones that rewrite earlier turns, such as
dropping earlier reasoning, or normalise content, such as trimming it) raise `TurnFormatError`
naming the model: when the format is built (on a probe conversation) and on any turn that exposes it.

Tool calls in chat-template turns: when the tokenizer carries a `response_template` (transformers
>= 5.13), `tokenizer.parse_response` parses the turn. Otherwise `parse_json_tool_calls` reads the two
common syntaxes (written here because without a response template transformers has no parser to
fall back on): Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several per
turn allowed), and Llama 3 JSON, a turn that is one JSON object ``{"name": ..., "parameters": {...}}``
(after an optional ``<|python_tag|>``). A call that cannot be parsed becomes `Turn.error`, which the
environment answers with an error observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase

from feedbackrl.envs.multi_turn import TURN_FORMATS, EpisodicTask, Message, Turn
from feedbackrl.envs.tools import ToolCall, parse_tool_call
from feedbackrl.models.chat import ChatTemplateError, end_of_turn, has_chat_template


class TurnFormatError(ValueError):
    """The model's chat template cannot render episodes token-exactly (or cannot render a demonstration)."""


class TurnFormat(Protocol):
    """How one model reads and writes episodes (see the module docstring)."""

    name: str  # "minimal" or "chat_template"
    end: str  # the text that closes an assistant turn (EOS, or the template's end of turn)

    def prompt(self, messages: Sequence[Message]) -> str:
        """The text the policy answers first: the first messages (and the generation prompt)."""
        ...

    def content(self, ids: Sequence[int]) -> str:
        """An assistant turn's text from its sampled ids, the closing end token left out."""
        ...

    def parse(self, content: str, conversation: Sequence[Message]) -> Turn:
        """The turn with its tool calls; `conversation` is every message before it."""
        ...

    def reply(self, conversation: Sequence[Message], new: Sequence[Message], end: str) -> str:
        """The text after the policy's turn: the environment's `new` messages and the next turn's opening.
        `conversation` ends with the turn (content as written); `end` is the end token's text the turn
        closed with ("" if it was cut off)."""
        ...

    def write(self, conversation: Sequence[Message], message: Message) -> str:
        """A demonstration's assistant message (content, tool_calls) as the text the policy writes."""
        ...


def turn_format(tokenizer: PreTrainedTokenizerBase, task: EpisodicTask) -> TurnFormat:
    """The format of `task`'s episodes for this tokenizer (task option `turn_format`)."""
    mode = task.turn_format
    if mode not in TURN_FORMATS:
        raise ValueError(f"task option turn_format must be one of {list(TURN_FORMATS)}, got {mode!r}")
    if mode == "minimal" or (mode == "auto" and not has_chat_template(tokenizer)):
        return MinimalFormat(tokenizer, task.render)
    if not has_chat_template(tokenizer):
        raise ChatTemplateError(f"task option turn_format = 'chat_template' but the tokenizer of {_model(tokenizer)} "
                                "has no chat template; use 'minimal' or 'auto'")
    return ChatTemplateFormat(tokenizer, task.tool_schemas())


def _model(tokenizer: PreTrainedTokenizerBase) -> str:
    return repr(tokenizer.name_or_path) if tokenizer.name_or_path else "an unnamed tokenizer"


class MinimalFormat:
    """The tiny model's format: plain text, EOS after each turn, tool calls as ``name(arguments)``."""

    name = "minimal"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, render: Callable[[Sequence[Message]], str]) -> None:
        self.tokenizer, self.render = tokenizer, render
        self.end = str(tokenizer.eos_token)

    def prompt(self, messages: Sequence[Message]) -> str:
        return "".join(str(m["content"]) for m in messages)

    def content(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def parse(self, content: str, conversation: Sequence[Message]) -> Turn:
        call = parse_tool_call(content)
        if isinstance(call, ToolCall):
            return Turn(content, (call,))
        return Turn(content, error=call) if isinstance(call, str) else Turn(content)

    def reply(self, conversation: Sequence[Message], new: Sequence[Message], end: str) -> str:
        return self.render(new)

    def write(self, conversation: Sequence[Message], message: Message) -> str:
        text = str(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            args = fn["arguments"]
            if isinstance(args, dict):
                if len(args) != 1:
                    raise ValueError(f"the minimal format writes a call with one string argument, got {args!r}")
                (args,) = args.values()
            text += f"{fn['name']}({args})"
        return text


class ChatTemplateFormat:
    """The tokenizer's chat template, with the task's tools (see the module docstring)."""

    name = "chat_template"
    _PROBE: tuple[tuple[str, list[Message]], ...] = (  # leading/trailing spaces catch templates that trim content
        (" probe answer \n", [{"role": "tool", "content": "probe result"}]),
        ("probe move", [{"role": "user", "content": "probe feedback"}]),
    )

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[dict[str, Any]] = ()) -> None:
        self.tokenizer, self.tools = tokenizer, list(tools) or None
        self.end = end_of_turn(tokenizer)
        # a template that renders no tools (SmolLM2's) gets them from us: a system prompt in Hermes syntax
        self.tool_prompt = hermes_tool_prompt(self.tools) if self.tools and not renders_tools(tokenizer,
                                                                                              self.tools) else None
        conversation: list[Message] = [{"role": "user", "content": "probe question"}]
        for content, new in self._PROBE:  # refuse a template without the prefix property before any episode
            conversation.append({"role": "assistant", "content": content})
            self.reply(conversation, new, self.end)
            conversation.extend(new)

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        messages = list(messages)
        if self.tool_prompt is not None:
            messages = [*_with_system(messages, self.tool_prompt)]
            messages = [_hermes_message(m) for m in messages]
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def prompt(self, messages: Sequence[Message]) -> str:
        return self.render(messages, True)

    def content(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def parse(self, content: str, conversation: Sequence[Message]) -> Turn:
        if not getattr(self.tokenizer, "response_template", None):  # no prompt to render for the JSON syntaxes
            return parse_json_tool_calls(content)
        return parse_chat_turn(self.tokenizer, content, self.render(conversation, True), self.tools)

    def reply(self, conversation: Sequence[Message], new: Sequence[Message], end: str) -> str:
        before = self.render(conversation[:-1], True) + str(conversation[-1]["content"])
        after = self.render([*conversation, *new], True)
        if not after.startswith(before):
            raise TurnFormatError(self._not_prefix(before, after))
        tail = after[len(before):]
        return tail[len(end):] if end and tail.startswith(end) else tail

    def write(self, conversation: Sequence[Message], message: Message) -> str:
        before = self.render(conversation, True)
        after = self.render([*conversation, message], False)
        if not after.startswith(before):
            raise TurnFormatError(self._not_prefix(before, after))
        rest = after[len(before):]
        if self.end not in rest:
            raise TurnFormatError(f"the chat template of {_model(self.tokenizer)} does not close an assistant "
                                  f"message with {self.end!r}: {rest[-80:]!r}")
        text = rest[: rest.rindex(self.end)]
        missing = [c["function"]["name"] for c in message.get("tool_calls") or [] if c["function"]["name"] not in text]
        if missing:
            raise TurnFormatError(f"the chat template of {_model(self.tokenizer)} does not render tool calls "
                                  f"({missing} missing from {text!r}); demonstrations with tool calls need a "
                                  "template that writes them")
        return text

    def _not_prefix(self, before: str, after: str) -> str:
        i = next((j for j, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before),
                                                                                             len(after)))
        return (f"the chat template of {_model(self.tokenizer)} is not prefix-stable: re-rendering the conversation "
                f"after a turn changes text the policy has already seen or written (first difference at character "
                f"{i}: so far {before[max(0, i - 40): i + 40]!r}, re-rendered {after[max(0, i - 40): i + 40]!r}), so "
                "an episode cannot continue from its tokens. Templates that rewrite earlier turns (drop earlier "
                "reasoning) or normalise content (trim it) cannot play episodes; set the task option "
                "turn_format = 'minimal' or use a template without that")


HERMES_TOOL_PROMPT = (  # the wording of Qwen2.5's and Hermes 2 Pro's tool prompts
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def hermes_tool_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The system text that describes `tools` (OpenAI function schemas) and the Hermes call syntax."""
    return HERMES_TOOL_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def renders_tools(tokenizer: PreTrainedTokenizerBase, tools: Sequence[dict[str, Any]]) -> bool:
    """Whether the chat template puts the tools into the prompt (SmolLM2's, like many, ignores them)."""
    probe: list[Message] = [{"role": "user", "content": "probe"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=list(tools), tokenize=False, add_generation_prompt=True)
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)


def _with_system(messages: list[Message], text: str) -> list[Message]:
    """The conversation with `text` ending its system message (one is added first where there is none)."""
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _hermes_message(message: Message) -> Message:
    """An assistant message's tool calls written into its content as Hermes blocks, for a template that renders
    content only; the same text `parse_json_tool_calls` reads back."""
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not calls:
        return message
    blocks = "".join(
        "\n<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"])},
                                       ensure_ascii=False) + "\n</tool_call>" for c in calls)
    content = str(message.get("content") or "")
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": (content + blocks).lstrip("\n")}


def _arguments(fn: dict[str, Any]) -> Any:
    args = fn.get("arguments", {})
    return json.loads(args) if isinstance(args, str) else args


def parse_chat_turn(tokenizer: PreTrainedTokenizerBase, content: str, prompt: str,
                    tools: Sequence[dict[str, Any]] | None = None) -> Turn:
    """The tool calls in `content`, a turn a chat model wrote after `prompt` (the rendered conversation with
    the generation prompt): the tokenizer's response parser when it has one, else `parse_json_tool_calls`."""
    if not getattr(tokenizer, "response_template", None):
        return parse_json_tool_calls(content)
    try:
        message = tokenizer.parse_response(content, prefix=prompt, tools=list(tools) if tools else None)
    except (ValueError, KeyError, TypeError) as e:  # the parser raises on a region it cannot parse
        return Turn(content, error=f"malformed tool call: {str(e).splitlines()[0][:120]}")
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else None
        parsed = _call_from(fn, ("arguments", "parameters"))
        if isinstance(parsed, str):
            return Turn(content, error=parsed)
        calls.append(parsed)
    return Turn(content, tuple(calls))


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_LLAMA_CALL = re.compile(r'\{\s*"name"\s*:')


def parse_json_tool_calls(text: str) -> Turn:
    """Hermes/Qwen ``<tool_call>{"name", "arguments"}</tool_call>`` blocks, or a Llama 3 JSON call (the whole
    turn one object with "name" and "parameters"); either key is accepted for the arguments in both."""
    if "<tool_call>" in text:
        blocks = _HERMES.findall(text)
        if len(blocks) != text.count("<tool_call>"):
            return Turn(text, error="malformed tool call: <tool_call> without a closing </tool_call>")
        calls = []
        for block in blocks:
            call = _json_call(block)
            if isinstance(call, str):
                return Turn(text, error=call)
            calls.append(call)
        return Turn(text, tuple(calls))
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Turn(text)
    call = _json_call(body)
    if isinstance(call, ToolCall):
        return Turn(text, (call,))
    return Turn(text, error=call) if _LLAMA_CALL.match(body) else Turn(text)  # JSON that is no call: an answer


def _json_call(body: str) -> ToolCall | str:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return f"malformed tool call: not valid JSON ({e.msg} at character {e.pos})"
    return _call_from(value, ("arguments", "parameters"))


def _call_from(value: Any, keys: tuple[str, ...]) -> ToolCall | str:
    """A `ToolCall` from a parsed ``{"name": ..., "arguments": {...}}`` object, or why it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'malformed tool call: expected a JSON object with a string "name"'
    key = next((k for k in keys if k in value), None)
    args = value.get(key, {}) if key else {}
    if isinstance(args, str):  # OpenAI-style arguments: a JSON string holding the object
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"malformed tool call: arguments of {value['name']} are not a JSON object"
    if not isinstance(args, dict):
        return f"malformed tool call: arguments of {value['name']} must be a JSON object, got {type(args).__name__}"
    return ToolCall(value["name"], args)
