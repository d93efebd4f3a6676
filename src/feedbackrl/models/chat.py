"""Chat formatting with the model's own tokenizer: prompts, demonstrations and end tokens.

An instruct model answers far better when its prompt is rendered with the chat template it was
trained on (SmolLM2-135M-Instruct on arithmetic word problems: 0.08 greedy accuracy on raw text,
0.37 with its template). Every prompt a task hands out goes through `render_prompt` when chat
formatting is on (`envs/chat.py` wraps the task), so rollouts, eval and SFT see the same text.

The template is the tokenizer's (`apply_chat_template`), never one of ours: the rendered prompt
already carries the model's start-of-turn tokens, and `encode_prompts` adds nothing else. An
assistant turn the model should learn to end (an SFT demonstration, a preference response) is
closed with the template's end-of-turn text, found by rendering a probe conversation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

_PROBE = "\x00probe\x00"

# The minimal transcript format (docs/agents.md) as a chat template, for clients that render prompts
# with the tokenizer's own template (verifiers' training client) when the model has none (the tiny
# model): user and system text as is, an assistant turn (its tool calls as ``name(input)``) closed by
# EOS, a tool result as ``=RESULT`` and a newline; the generation prompt adds nothing. It renders the
# same text as `serve/openai_api.py:render_messages` does for a tokenizer without a template.
MINIMAL_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{- m['content'] or '' -}}"
    "{%- for c in m.get('tool_calls') or [] -%}"
    "{%- set a = c['function']['arguments'] -%}"
    "{{- c['function']['name'] }}({{ (a['input'] if a is mapping else a) if a else '' }})"
    "{%- endfor -%}"
    "{{- eos_token -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "={{ m['content'] or '' }}{{ '\\n' }}"
    "{%- else -%}"
    "{{- m['content'] or '' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


class ChatTemplateError(ValueError):
    """Chat formatting asked for where the tokenizer has no chat template."""


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat(tokenizer: PreTrainedTokenizerBase, mode: str) -> bool:
    """`model.chat_template`: "auto" = when the tokenizer has a template, "on" = required, "off" = raw text."""
    if mode == "on" and not has_chat_template(tokenizer):
        raise ChatTemplateError("model.chat_template = 'on' but the tokenizer has no chat template; set it to "
                                "'off' (raw prompts) or use a model whose tokenizer_config carries one")
    return mode == "on" or (mode == "auto" and has_chat_template(tokenizer))


def messages(user: str, system_prompt: str = "") -> list[dict[str, str]]:
    """One user turn, after a system turn when `system_prompt` is set ("" = the template's own default)."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*head, {"role": "user", "content": user}]


def render_prompt(tokenizer: PreTrainedTokenizerBase, user: str, system_prompt: str = "") -> str:
    """The text the model sees before its answer: the template applied with the generation prompt."""
    return tokenizer.apply_chat_template(messages(user, system_prompt), tokenize=False, add_generation_prompt=True)


def end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str:
    """What the template writes after an assistant message's content (e.g. "<|im_end|>\\n").

    Found by rendering a probe conversation, so it follows whatever template the tokenizer carries.
    """
    convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(convo, tokenize=False)
    tail = text[text.rindex(_PROBE) + len(_PROBE):]
    return tail.rstrip("\n") or (tokenizer.eos_token or "")


def end_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Tensor:
    """Every id that ends generation (1-D, sorted): the generation config's EOS list plus the tokenizer's EOS."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Sequence):
        ids.update(int(i) for i in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer names an end token (EOS)")
    return torch.tensor(sorted(ids), dtype=torch.long)
