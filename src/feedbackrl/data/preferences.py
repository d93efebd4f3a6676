"""Preference data: pairs (prompt, chosen, rejected) and rankings (prompt, responses best-first).

Accepted row formats, the ones the ecosystem publishes (TRL's dataset formats, UltraFeedback,
Anthropic HH converted to messages):

- text pairs: ``{"prompt": str, "chosen": str, "rejected": str}``
- chat pairs: ``chosen``/``rejected`` are lists of ``{"role", "content"}`` messages. ``prompt`` is
  a message list, a string (one user message), or absent. The full conversations are prompt +
  chosen and prompt + rejected (if ``chosen`` already starts with a non-assistant message, the
  conversation already holds the prompt and a string ``prompt`` is not prepended again, as in
  UltraFeedback-binarized). The new prompt is the shared prefix of the two conversations; chosen
  and rejected are what follows, and must start with an assistant message.
- rankings: ``{"prompt", "responses": [best, ..., worst]}``, or ``{"prompt", "responses", "ranks"}``
  with integer ranks, 1 = best (lower is better), no ties. Responses may be strings or messages.

Chat is rendered to text, either with `tokenizer.apply_chat_template` (when a tokenizer is given)
or with this module's simple template::

    <|user|>
    What is 2+2?<|end|>
    <|assistant|>
    4<|end|>

The prompt text is the prefix rendered with the generation prompt (``<|assistant|>\\n``) and the
response text is the rest of the rendered conversation. A chat template usually emits special
tokens (BOS) as text, so tokenize these strings with ``add_special_tokens=False``.

Rows come from any source `data.rows.read_rows` reads: JSONL/JSON, Parquet, CSV, a saved
`datasets` directory, a `datasets.Dataset` or any iterable of dicts. A bad row (missing column,
wrong type, empty response, identical responses, a line that is not JSON) becomes a `RowIssue`
with its 0-based row index and the columns it has; ``on_bad_row="fail"`` raises a
`DatasetError` listing the first few, ``"drop"`` skips them. Loaders always return
``(items, dropped_issues)``; in fail mode the list is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from feedbackrl.data.rows import BadLine, DatasetError, read_rows

Messages = list[dict[str, str]]
OnBadRow = Literal["fail", "drop"]
SHOWN_ISSUES = 5
T = TypeVar("T")


@dataclass(frozen=True)
class RowIssue:
    """Why row `index` (0-based) was rejected, and the columns it had."""

    index: int
    problem: str
    columns: tuple[str, ...]

    def __str__(self) -> str:
        return f"row {self.index}: {self.problem} (columns: {', '.join(self.columns) or 'none'})"


@dataclass(frozen=True)
class PreferencePair:
    """One comparison. `meta` holds the row's other columns and `row_index`."""

    prompt: str
    chosen: str
    rejected: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ranking:
    """k >= 2 responses to one prompt, best first."""

    prompt: str
    responses: list[str]
    meta: dict[str, Any] = field(default_factory=dict)


