"""The one row loader, JSONL reader/writer and DatasetError that tasks, preference data and the labelling
app share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedbackrl.data.rows import BadLine, DatasetError, read_jsonl, read_rows, write_jsonl


def test_one_dataset_error_everywhere() -> None:
    from feedbackrl.data import preferences
    from feedbackrl.envs import dataset

    assert dataset.DatasetError is preferences.DatasetError is DatasetError


def test_jsonl_round_trip_keeps_unicode_and_nesting(tmp_path: Path) -> None:
    rows = [{"prompt": "ça va?", "tests": {"io": [{"input": "1\n", "output": "2\n"}]}}, {"n": 1}]
    path = write_jsonl(rows, tmp_path / "sub" / "rows.jsonl")
    assert "ça va?" in path.read_text(encoding="utf-8")  # not \u00e7
    assert read_jsonl(path) == rows


def test_a_bad_line_is_named_or_kept(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(DatasetError, match=r"rows\.jsonl: line 3 is not valid JSON"):
        read_jsonl(path)
    kept = read_jsonl(path, bad_lines="keep")
    assert kept[0] == {"a": 1} and isinstance(kept[1], BadLine) and kept[1].lineno == 3


@pytest.mark.parametrize("name, text", [
    ("rows.jsonl", '{"p": "x", "a": "1"}\n{"p": "y", "a": "2"}\n'),
    ("rows.txt", '{"p": "x", "a": "1"}\n{"p": "y", "a": "2"}\n'),  # any other suffix is JSONL
    ("rows.json", json.dumps([{"p": "x", "a": "1"}, {"p": "y", "a": "2"}])),
    ("rows.csv", "p,a\nx,1\ny,2\n"),
])
def test_every_file_format_gives_the_same_rows(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    assert read_rows(tmp_path / name) == [{"p": "x", "a": "1"}, {"p": "y", "a": "2"}]


def test_parquet_saved_dataset_and_in_memory_sources(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"p": "x", "a": "1"}, {"p": "y", "a": "2"}]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    assert read_rows(tmp_path / "rows.parquet") == rows
    assert read_rows(tmp_path / "saved", split="train") == rows
    assert read_rows(ds) == rows and read_rows(iter(rows)) == rows
    with pytest.raises(DatasetError, match=r"has splits \['train'\]; set the split to one of them"):
        read_rows(tmp_path / "saved")


@pytest.mark.parametrize("setup, source, message", [
    (None, "missing.jsonl", r"data file '.*missing\.jsonl' does not exist"),
    ("", "empty.jsonl", r"empty\.jsonl has no rows"),
    ("p,a\nx,1,extra\n", "ragged.csv", r"row 0 has 3 fields but the header has 2"),
    ("[1, 2", "broken.json", r"broken\.json: not valid JSON"),
])
def test_bad_sources_are_clear_errors(tmp_path: Path, setup: str | None, source: str, message: str) -> None:
    if setup is not None:
        (tmp_path / source).write_text(setup)
    with pytest.raises(DatasetError, match=message):
        read_rows(tmp_path / source)
