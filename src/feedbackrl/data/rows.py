"""Rows of data files: one loader for every format tasks and preference data accept, one JSONL
reader and writer, and one `DatasetError`.

Sources: a JSONL file (`.jsonl`, or any suffix not below), a JSON array (`.json` whose text starts
with `[`; other `.json` files are read as JSONL), Parquet (`.parquet`, via pyarrow), CSV (`.csv`,
header row first, every value a string), a directory written by `datasets.Dataset.save_to_disk`
(a DatasetDict needs `split`), a `datasets.Dataset` or DatasetDict object, or any iterable of dicts.
Nothing is ever downloaded.

Errors are `DatasetError`s naming the file, the line or row and what was expected. Row-level
checks (missing columns, wrong types) belong to the caller, which knows the columns it needs;
`read_jsonl(..., bad_lines="keep")` hands unparsable lines back as `BadLine`s so a caller that
can drop bad rows reports them with the others.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from feedbackrl.data.preferences import RowIssue


class DatasetError(ValueError):
    """Data that cannot be used as given; the message names the file, rows, columns and the fix.

    `issues` lists the rejected rows when a loader checked many (preference data), else is empty.
    """

    def __init__(self, message: str, issues: Iterable[RowIssue] = ()) -> None:
        super().__init__(message)
        self.issues = list(issues)


@dataclass(frozen=True)
class BadLine:
    """A JSONL line that is not valid JSON, kept in place of its row (`bad_lines="keep"`)."""

    lineno: int  # 1-based, as editors show it
    error: str


def read_text(path: Path) -> str:
    """A data file's text; a DatasetError naming it when it cannot be read or is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save the file as UTF-8") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e})") from None


def _json_value(text: str) -> Any:
    """json.loads, with too deep a nesting reported as a JSONDecodeError (json recurses once per level)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


def read_jsonl(path: str | Path, bad_lines: Literal["fail", "keep"] = "fail") -> list[Any]:
    """One JSON value per non-blank line. A line that is not JSON raises a DatasetError naming it,
    or with `bad_lines="keep"` becomes a `BadLine` in its place."""
    path = Path(path)
    rows: list[Any] = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(_json_value(line))
        except json.JSONDecodeError as e:
            if bad_lines == "fail":
                raise DatasetError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from None
            rows.append(BadLine(lineno, e.msg))
    return rows


def write_jsonl(rows: Iterable[Any], path: str | Path) -> Path:
    """One JSON line per row (UTF-8, non-ASCII kept as is); creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _read_json(path: Path, bad_lines: Literal["fail", "keep"]) -> list[Any]:
    text = read_text(path)
    if not text.lstrip().startswith("["):
        return read_jsonl(path, bad_lines)
    try:
        rows = _json_value(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: not a readable Parquet file ({e})") from None


def _read_csv(path: Path) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    rows = []
    try:
        header = reader.fieldnames or []
        for i, row in enumerate(reader):
            if None in row or None in row.values():  # DictReader's marks for too many / too few fields
                n = len(header) + len(row[None]) if None in row else sum(v is not None for v in row.values())
                raise DatasetError(f"{path}: row {i} has {n} fields but the header has {len(header)}: {header}")
            rows.append(row)
    except csv.Error as e:  # a NUL byte, an unterminated quote at the end, a field over csv's size limit
        raise DatasetError(f"{path}: not a readable CSV file (line {reader.line_num}: {e})") from None
    return rows


_READERS: dict[str, Callable[[Path, Any], list[Any]]] = {
    ".parquet": lambda p, _: _read_parquet(p),
    ".csv": lambda p, _: _read_csv(p),
    ".json": _read_json,
}


def _rows_of_hf(data: Any, source: str, split: str | None) -> list[dict[str, Any]]:
    if isinstance(data, dict):  # a DatasetDict is a dict of splits
        if split not in data:
            raise DatasetError(f"{source}: has splits {sorted(data)}; set the split to one of them "
                               "(task.options.split in a recipe)"
                               + (f" (got {split!r})" if split is not None else ""))
        data = data[split]
    return data.to_list()


def _load_saved_dataset(path: Path, split: str | None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path} is a directory; reading saved datasets needs `pip install datasets`") from None
    try:
        data = datasets.load_from_disk(str(path))  # local only: never downloads
    except FileNotFoundError as e:
        raise DatasetError(f"{path} is a directory but not a dataset written by save_to_disk ({e})") from None
    return _rows_of_hf(data, str(path), split)


def source_label(source: Any) -> str:
    """How error messages name a source: its path, or the kind of in-memory dataset."""
    if isinstance(source, str | Path):
        return str(source)
    rows = getattr(source, "num_rows", None)
    return f"<{type(source).__name__} with {rows} rows>" if isinstance(rows, int) else f"<{type(source).__name__}>"


def read_rows(source: Any, split: str | None = None, bad_lines: Literal["fail", "keep"] = "fail") -> list[Any]:
    """Every row of a file, a saved dataset directory, a `datasets` object or an iterable of dicts.

    An empty source is an error: nothing can be trained or evaluated on it.
    """
    if isinstance(source, str | Path):
        path = Path(source)
        if path.is_dir():
            rows = _load_saved_dataset(path, split)
        elif not path.is_file():
            raise DatasetError(f"data file {str(path)!r} does not exist")
        else:
            rows = _READERS.get(path.suffix.lower(), read_jsonl)(path, bad_lines)
    elif isinstance(source, dict) or hasattr(source, "to_list"):
        rows = _rows_of_hf(source, source_label(source), split)
    elif isinstance(source, Iterable) and not isinstance(source, str | bytes):
        rows = list(source)
    else:
        raise DatasetError(f"expected a file path, a saved dataset directory, a datasets.Dataset or an iterable "
                           f"of rows, got {type(source).__name__}")
    if not rows:
        raise DatasetError(f"{source_label(source)} has no rows")
    return rows