class ChatTokenizer(Protocol):
    """The one method we need from a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: Messages, tokenize: bool = ...,
                            add_generation_prompt: bool = ..., **kwargs: Any) -> Any: ...


class _BadRow(Exception):
    pass


# --- loading ----------------------------------------------------------------------------------


def _collect(source: Any, parse: Callable[[Mapping[str, Any], int], T],
             on_bad_row: OnBadRow, what: str) -> tuple[list[T], list[RowIssue]]:
    if on_bad_row not in ("fail", "drop"):
        raise ValueError(f"on_bad_row must be 'fail' or 'drop'; got {on_bad_row!r}")
    rows = read_rows(source, bad_lines="keep")
    where = f"{source}: " if isinstance(source, str | Path) else ""  # a file is named; in-memory rows need not be
    items: list[T] = []
    issues: list[RowIssue] = []
    for i, row in enumerate(rows):
        columns = tuple(str(k) for k in row) if isinstance(row, Mapping) else ()
        try:
            if isinstance(row, BadLine):
                raise _BadRow(f"invalid JSON on line {row.lineno}: {row.error}")
            if not isinstance(row, Mapping):
                raise _BadRow(f"row is a {type(row).__name__}, not a mapping of column -> value")
            items.append(parse(row, i))
        except _BadRow as e:
            issues.append(RowIssue(i, str(e), columns))
    if issues and on_bad_row == "fail":
        shown = "\n  ".join(str(x) for x in issues[:SHOWN_ISSUES])
        more = f"\n  ... and {len(issues) - SHOWN_ISSUES} more" if len(issues) > SHOWN_ISSUES else ""
        raise DatasetError(f"{where}{len(issues)} bad {what} row(s) out of {len(rows)}:\n  {shown}{more}\n"
                           "Fix the data or pass on_bad_row='drop' to skip them.", issues)
    if not items:  # dropping every row leaves nothing to train on
        raise DatasetError(f"{where}all {len(rows)} {what} row(s) are bad, e.g. {issues[0]}", issues)
    return items, issues


def load_preference_pairs(source: str | Path | Iterable[Any], on_bad_row: OnBadRow = "fail",
                          tokenizer: ChatTokenizer | None = None
                          ) -> tuple[list[PreferencePair], list[RowIssue]]:
    """Rows in any accepted pair format -> (pairs, dropped issues). See the module docstring."""
    return _collect(source, lambda row, i: parse_pair(row, i, tokenizer), on_bad_row, "preference")


def load_rankings(source: str | Path | Iterable[Any], on_bad_row: OnBadRow = "fail",
                  tokenizer: ChatTokenizer | None = None) -> tuple[list[Ranking], list[RowIssue]]:
    """Rows with prompt + responses (best first) or responses + ranks -> (rankings, dropped issues)."""
    return _collect(source, lambda row, i: parse_ranking(row, i, tokenizer), on_bad_row, "ranking")


# --- fields and chat --------------------------------------------------------------------------


def _field(row: Mapping[str, Any], key: str) -> str | Messages:
    if row.get(key) is None:
        raise _BadRow(f"missing column {key!r}")
    return _text_or_messages(row[key], key)


def _text_or_messages(value: Any, name: str) -> str | Messages:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return _messages(value, name)
    raise _BadRow(f"column {name!r} must be text or a list of {{role, content}} messages, "
                  f"got {type(value).__name__}")


def _messages(value: list[Any] | tuple[Any, ...], key: str) -> Messages:
    out = []
    for j, m in enumerate(value):
        ok = isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        if not ok:
            raise _BadRow(f"'{key}[{j}]' must be a {{'role': str, 'content': str}} message, got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def parse_messages(value: Any, name: str) -> Messages:
    """A column holding a conversation: a list of ``{"role": str, "content": str}`` messages (other keys are
    dropped); a ValueError naming the column and the bad message otherwise."""
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"column {name!r} must be a non-empty list of {{role, content}} messages, got "
                         f"{type(value).__name__} {value!r:.80}")
    try:
        return _messages(value, name)
    except _BadRow as e:
        raise ValueError(str(e)) from None


def render_simple(messages: Messages, add_generation_prompt: bool) -> str:
    """The documented fallback chat template (see the module docstring)."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


def _render(prefix: Messages, continuation: Messages, tokenizer: ChatTokenizer | None) -> tuple[str, str]:
    """-> (prompt text with generation prompt, response text = rest of the rendered conversation)."""
    def render(msgs: Messages, gen: bool) -> str:
        if tokenizer is None:
            return render_simple(msgs, gen)
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    try:
        prompt, full = render(prefix, True), render(prefix + continuation, False)
    except Exception as e:  # a template may reject a conversation (e.g. roles that do not alternate)
        raise _BadRow(f"chat template failed: {type(e).__name__}: {e}") from e
    if not full.startswith(prompt):
        raise _BadRow("the chat template does not render the prompt as a prefix of the whole conversation, "
                      "so the response cannot be cut out")
    return prompt, full[len(prompt):]


def _as_conversation(prompt: str | Messages | None, response: str | Messages) -> Messages:
    resp = [{"role": "assistant", "content": response}] if isinstance(response, str) else response
    if isinstance(prompt, list):
        return prompt + resp
    if prompt is None or (resp and resp[0]["role"] != "assistant"):  # the conversation holds the prompt
        return resp
    return [{"role": "user", "content": prompt}] + resp


def _extras(row: Mapping[str, Any], used: tuple[str, ...], index: int) -> dict[str, Any]:
    return {**{k: v for k, v in row.items() if k not in used}, "row_index": index}


# --- pairs and rankings -----------------------------------------------------------------------


