"""Code execution reward: test parsing, value transport, and benign programs scored end to end.

Attacks on the sandbox live in test_sandbox_adversarial.py.
"""

from __future__ import annotations

import json
import math
from collections import namedtuple
from textwrap import dedent

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedbackrl.rewards import sandbox
from feedbackrl.rewards.code import (
    BadTests,
    CodeVerifier,
    extract_program,
    normalize_output,
    parse_tests,
)
from feedbackrl.rewards.sandbox_checks import decode_value
from feedbackrl.rewards.sandbox_harness import Unencodable, encode
from feedbackrl.rewards.verdict import Problem

ISOLATED = all(sandbox.probe().values())
needs_sandbox = pytest.mark.sandbox

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]}
SUM_IO = {"io": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"},
                 {"input": "0 0\n", "output": "0\n"}]}
SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
def verifier(sandbox_required: None) -> CodeVerifier:
    return CodeVerifier(timeout_s=1.5)


# ------------------------------------------------------------------------------ pure functions


@pytest.mark.parametrize(("completion", "program"), [
    pytest.param("print(1)", "print(1)", id="no-fence-whole-text"),
    pytest.param("Here:\n```python\nprint(2)\n```\nDone.", "print(2)\n", id="python-fence"),
    pytest.param("```py\nx = 1\n```", "x = 1\n", id="py-fence"),
    pytest.param("```Python3 title\nx = 3\n```", "x = 3\n", id="python3-fence-with-info"),
    pytest.param("```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```", "x = 2\n", id="last-block-wins"),
    pytest.param("```python\nx = 1\nstill going", "x = 1\nstill going", id="unclosed-fence"),
    pytest.param("```\nplain\n```", "```\nplain\n```", id="unlabelled-fence-is-not-python"),
])
def test_extract_program(completion: str, program: str) -> None:
    assert extract_program(completion) == program


@pytest.mark.parametrize(("got", "want", "equal"), [
    ("3\n", "3", True),
    ("3   \n\n\n", "3\n", True),
    ("1 2 \r\n3\t\n", "1 2\n3\n", True),
    (" 3\n", "3\n", False),  # leading whitespace counts
    ("1\n\n2\n", "1\n2\n", False),  # blank lines inside the output count
    ("", "\n", True),
])
def test_normalize_output(got: str, want: str, equal: bool) -> None:
    assert (normalize_output(got) == normalize_output(want)) is equal


@pytest.mark.parametrize("answer", [
    pytest.param(None, id="none"),
    pytest.param([], id="list"),
    pytest.param({}, id="empty-dict"),
    pytest.param({"io": [], "asserts": []}, id="no-tests"),
    pytest.param({"tests": []}, id="unknown-key"),
    pytest.param({"io": [{"input": "1"}]}, id="io-missing-output"),
    pytest.param({"io": "1 2"}, id="io-not-a-list"),
    pytest.param({"asserts": [3]}, id="assert-not-a-string"),
    pytest.param({"asserts": ["assert f(1) =="]}, id="assert-syntax-error"),
    pytest.param("{not json", id="bad-json-string"),
])
def test_parse_tests_rejects_bad_specs(answer: object) -> None:
    with pytest.raises(BadTests):
        parse_tests(answer)


def test_parse_tests_keeps_test_sources_whole() -> None:
    tests = ["assert f(1) == 'SECRET'", "x = f(4)\nassert x == 5", "def check(c):\n    assert c(1) < 2\ncheck(f)"]
    plan = parse_tests(json.dumps({"asserts": tests, "io": [{"input": "1\n", "output": "2\n"}]}))
    assert (plan.asserts, plan.io) == (tests, [("1\n", "2\n")])


