"""Dataset tasks from JSONL, Parquet, CSV and `datasets` sources; column mapping; row errors; verifiers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from feedbackrl.config import ConfigError, TaskConfig
from feedbackrl.envs.dataset import DatasetError, DatasetTask, read_rows
from feedbackrl.envs.registry import make_task

datasets = pytest.importorskip("datasets")  # optional: not a feedbackrl dependency (pyarrow comes with it)
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [{"question": f"{i}+1=", "solution": str(i + 1), "level": i % 3} for i in range(10)]
DOUBLE_TESTS = json.dumps({"io": [{"input": "2\n", "output": "4\n"}, {"input": "5\n", "output": "10\n"}]})
needs_sandbox = pytest.mark.sandbox


def write(tmp_path: Path, fmt: str, rows: list[dict]) -> object:
    """`rows` in format `fmt`; returns what DatasetTask's `path` takes."""
    if fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "csv":
        path = tmp_path / "d.csv"
        header = list(rows[0])
        path.write_text("\n".join([",".join(header), *(",".join(str(r[k]) for k in header) for r in rows)]) + "\n")
    elif fmt == "saved":
        path = tmp_path / "saved"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:
        return datasets.Dataset.from_list(rows)
    return str(path)


FORMATS = ["jsonl", "parquet", "csv", "saved", "object"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_the_same_problems(tmp_path: Path, fmt: str) -> None:
    task = DatasetTask(write(tmp_path, fmt, ROWS), prompt_field="question", answer_field="solution",
                       heldout_fraction=0.2, meta_fields=["level"])
    reference = DatasetTask(write(tmp_path, "jsonl", ROWS), "question", "solution", 0.2, meta_fields=["level"])
    held = task.heldout(2)
    assert [(p.prompt, str(p.answer), p.meta["row"]) for p in held] == \
           [(p.prompt, p.answer, p.meta["row"]) for p in reference.heldout(2)]
    assert len(held) == 2
    p = task.sample(random.Random(0))
    assert p.prompt == ROWS[p.meta["row"]]["question"]
    assert str(p.meta["level"]) == str(ROWS[p.meta["row"]]["level"])  # CSV keeps strings
    assert task.verify(p, f" {p.answer}\n").passed and not task.verify(p, "0").passed


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "saved", "object"])
def test_missing_column_names_the_row_and_the_columns(tmp_path: Path, fmt: str) -> None:
    rows = [dict(r) for r in ROWS]
    rows[3] = {"question": "3+1=", "answr": "4", "level": 0}  # a typo in one row
    if fmt != "jsonl":  # columnar formats fill the gap with null instead of dropping the key
        rows = [{"question": r["question"], "solution": r.get("solution"), "level": r["level"]} for r in rows]
    with pytest.raises(DatasetError, match=r"row 3 .*'solution'.*\['answr', 'level', 'question'\]"
                                          r"|row 3 column 'solution' is empty .*\['level', 'question', 'solution'\]"):
        DatasetTask(write(tmp_path, fmt, rows), "question", "solution")


def test_unmapped_columns_suggest_the_mapping(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"row 0 has no column 'prompt'; its columns are "
                                          r"\['level', 'question', 'solution'\]. Set task.options.prompt_field"):
        DatasetTask(write(tmp_path, "csv", ROWS))


def test_missing_meta_or_demo_column_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "parquet", ROWS)
    with pytest.raises(DatasetError, match=r"row 0 has no column 'source'.*meta_fields"):
        DatasetTask(path, "question", "solution", meta_fields=["source"])
    with pytest.raises(DatasetError, match=r"row 0 has no column 'program'.*demo_field"):
        DatasetTask(path, "question", "solution", demo_field="program")


def test_ragged_csv_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("prompt,answer\n1+1=,2\n2+2=,4,extra\n")
    with pytest.raises(DatasetError, match=r"row 1 has 3 fields but the header has 2: \['prompt', 'answer'\]"):
        DatasetTask(str(path))


def test_unreadable_parquet_and_non_dataset_dir(tmp_path: Path) -> None:
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        read_rows(bad)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DatasetError, match="not a dataset written by save_to_disk"):
        read_rows(tmp_path / "empty_dir")


def test_dataset_dict_needs_a_split(tmp_path: Path) -> None:
    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:2])}).save_to_disk(str(path))
    with pytest.raises(DatasetError, match=r"splits \[.test., .train.\]; set the split to one of them"):
        DatasetTask(str(path), "question", "solution")
    task = DatasetTask(str(path), "question", "solution", heldout_fraction=0.0, split="test")
    assert sorted(p.prompt for p in task._train) == ["0+1=", "1+1="]


