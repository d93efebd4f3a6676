"""JSONL dataset tasks: bad rows fail up front naming the row and columns; task selection by name."""

import json
import random
from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.dataset import DatasetError, DatasetTask
from feedbackrl.envs.procedural.addition import AdditionTask
from feedbackrl.envs.registry import TASKS, make_task


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def rows(n: int) -> list[str]:
    return [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(n)]


def test_row_missing_the_answer_column_names_row_and_columns(tmp_path: Path):
    lines = rows(3)
    lines.insert(2, json.dumps({"prompt": "9+9=", "solution": "18", "id": 7}))
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(DatasetError) as err:
        DatasetTask(path)
    msg = str(err.value)
    assert "row 2" in msg and "'answer'" in msg
    assert "['id', 'prompt', 'solution']" in msg  # the columns that do exist
    assert "answer_field" in msg  # and how to map them


def test_column_mapping_fixes_it(tmp_path: Path):
    lines = [json.dumps({"question": f"{i}+1=", "solution": str(i + 1)}) for i in range(10)]
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", lines), prompt_field="question", answer_field="solution")
    p = task.sample(random.Random(0))
    assert p.answer == str(int(p.prompt.split("+")[0]) + 1)


def test_invalid_json_line_names_the_row(tmp_path: Path):
    lines = rows(2) + ['{"prompt": "1+1=", "answer": ']
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(DatasetError, match="line 3 is not valid JSON"):
        DatasetTask(path)


def test_non_object_row_is_rejected(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", [*rows(1), "[1, 2]"])
    with pytest.raises(DatasetError, match="row 1 is a list, expected a JSON object"):
        DatasetTask(path)


def test_missing_and_empty_files(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist"):
        DatasetTask(str(tmp_path / "nope.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match="has no rows"):
        DatasetTask(str(empty))


def test_heldout_rows_are_never_sampled_and_verify_is_exact(tmp_path: Path):
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", rows(20)), heldout_fraction=0.25)
    held = {p.prompt for p in task.heldout(5)}
    assert len(held) == 5  # 25% of 20
    rng = random.Random(0)
    train = {task.sample(rng).prompt for _ in range(500)}
    assert len(train) == 15 and not train & held
    p = task.heldout(1)[0]
    assert task.verify(p, f" {p.answer}\n").passed
    assert not task.verify(p, p.answer + "0").passed
    assert task.verify(p, "").score == 0.0


def test_unknown_task_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        make_task(TaskConfig(name="additon"))
    assert "'additon'" in str(err.value) and "task.name" in str(err.value)
    assert str(sorted(TASKS)) in str(err.value)


def test_unknown_option_lists_the_allowed_ones():
    with pytest.raises(ConfigError) as err:
        make_task(TaskConfig(name="addition", options={"digit": 3}))
    msg = str(err.value)
    assert "['digit']" in msg and "'addition'" in msg
    assert "allowed: ['demo_noise', 'digits', 'pad_operands', 'reverse']" in msg


def test_bad_option_value_becomes_a_config_error():
    with pytest.raises(ConfigError, match="digits must be in \\[1, 9\\], got 0"):
        make_task(TaskConfig(name="addition", options={"digits": 0}))


def test_dataset_errors_pass_through_make_task(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist"):
        make_task(TaskConfig(name="dataset", options={"path": str(tmp_path / "nope.jsonl")}))


def test_make_task_builds_with_options():
    task = make_task(TaskConfig(name="addition", options={"digits": 3, "reverse": True}))
    assert task == AdditionTask(digits=3, reverse=True)


def test_asking_for_more_heldout_problems_than_the_split_holds_is_an_error(tmp_path: Path):
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", rows(20)), heldout_fraction=0.25)  # 5 held-out rows
    assert len(task.heldout(5)) == 5
    with pytest.raises(DatasetError, match=r"asked for 200 held-out problems but the dataset's held-out split has 5 "
                                           r"rows \(heldout_fraction=0.25\); lower task.heldout_size"):
        task.heldout(200)
