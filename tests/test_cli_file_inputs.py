"""Every file a `feedbackrl` command reads, fed garbage: random bytes, invalid UTF-8, truncated or
mistyped JSON, TOML and JSONL. The command either accepts the file or exits 2 with one `error:`
line that names the file (or the field at fault), never a Python traceback.

Hypothesis runs derandomized with a bounded number of examples per file kind, so the test is
deterministic and takes seconds; the readers a `train` run calls (preference pairs, task data)
are called directly, the way `train` calls them, and must raise one of the errors the command
turns into that line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.cli_errors import user_errors
from feedbackrl.data.preferences import load_preference_pairs, load_rankings
from feedbackrl.envs.dataset import DatasetTask

runner = CliRunner()
FUZZ = settings(max_examples=10, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)


def garbage(valid: bytes) -> st.SearchStrategy[bytes]:
    """Bytes that a reader of `valid`-like files meets: noise, invalid UTF-8, a cut-off copy of a valid file,
    valid JSON of the wrong shape, or a valid file with one byte replaced."""
    cut = st.integers(0, max(len(valid) - 1, 0)).map(lambda n: valid[:n])
    flipped = st.tuples(st.integers(0, max(len(valid) - 1, 0)), st.integers(0, 255)).map(
        lambda t: valid[:t[0]] + bytes([t[1]]) + valid[t[0] + 1:])
    return st.one_of(st.binary(max_size=64), st.binary(max_size=16).map(lambda b: b"\xff\xfe" + b + b"\x80"),
                     cut, flipped, json_values.map(lambda v: json.dumps(v).encode()),
                     st.lists(json_values, max_size=3).map(lambda vs: "\n".join(map(json.dumps, vs)).encode()),
                     st.just(b'[{"id": []}]'), st.just(b"[" * 100_000))


def assert_clear_error(result, path: Path) -> None:
    """Exit 0 (the bytes happened to be valid), or exit 2 with `error:` first, naming the file."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        return
    assert result.exit_code == 2, result.output
    first = result.output.strip().splitlines()[0]
    assert first.startswith("error: ") and path.name in first, result.output


@given(data=garbage(b'[{"id": "no_commas"}, {"id": "word_count", "min": 2}]'))
@FUZZ
def test_verify_constraints_file(tmp_path, data):
    path = tmp_path / "c.json"
    path.write_bytes(data)
    result = runner.invoke(app, ["verify", "constraints", "--response", "a b", "--constraints", str(path)])
    assert_clear_error(result, path)