def test_jsonl_behaviour_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n\n[1, 2]\n')
    # rows are numbered as Problem.meta["row"] numbers them: blank lines are not rows
    with pytest.raises(DatasetError, match=r"row 1 is a list, expected a JSON object"):
        DatasetTask(str(path))
    with pytest.raises(DatasetError, match="does not exist"):
        DatasetTask(str(tmp_path / "nope.jsonl"))


# --- verifier selection --------------------------------------------------------------------------


def test_math_verifier_accepts_equivalent_answers(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": "1/2"} for i in range(5)]
    path = write(tmp_path, "jsonl", rows)
    exact, math = (DatasetTask(path, heldout_fraction=0.0, verifier=v) for v in ("exact", "math"))
    p = exact.sample(random.Random(0))
    assert not exact.verify(p, "0.5").passed
    v = math.verify(p, "The answer is 0.5.")
    assert v.passed and v.details["rule"] == "answer_is"


def test_unknown_verifier_and_options(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl", ROWS)
    with pytest.raises(DatasetError, match=r"unknown verifier 'regex'; choose one of \['code', 'exact', 'math'\]"):
        DatasetTask(path, "question", "solution", verifier="regex")
    with pytest.raises(ValueError, match="takes no verifier_options"):
        DatasetTask(path, "question", "solution", verifier_options={"timeout_s": 1})


def test_code_tests_are_checked_when_loading(tmp_path: Path) -> None:
    rows = [{"prompt": "double", "tests": DOUBLE_TESTS}, {"prompt": "bad", "tests": '{"io": [{"input": "1"}]}'}]
    with pytest.raises(DatasetError, match=r"row 1 column 'tests' holds no valid tests: io\[0\] must be"):
        DatasetTask(write(tmp_path, "jsonl", rows), answer_field="tests", verifier="code",
                    verifier_options={"allow_unsafe": True})


@needs_sandbox
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_code_verifier_runs_the_tests(tmp_path: Path, fmt: str) -> None:
    rows = [{"prompt": "Read n, print n times 2.\n", "tests": DOUBLE_TESTS, "program": "print(int(input())*2)"}]
    task = DatasetTask(write(tmp_path, fmt, rows), answer_field="tests", heldout_fraction=0.0, verifier="code",
                       demo_field="program")
    p = task.sample(random.Random(0))
    good = task.verify(p, task.demonstrate(p, random.Random(0)))
    assert good.score == 1.0 and good.passed
    half = task.verify(p, "n = int(input())\nprint(4 if n == 2 else 0)")
    assert half.score == 0.5 and not half.passed


def test_demonstrations(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl", ROWS)
    task = DatasetTask(path, "question", "solution")
    p = task.sample(random.Random(0))
    assert task.demonstrate(p, random.Random(0)) == p.answer
    rows = [{"prompt": "double", "tests": DOUBLE_TESTS}]
    code = DatasetTask(write(tmp_path, "jsonl", rows), answer_field="tests", heldout_fraction=0.0,
                       verifier="code", verifier_options={"allow_unsafe": True})
    with pytest.raises(DatasetError, match="set task.options.demo_field"):
        code.demonstrate(code.sample(random.Random(0)), random.Random(0))


def test_registry_passes_dataset_options(tmp_path: Path) -> None:
    path = write(tmp_path, "csv", ROWS)
    task = make_task(TaskConfig(name="dataset", options={"path": path, "prompt_field": "question",
                                                         "answer_field": "solution", "verifier": "math"}))
    assert isinstance(task, DatasetTask) and task.verifier == "math"
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['prompt_column'\]"):
        make_task(TaskConfig(name="dataset", options={"path": path, "prompt_column": "question"}))
    with pytest.raises(DatasetError, match="row 0 has no column 'prompt'"):
        make_task(TaskConfig(name="dataset", options={"path": path}))


def test_verdicts_are_cached_per_row_and_completion(tmp_path: Path) -> None:
    task = DatasetTask(write(tmp_path, "jsonl", ROWS), "question", "solution", heldout_fraction=0.0)
    calls = []
    inner = task._verify
    task._verify = lambda p, c: calls.append(c) or inner(p, c)
    p, q = task._train[0], task._train[1]
    first = task.verify(p, "7")
    assert task.verify(p, "7") is first and task.verify(q, "7") is not first
    assert calls == ["7", "7"]  # one call per (row, completion)