def test_only_the_program_and_io_inputs_enter_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the runner process is started with (sandbox_judge.Runner's job): code, nonce, mode.
    # The tests go to the judge, which never hands them to the runner (it exec()s a fresh interpreter).
    sent = []
    monkeypatch.setattr("feedbackrl.rewards.code.run_program", lambda program, **kw: sent.append(kw) or {"leaked": 0})
    CodeVerifier(allow_unsafe=True)(Problem("", {"asserts": ["assert f(1) == 'SECRET'"],
                                                 "io": [{"input": "in", "output": "SECRET2"}]}), "x = 1")
    assert [kw.get("inputs") for kw in sent] == [["in"], None]
    assert sent[1]["tests"] == ["assert f(1) == 'SECRET'"] and "SECRET2" not in repr(sent)


@pytest.mark.parametrize("value", [
    0, -7, 2**5000, -(2**4001), 1.5, -0.0, math.inf, -math.inf, 1e300, "", "héllo\n\"q\"", "\udc80",
    b"\x00\xff", 1 + 2j, None, True, False, [], (), set(), frozenset({1}), [1, (2, "x"), {3}],
    {"a": [1, 2], (1, 2): {"b": None}}, [[[[1]]]],
], ids=repr)
def test_encode_decode_round_trip(value: object) -> None:
    back = decode_value(encode(value))
    assert back == value and type(back) is type(value)


def test_encode_nan_is_never_equal() -> None:
    assert math.isnan(decode_value(encode(math.nan)))


def test_encode_builtin_subclasses_without_custom_eq() -> None:
    point = namedtuple("Point", "x y")(1, 2)
    assert decode_value(encode(point)) == (1, 2)


def test_encode_refuses_objects_that_choose_their_own_equality() -> None:
    class AlwaysEqual:
        def __eq__(self, other: object) -> bool:
            return True

    class SneakyInt(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    for value in (AlwaysEqual(), SneakyInt(3), [1, AlwaysEqual()], {"k": SneakyInt(1)}):
        with pytest.raises(Unencodable):
            encode(value)


# ----------------------------------------------------------------------- construction and probe


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"timeout_s": 0}, "timeout_s"), ({"memory_mb": 8}, "memory_mb"),
    ({"max_output_bytes": 0}, "max_output_bytes"), ({"timeout_s": "2"}, "timeout_s"),
])
def test_constructor_names_the_bad_limit(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CodeVerifier(allow_unsafe=True, **kwargs)


def test_refuses_without_isolation_unless_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    found = {"linux": True, "root": False, "unshare": True, "namespaces": False}
    monkeypatch.setattr(sandbox, "probe", lambda: found)
    with pytest.raises(sandbox.SandboxUnavailable, match="root, namespaces"):
        CodeVerifier()
    monkeypatch.setattr("feedbackrl.rewards.code.probe", lambda: found)
    unsafe = CodeVerifier(allow_unsafe=True, timeout_s=1.5)
    assert unsafe.isolate is False
    verdict = unsafe(Problem("", ADD_TESTS), ADD)  # rlimits and a session only, but it runs
    assert verdict.score == 1.0, verdict


# ------------------------------------------------------------------------ benign programs, scored


def test_gold_io_program_scores_one(verifier: CodeVerifier) -> None:
    verdict = verifier(Problem("add two numbers", SUM_IO), f"```python\n{SUM_PROGRAM}```")
    assert (verdict.score, verdict.passed) == (1.0, True), verdict
    assert [t["reason"] for t in verdict.details["tests"]] == ["ok", "ok", "ok"]


def test_io_partial_credit_and_whitespace(verifier: CodeVerifier) -> None:
    # Right on 1 2 -> 3 and 0 0 -> 0 (trailing spaces ignored); wrong on 10 -4 (prints 14).
    program = "a, b = map(int, input().split())\nprint(abs(a) + abs(b), '  ')\n"
    verdict = verifier(Problem("", SUM_IO), program)
    assert verdict.score == pytest.approx(2 / 3)
    assert not verdict.passed
    assert [t["reason"] for t in verdict.details["tests"]] == ["ok", "wrong_output", "ok"]
    assert verdict.details["tests"][1]["stdout"].strip() == "14"


def test_io_runtime_error_reports_stderr(verifier: CodeVerifier) -> None:
    verdict = verifier(Problem("", {"io": [{"input": "x\n", "output": "1\n"}]}), SUM_PROGRAM)
    assert verdict.details["tests"][0]["reason"] == "runtime_error"
    assert "ValueError" in verdict.details["stderr_tail"]
    assert verdict.details["stderr_tail"].startswith("Traceback")


def test_io_exit_code_matters(verifier: CodeVerifier) -> None:
    problem = Problem("", {"io": [{"input": "", "output": "hi\n"}]})
    assert verifier(problem, "import sys\nprint('hi')\nsys.exit(0)").score == 1.0
    assert verifier(problem, "import sys\nprint('hi')\nsys.exit(3)").details["tests"][0]["reason"] == \
        "runtime_error"


def test_gold_assert_program_scores_one(verifier: CodeVerifier) -> None:
    verdict = verifier(Problem("", ADD_TESTS), ADD)
    assert (verdict.score, verdict.passed, verdict.reason) == (1.0, True, "passed 3/3 tests")


def test_assert_partial_credit(verifier: CodeVerifier) -> None:
    # Right on the two int tests, wrong (0 instead of 'ab') on the string test: 2/3.
    program = "def add(a, b):\n    return int(a) + int(b) if a != 'a' else 0"
    verdict = verifier(Problem("", ADD_TESTS), program)
    assert verdict.score == pytest.approx(2 / 3)
    assert [t["reason"] for t in verdict.details["tests"]] == ["ok", "ok", "wrong_output"]


def test_assert_styles(verifier: CodeVerifier) -> None:
    tests = {"asserts": [
        "assert add(1, 1) == 2 and add(2, 2) == 4",  # conjunction of host-checked equalities
        "assert abs(add(0.1, 0.2) - 0.3) < 1e-9",  # judged in the sandbox
        "assert add(None, None) is None",
        "import math\nassert math.isclose(add(1, 1), 2.0)",  # a statement block
        "assert add([1], [2]) == [1, 2]",
    ]}
    program = "def add(a, b):\n    return None if a is None else a + b"
    verdict = verifier(Problem("", tests), program)
    assert verdict.score == 1.0, verdict.details


def test_test_shapes_decided_by_the_judge(verifier: CodeVerifier) -> None:
    program = dedent("""\
        class Stack:
            def __init__(self):
                self.items = []
            def push(self, x):
                self.items.append(x)
            def pop(self):
                return self.items.pop()
        def evens(n):
            return (i for i in range(n) if i % 2 == 0)
        def parse(s):
            if not s.isdigit():
                raise ValueError(s)
            return int(s)
        LIMIT = 10
        """)
    tests = {"asserts": [
        "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and s.items == [1]",  # methods on a handle
        "assert list(evens(5)) == [0, 2, 4]",  # a generator, materialised
        "try:\n    parse('x')\n    assert False\nexcept ValueError:\n    pass",  # an expected exception
        "assert 0 <= parse('7') < LIMIT != 3",  # chained comparison, a global value
        "def check(candidate):\n    assert candidate('12') == 12\ncheck(parse)",
        "assert parse('1') == 2",  # wrong
        "assert Stack() == Stack()",  # program objects are not plain data
        "parse('-')",  # the program's exception is a runtime error
        "import sys\nsys.exit(0)",  # a test that leaves early has not passed
    ]}
    verdict = verifier(Problem("", tests), program)
    assert [t["reason"] for t in verdict.details["tests"]] == ["ok"] * 5 + ["wrong_output"] * 2 + ["runtime_error"] * 2
    assert verdict.details["tests"][5]["detail"] == "failed: assert parse('1') == 2"
    assert verdict.details["tests"][7]["detail"] == "ValueError: ValueError, raised by the program"


def test_assert_runtime_error_and_recovery_after_timeout(verifier: CodeVerifier) -> None:
    tests = {"asserts": ["assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]}
    program = ("def f(x):\n    if x == 1:\n        raise KeyError(x)\n"
               "    while x == 2:\n        pass\n    return x\n")
    verdict = verifier(Problem("", tests), program)
    assert [t["reason"] for t in verdict.details["tests"]] == ["ok", "runtime_error", "timeout", "ok"]
    assert verdict.score == 0.5


def test_both_styles_in_one_problem(verifier: CodeVerifier) -> None:
    tests = {"io": [{"input": "2 3\n", "output": "5\n"}], "asserts": ["assert add(2, 3) == 5"]}
    program = ADD + "if __name__ == '__main__':\n    import sys\n    data = sys.stdin.read().split()\n" \
        "    if data:\n        print(add(*map(int, data)))\n"
    verdict = verifier(Problem("", tests), program)
    assert verdict.score == 1.0, verdict.details
    assert [t["test"] for t in verdict.details["tests"]] == ["io[0]", "asserts[0]"]


def test_standard_library_works_inside(verifier: CodeVerifier) -> None:
    program = ("import collections, heapq, itertools, json, math, re, functools, tempfile\n"
               "with open('scratch.txt', 'w') as f:\n    f.write('ok')\n"
               "print(open('scratch.txt').read(), math.comb(5, 2), tempfile.gettempdir())\n")
    verdict = verifier(Problem("", {"io": [{"input": "", "output": "ok 10 /tmp/w\n"}]}), program)
    assert verdict.score == 1.0, verdict.details


@pytest.mark.parametrize("completion", [
    pytest.param("", id="empty"), pytest.param("   \n", id="blank"),
    pytest.param("```python\n```", id="empty-fence"), pytest.param("def add(a, b) return", id="syntax-error"),
    pytest.param("\x00\xff garbage \udcff", id="binary-junk"), pytest.param(None, id="none"),
    pytest.param(42, id="int"),
])
def test_garbage_completion_scores_zero_with_reason(verifier: CodeVerifier, completion: object) -> None:
    verdict = verifier(Problem("", ADD_TESTS), completion)  # type: ignore[arg-type]
    assert verdict.score == 0.0 and not verdict.passed and verdict.reason


@pytest.mark.parametrize("answer", [None, "nonsense", {"asserts": "assert x"}, 12])
def test_garbage_tests_score_zero_and_never_raise(verifier: CodeVerifier, answer: object) -> None:
    verdict = verifier(Problem("", answer), ADD)
    assert verdict.score == 0.0 and verdict.reason.startswith("bad tests")


_junk_answers = st.one_of(
    st.none(), st.integers(), st.text(max_size=30),
    st.dictionaries(st.sampled_from(["io", "asserts", "x"]),
                    st.lists(st.one_of(st.text(max_size=20), st.dictionaries(st.text(max_size=6),
                                                                            st.text(max_size=6))),
                             max_size=3), max_size=2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_junk_answers, completion=st.text(max_size=80))
def test_never_raises_on_junk(verifier: CodeVerifier, answer: object, completion: str) -> None:
    verdict = verifier(Problem("", answer), completion)
    assert 0.0 <= verdict.score <= 1.0 and verdict.reason


def test_batch_matches_one_by_one(verifier: CodeVerifier) -> None:
    problems = [Problem("", ADD_TESTS), Problem("", SUM_IO), Problem("", ADD_TESTS), Problem("", SUM_IO)]
    completions = [ADD, SUM_PROGRAM, "def add(a, b):\n    return 3", "print(3)"]
    batch = verifier.batch(problems, completions, workers=2)
    one_by_one = [verifier(p, c) for p, c in zip(problems, completions, strict=True)]
    assert [v.score for v in batch] == [v.score for v in one_by_one]
    assert [round(v.score, 3) for v in batch] == [1.0, 1.0, 0.333, 0.333]
    with pytest.raises(ValueError, match="one completion per problem"):
        verifier.batch(problems, completions[:1])


def test_cli_verify_code(tmp_path: pytest.TempPathFactory, verifier: CodeVerifier) -> None:
    from typer.testing import CliRunner

    from feedbackrl.cli_verify import verify_app

    program, tests = tmp_path / "prog.py", tmp_path / "tests.json"
    program.write_text(ADD)
    tests.write_text(json.dumps(ADD_TESTS))
    result = CliRunner().invoke(verify_app, ["code", "--program", str(program), "--tests", str(tests),
                                             "--timeout", "1.5"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert (verdict["score"], verdict["passed"]) == (1.0, True)
    assert len(verdict["details"]["tests"]) == 3