def test_a_constraint_id_of_the_wrong_type_names_the_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('[{"id": []}]')
    result = runner.invoke(app, ["verify", "constraints", "--response", "x", "--constraints", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: bad constraints file {str(path)!r}: constraint #0: unknown constraint "
                                    "id []")


@given(data=garbage(b'{"io": [{"input": "1\\n", "output": "2\\n"}], "asserts": ["f(1) == 2"]}'),
       program=st.sampled_from([b"print(1)", b"\xff\xfeprint(1)"]))
@FUZZ
def test_verify_code_tests_and_program_files(tmp_path, data, program):
    # a valid tests file would run the sandbox: the fuzzing is of the reading, so valid ones are skipped
    try:
        valid = bool(json.loads(data)) and isinstance(json.loads(data), dict) and set(json.loads(data)) <= {"io",
                                                                                                        "asserts"}
    except (ValueError, RecursionError):
        valid = False
    if valid and program == b"print(1)":
        return
    tests, prog = tmp_path / "t.json", tmp_path / "p.py"
    tests.write_bytes(data)
    prog.write_bytes(program)
    result = runner.invoke(app, ["verify", "code", "--program", str(prog), "--tests", str(tests)])
    assert_clear_error(result, prog if program != b"print(1)" else tests)


@given(data=garbage(b'[algo]\nsteps = 3\n[task]\nname = "addition"\n'))
@FUZZ
def test_recipe_toml(tmp_path, data):
    path = tmp_path / "r.toml"
    path.write_bytes(data)
    assert_clear_error(runner.invoke(app, ["config", str(path)]), path)


@given(data=garbage(b'{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/mean": 0.7}\n'),
       config=st.sampled_from([None, b"{}", b"\xff", b'{"monitors": 3}', b"[1]"]))
@FUZZ
def test_monitor_run_dir(tmp_path, data, config):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_bytes(data)
    if config is not None:
        (run / "config.json").write_bytes(config)
    assert_clear_error(runner.invoke(app, ["monitor", str(run)]), run)


@pytest.fixture(scope="module")
def label_db(tmp_path_factory):
    pytest.importorskip("sqlalchemy")
    db = str(tmp_path_factory.mktemp("label") / "f.db")
    assert runner.invoke(app, ["label", "create-project", "p", "--db", db]).exit_code == 0
    return db


@given(data=garbage(b'{"prompt": "2+2?", "responses": ["4", "5"]}\n'))
@FUZZ
def test_label_import_jsonl(tmp_path, label_db, data):
    path = tmp_path / "items.jsonl"
    path.write_bytes(data)
    result = runner.invoke(app, ["label", "import", "p", str(path), "--db", label_db])
    assert_clear_error(result, path)


@given(data=st.one_of(garbage(b"GGUF\x03\x00\x00\x00" + bytes(16)), st.binary(max_size=40).map(lambda b: b"GGUF" + b)))
@settings(FUZZ, max_examples=6)
def test_gguf_file(tmp_path, monkeypatch, data):
    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 2
    assert_clear_error(result, path)


@given(config=garbage(b'{"model_type": "llama", "hidden_size": 8}'))
@settings(FUZZ, max_examples=6)
def test_model_or_checkpoint_dir(tmp_path, config):
    ckpt = tmp_path / "step_000001"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_bytes(config)
    result = runner.invoke(app, ["eval", str(ckpt)])
    assert result.exit_code == 2
    assert_clear_error(result, ckpt)


def assert_reader_error(read, path: Path) -> None:
    """`read(path)` succeeds, or raises an error the CLI reports as one line naming the file."""
    try:
        read(path)
    except user_errors() as e:
        assert str(path) in str(e).splitlines()[0], str(e)


PAIR = b'{"prompt": "2+2?", "chosen": "4", "rejected": "5"}\n'


@given(data=garbage(PAIR * 2), suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]))
@FUZZ
def test_preference_data_files(tmp_path, data, suffix):
    # prefs.path: what `train` loads for dpo and reward_model runs
    path = tmp_path / f"prefs{suffix}"
    path.write_bytes(data)
    assert_reader_error(lambda p: load_preference_pairs(p, on_bad_row="drop"), path)
    assert_reader_error(lambda p: load_rankings(p, on_bad_row="drop"), path)


@given(data=garbage(b'{"prompt": "1+1=", "answer": "2"}\n' * 3),
       suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]))
@FUZZ
def test_task_data_files(tmp_path, data, suffix):
    # task.name = "dataset", task.options.path: what `train` and `eval` build the task from
    path = tmp_path / f"task{suffix}"
    path.write_bytes(data)
    assert_reader_error(lambda p: DatasetTask(path=str(p), heldout_fraction=0.0), path)


def test_a_non_utf8_preference_file_names_the_file(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(PAIR + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(user_errors(), match=r"prefs.jsonl: not UTF-8 text \(byte 66: invalid continuation byte\)"):
        load_preference_pairs(path, on_bad_row="drop")


def test_gguf_needs_accelerate_and_says_which_extra(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("FEEDBACKRL_CACHE", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(20))
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith("error: reading a .gguf model needs the package(s) ['accelerate']: "
                                    "`pip install 'feedbackrl[gguf]'`")


@pytest.mark.parametrize("data", [b"\xff\xfe\x00", b"[" * 100_000, b"a = " + b"[" * 100_000], ids=["utf16", "deep-json",
                                                                                               "deep-toml"])
@pytest.mark.parametrize("command", ["config", "constraints", "import"])
def test_invalid_utf8_and_deep_nesting(tmp_path, label_db, data, command):
    path = tmp_path / "f.in"
    path.write_bytes(data)
    args = {"config": ["config", str(path)],
            "constraints": ["verify", "constraints", "--response", "x", "--constraints", str(path)],
            "import": ["label", "import", "p", str(path), "--db", label_db]}[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert_clear_error(result, path)