def parse_pair(row: Mapping[str, Any], index: int, tokenizer: ChatTokenizer | None = None) -> PreferencePair:
    """One row -> PreferencePair; raises _BadRow with the reason (collected by the loaders)."""
    chosen, rejected = _field(row, "chosen"), _field(row, "rejected")
    prompt = _field(row, "prompt") if row.get("prompt") is not None else None
    meta = _extras(row, ("prompt", "chosen", "rejected"), index)
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not value or (isinstance(value, str) and not value.strip()):
            raise _BadRow(f"empty {name} response")
    if isinstance(chosen, str) and isinstance(rejected, str) and not isinstance(prompt, list):
        if prompt is None:
            raise _BadRow("missing column 'prompt' (text pairs need it; chat pairs may carry it in "
                          "their messages)")
        _check_responses({"chosen": chosen, "rejected": rejected})
        return PreferencePair(prompt, chosen, rejected, meta)
    conv_c, conv_r = _as_conversation(prompt, chosen), _as_conversation(prompt, rejected)
    n = 0
    while n < min(len(conv_c), len(conv_r)) and conv_c[n] == conv_r[n]:
        n += 1
    if conv_c == conv_r:
        raise _BadRow("chosen and rejected are identical")
    for name, conv in (("chosen", conv_c), ("rejected", conv_r)):
        if n == len(conv):
            raise _BadRow(f"{name} adds no messages after the shared prompt")
        if conv[n]["role"] != "assistant":
            raise _BadRow(f"chosen and rejected first differ at a {conv[n]['role']!r} message; "
                          "they must differ from an assistant turn on")
    if n == 0:
        raise _BadRow("no prompt: the conversations share no messages and no 'prompt' column is given")
    _check_empty_turns({"chosen": conv_c[n:], "rejected": conv_r[n:]})
    prompt_text, chosen_text = _render(conv_c[:n], conv_c[n:], tokenizer)
    _, rejected_text = _render(conv_r[:n], conv_r[n:], tokenizer)
    return PreferencePair(prompt_text, chosen_text, rejected_text, meta)


def _check_responses(responses: dict[str, str]) -> None:
    seen: dict[str, str] = {}
    for name, text in responses.items():
        if not text.strip():
            raise _BadRow(f"empty {name} response")
        if text in seen:
            raise _BadRow(f"{seen[text]} and {name} are identical")
        seen[text] = name


def _check_empty_turns(responses: dict[str, Messages]) -> None:
    for name, msgs in responses.items():
        if not any(m["content"].strip() for m in msgs if m["role"] == "assistant"):
            raise _BadRow(f"empty {name} response")


def _ranked_order(row: Mapping[str, Any], k: int) -> list[int]:
    ranks = row.get("ranks")
    if ranks is None:
        return list(range(k))
    ints = isinstance(ranks, list | tuple) and all(type(r) is int for r in ranks)  # bool is not a rank
    if not ints:
        raise _BadRow(f"column 'ranks' must be a list of integers (1 = best), got {ranks!r:.80}")
    if len(ranks) != k:
        raise _BadRow(f"'ranks' has {len(ranks)} entries but 'responses' has {k}")
    if len(set(ranks)) != k:
        raise _BadRow(f"'ranks' has ties {sorted(ranks)}; a ranking needs a strict order")
    return sorted(range(k), key=lambda j: ranks[j])


def parse_ranking(row: Mapping[str, Any], index: int, tokenizer: ChatTokenizer | None = None) -> Ranking:
    """One row -> Ranking with responses best first; raises _BadRow with the reason."""
    prompt = _field(row, "prompt")
    responses = row.get("responses")
    if responses is None:
        raise _BadRow("missing column 'responses'")
    if not isinstance(responses, list | tuple) or len(responses) < 2:
        raise _BadRow(f"column 'responses' must be a list of at least 2 responses, got {responses!r:.80}")
    parsed = [_text_or_messages(r, f"responses[{j}]") for j, r in enumerate(responses)]
    order = _ranked_order(row, len(parsed))
    meta = _extras(row, ("prompt", "responses", "ranks"), index)
    if isinstance(prompt, str) and all(isinstance(r, str) for r in parsed):
        texts = [parsed[j] for j in order]
        _check_responses({f"response {order[j]}": t for j, t in enumerate(texts)})
        return Ranking(prompt, texts, meta)
    prefix = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    conts = [[{"role": "assistant", "content": r}] if isinstance(r, str) else r for r in parsed]
    _check_empty_turns({f"response {j}": conts[j] for j in order})
    rendered = [_render(prefix, conts[j], tokenizer) for j in order]
    _check_responses({f"response {order[j]}": text for j, (_, text) in enumerate(rendered)})
    return Ranking(rendered[0][0], [text for _, text in rendered], meta)
