"""Chat formatting: prompts, demonstrations and end tokens come from the model's own tokenizer."""

from __future__ import annotations

import random

import pytest

from feedbackrl.envs.chat import ChatTask, chat_task
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.models.chat import ChatTemplateError, end_of_turn, end_token_ids, render_prompt, use_chat

SMOL_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_rendered_prompts_equal_apply_chat_template(smol_tokenizer):
    user = "What is 12 + 7?"
    plain = smol_tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                               add_generation_prompt=True)
    assert render_prompt(smol_tokenizer, user) == plain
    # written out: the template's default system turn, the user turn, the assistant's opening
    assert plain == (f"<|im_start|>system\n{SMOL_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                     "<|im_start|>assistant\n")
    system = "Answer with the final number only."
    assert render_prompt(smol_tokenizer, user, system) == (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def test_the_end_of_turn_and_end_tokens_come_from_the_template_and_generation_config(smol_lm, smol_tokenizer):
    assert end_of_turn(smol_tokenizer) == "<|im_end|>"
    assert end_token_ids(smol_lm, smol_tokenizer).tolist() == [0, 2]  # <|endoftext|>, <|im_end|>


def test_a_chat_task_renders_every_prompt_and_keeps_the_tasks_verdicts(smol_tokenizer):
    inner = AdditionTask(digits=2)
    task = chat_task(AdditionTask(digits=2), smol_tokenizer, "auto", "Add.")
    assert isinstance(task, ChatTask)
    raw = inner.sample(random.Random(0))
    problem = task.sample(random.Random(0))
    assert problem.prompt == render_prompt(smol_tokenizer, raw.prompt, "Add.")
    assert (problem.answer, problem.meta["raw_prompt"]) == (raw.answer, raw.prompt)
    held = task.heldout(3)
    assert [p.prompt for p in held] == [render_prompt(smol_tokenizer, p.prompt, "Add.") for p in inner.heldout(3)]
    assert task.heldout(3) == held and task.heldout(2) == held[:2]
    assert task.verify(problem, raw.answer).passed and not task.verify(problem, "-1").passed
    # an SFT demonstration ends the assistant turn the way the template does, so the model learns to stop
    assert task.demonstrate(problem, random.Random(0)) == raw.answer + "<|im_end|>"


def test_chat_mode_auto_on_off(smol_tokenizer, tokenizer):
    assert use_chat(smol_tokenizer, "auto") and use_chat(smol_tokenizer, "on")
    assert not use_chat(smol_tokenizer, "off")
    assert not use_chat(tokenizer, "auto")  # the tiny char tokenizer has no template: raw prompts
    task = AdditionTask()
    assert chat_task(task, tokenizer, "auto") is task
    with pytest.raises(ChatTemplateError, match=r"chat_template = 'on' but the tokenizer has no chat template"):
        chat_task(task, tokenizer, "on")
