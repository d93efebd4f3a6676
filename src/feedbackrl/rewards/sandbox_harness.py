"""Inside the sandbox's runner process: run the program, then the tests' checks; report on fd 3.

Standard library only (it runs under `python -I -S`, loaded by `sandbox_judge.py`). The runner is
already locked down (uid, rlimits, fds 0-3) when `run` is called; see `sandbox.py` for the threat
model. Reports are lines `<nonce> <message>` on fd 3; messages, with `i j k` = test, check, side:

    L                 the program loaded (its top level ran to the end)
    E <ExcName>       the program's top level raised (SystemExit included, in assert style)
    V i j k <json>    value of side k of an `a == b` check, encoded by `encode`
    T i j 0|1         a truth or statement check failed or held
    F i j <ExcName>   evaluating check j raised (or its value was not a plain builtin value)
    D i               test i finished (its checks stop at the first failure)

The host decides pass/fail from these; expected values never reach this process.
"""

from __future__ import annotations

import os
import sys

# Taken at import, before any program runs: the harness below only calls these saved references,
# so a program that rebinds `builtins.eval`, `type` or `BaseException` cannot bend it.
_eval, _exec, _type, _isinstance, _compile = eval, exec, type, isinstance, compile
_BaseException, _SystemExit = BaseException, SystemExit
_TRUTH_TYPES = frozenset({bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset,
                          type(None)})
_SEQ_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
_BASES = (str, bytes, int, float, complex, list, tuple, dict, set, frozenset)
_FLOAT_TOKENS = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}


def run(spec: dict, start: int | None) -> int:
    """Run the program as __main__, then (assert style) tests start..; returns the exit code."""
    import builtins
    import io
    import types

    nonce, write = spec["nonce"].encode(), os.write

    def report(line: str) -> None:
        write(3, nonce + b" " + line.encode() + b"\n")

    # Compiled before the program runs, so it cannot replace `compile` under us.
    tests = [] if start is None else [[_compile_check(c) for c in t] for t in spec["checks"][start:]]
    original = dict(builtins.__dict__)
    sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    stdout = sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = ["program.py"]
    main = sys.modules["__main__"] = types.ModuleType("__main__")  # hide the judge's module
    ns = main.__dict__
    try:
        _exec(_compile(spec["code"], "program.py", "exec"), ns)
    except _SystemExit as exc:
        if start is not None:
            report("E SystemExit")  # the asserts never ran: an early exit, whatever the code
        return _exit_code(exc, stdout)
    except _BaseException as exc:
        report(f"E {_name(exc)}")
        _print_exception(exc)
        return 1
    if start is None:
        return _finish_script(stdout)
    report("L")
    for i, checks in enumerate(tests, start):
        for j, check in enumerate(checks):
            ns["__builtins__"] = dict(original)  # tests see the builtins as they were
            if not _run_check(check, ns, report, f"{i} {j}"):
                break
        report(f"D {i}")
    return 0


def _compile_check(check: dict) -> tuple[str, list]:
    kind, src = next(iter(check.items()))
    try:
        if kind == "eq":
            return kind, [None if s is None else _compile(s, "<test>", "eval") for s in src]
        return kind, [_compile(src, "<test>", "eval" if kind == "truth" else "exec")]
    except _BaseException as exc:
        return "error", [_name(exc)]


def _run_check(check: tuple[str, list], ns: dict, report: object, ij: str) -> bool:
    """Evaluate one check and report what it saw; True if the test's next check should run."""
    kind, codes = check
    try:
        if kind == "error":
            report(f"F {ij} {codes[0]}")
            return False
        if kind == "eq":
            for k, code in enumerate(codes):  # each side is reported before the next one runs
                if code is not None:
                    report(f"V {ij} {k} {encode(_eval(code, ns))}")
            return True
        if kind == "truth":
            value = _eval(codes[0], ns)
            # Truthiness of a program-defined class is whatever its __bool__ says: refuse it.
            ok = value is True or (_type(value) in _TRUTH_TYPES and not not value)  # noqa: SIM208
        else:
            _exec(codes[0], ns)
            ok = True
        report(f"T {ij} {int(ok)}")
        return ok
    except _BaseException as exc:
        report(f"F {ij} {_name(exc)}")
        return False


class Unencodable(Exception):
    """A value that is not made of plain builtin types, so the host cannot compare it safely."""


def encode(value: object, depth: int = 0) -> str:
    """JSON text for a plain builtin value, tagged so the host can rebuild it exactly.

    Only exact builtin types are encoded, by C-level methods, so no program code runs while the
    harness encodes; subclasses are accepted when they keep the builtin `__eq__`. An object with
    its own `__eq__` (the "always equal" hack) raises `Unencodable`.
    Tags: ["s", utf-8 hex], ["b", hex], ["x", hex int], ["c", re, im], ["l"|"t"|"S"|"F", items...],
    ["d", k1, v1, ...]; None, bools, small ints and floats are plain JSON.
    """
    t = _type(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if t is int:  # huge ints in hex: decimal conversion is capped at 4300 digits
        return f'["x","{int.__format__(value, "x")}"]' if value.bit_length() > 4000 else int.__repr__(value)
    if t is float:
        return _FLOAT_TOKENS.get(float.__repr__(value), float.__repr__(value))
    if t is str:
        return f'["s","{str.encode(value, "utf-8", "surrogatepass").hex()}"]'
    if t is bytes:
        return f'["b","{bytes.hex(value)}"]'
    if t is complex:
        return f'["c",{encode(value.real)},{encode(value.imag)}]'
    if depth > 100:
        raise Unencodable("nesting deeper than 100")
    if t in _SEQ_TAGS:
        return f'["{_SEQ_TAGS[t]}"' + "".join("," + encode(v, depth + 1) for v in value) + "]"
    if t is dict:
        pairs = dict.items(value)
        return '["d"' + "".join(f",{encode(k, depth + 1)},{encode(v, depth + 1)}" for k, v in pairs) + "]"
    for base in _BASES:
        if _isinstance(value, base) and t.__eq__ is base.__eq__:
            return encode(base(value), depth)
    raise Unencodable(f"a {_name_of(t)} is not a plain builtin value")


def _name_of(t: type) -> str:
    name = type.__dict__["__name__"].__get__(t)  # the real name, whatever a metaclass pretends
    return name if name.isidentifier() and len(name) <= 60 else "object"


def _name(exc: BaseException) -> str:
    if _isinstance(exc, Unencodable):
        return "Unencodable"
    return _name_of(_type(exc))


def _print_exception(exc: BaseException) -> None:
    import traceback

    try:  # skip our own frame: the program's traceback starts at program.py
        traceback.print_exception(_type(exc), exc, exc.__traceback__.tb_next)
    except _BaseException:
        return  # a hostile exception can break formatting; the report already carries its type


def _exit_code(exc: SystemExit, stdout: object) -> int:
    """The exit code CPython gives `sys.exit(arg)`."""
    arg = exc.code
    if arg is None or _type(arg) is int:
        code = arg or 0
    else:
        print(arg, file=sys.stderr)
        code = 1
    _flush(stdout)
    return code & 0xFF


def _finish_script(stdout: object) -> int:
    import atexit

    atexit._run_exitfuncs()  # a script's atexit output is part of its output
    _flush(stdout)
    return 0


def _flush(stdout: object) -> None:
    for stream in (stdout, sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _BaseException:
            continue  # a closed or replaced stream: what it held is lost, as in CPython
