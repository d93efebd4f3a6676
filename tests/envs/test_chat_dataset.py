"""Chat-format dataset rows (`task.options.messages_field`): the last user turn is the prompt, rendered whole with
the model's chat template; an assistant reply after it is the SFT demonstration (and the answer when the row
has none); malformed conversations fail at load naming the row. JSONL and a saved `datasets` dataset alike."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import feedbackrl
from feedbackrl.data.rows import DatasetError, read_jsonl
from feedbackrl.envs.chat import ChatTask
from feedbackrl.envs.dataset import DatasetTask
from feedbackrl.models.chat import end_of_turn

ROWS = [
    {"messages": [{"role": "system", "content": "Answer with the number only."},
                  {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]},
    {"messages": [{"role": "user", "content": "What is 1+1?"}], "answer": "2"},
    {"messages": [{"role": "user", "content": "What is 5+0?"}, {"role": "assistant", "content": "five"}],
     "answer": "5"},
]


def write(tmp_path: Path, rows: list[dict], fmt: str) -> str:
    if fmt == "jsonl":
        path = tmp_path / "chat.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "saved"
    datasets.Dataset.from_list([{"answer": None, **r} for r in rows]).save_to_disk(str(path))
    return str(path)


def by_row(task: DatasetTask) -> dict[int, object]:
    return {p.meta["row"]: p for p in task._train}


@pytest.mark.parametrize("fmt", ["jsonl", "saved"])
def test_the_last_user_turn_is_the_prompt_and_the_reply_the_demonstration(tmp_path: Path, fmt: str) -> None:
    rows = ROWS if fmt == "jsonl" else ROWS[1:]  # a saved dataset's column needs one schema: a row without None
    task = DatasetTask(write(tmp_path, rows, fmt), messages_field="messages", heldout_fraction=0.0)
    problems = by_row(task)
    if fmt == "jsonl":
        first = problems[0]
        assert (first.prompt, first.answer) == ("And 3+3?", "6")  # no answer column: the reply is the answer
        assert first.meta["messages"] == ROWS[0]["messages"][:4]  # up to and with the last user turn
        assert task.demonstrate(first, random.Random(0)) == "6"
    one, five = problems[len(rows) - 2], problems[len(rows) - 1]
    assert (one.prompt, one.answer, one.meta["messages"]) == ("What is 1+1?", "2", ROWS[1]["messages"])
    assert task.demonstrate(one, random.Random(0)) == "2"  # no reply: the gold answer, as for text rows
    assert (five.answer, task.demonstrate(five, random.Random(0))) == ("5", "five")  # the reply, not the answer
    assert task.verify(five, "5").passed and not task.verify(five, "five").passed


def test_the_chat_template_renders_the_whole_conversation(tmp_path: Path, smol_tokenizer) -> None:
    task = DatasetTask(write(tmp_path, ROWS, "jsonl"), messages_field="messages", heldout_fraction=0.0)
    chat = ChatTask(task, smol_tokenizer, system_prompt="Be brief.")
    first, one = (chat.render(by_row(task)[i]) for i in (0, 1))
    assert first.prompt == smol_tokenizer.apply_chat_template(ROWS[0]["messages"][:4], tokenize=False,
                                                              add_generation_prompt=True)  # its own system turn
    assert "Answer with the number only." in first.prompt and "Be brief." not in first.prompt
    assert first.prompt.endswith("And 3+3?<|im_end|>\n<|im_start|>assistant\n")
    assert one.prompt == smol_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *ROWS[1]["messages"]], tokenize=False, add_generation_prompt=True)
    assert first.meta["raw_prompt"] == "And 3+3?"
    assert chat.demonstrate(first, random.Random(0)) == "6" + end_of_turn(smol_tokenizer)


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "hi"}, "row 0 has no column 'messages'; its columns are ['text']"),
    ({"messages": "hi"}, "column 'messages' must be a non-empty list of {role, content} messages"),
    ({"messages": [{"role": "user"}]}, "'messages[0]' must be a {'role': str, 'content': str} message"),
    ({"messages": [{"role": "assistant", "content": "4"}]}, "has no (non-empty) user turn to prompt with"),
    ({"messages": [{"role": "user", "content": "2+2?"}]}, "no column 'answer' and no assistant reply"),
])
def test_malformed_conversations_fail_at_load(tmp_path: Path, row: dict, message: str) -> None:
    with pytest.raises(DatasetError) as e:
        DatasetTask(write(tmp_path, [row, *ROWS], "jsonl"), messages_field="messages")
    assert "row 0" in str(e.value) and message in str(e.value)


def test_sft_then_grpo_on_chat_rows(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]}
            for a in range(5) for b in range(5)]
    path = write(tmp_path, rows, "jsonl")
    recipe = {"task": {"name": "dataset", "options": {"path": path, "messages_field": "messages",
                                                      "heldout_fraction": 0.2}, "heldout_size": 5},
              "sft": {"steps": 2, "batch_size": 4, "warmup_steps": 0},
              "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
              "algo": {"steps": 2}, "eval": {"pass_k": 0}, "train": {"threads": 1}, "monitors": {"enabled": False}}
    report = feedbackrl.train(recipe, out=tmp_path / "run")
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in metrics if r.get("phase") == "sft"] == [0, 1]
    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
    assert report["eval_after"]["n"] == 5
