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

# Taken at import, before any program runs. After it starts, the harness reaches builtins only
# through these saved references (and methods of the exact builtin types, which Python code cannot
# patch), so a program that rebinds `builtins.int`, `eval`, `BaseException`, ... cannot bend it.
_eval, _exec, _compile, _type, _isinstance, _id, _len = eval, exec, compile, type, isinstance, id, len
_int, _float, _complex, _str, _bytes, _dict = int, float, complex, str, bytes, dict
_enumerate = enumerate
_BaseException, _SystemExit, _CodeType = BaseException, SystemExit, type(_compile("0", "", "eval"))
# Keyed by id: a metaclass can fake __eq__/__hash__ to look like `bool`, but not its id.
_TRUTH_TYPES = frozenset(map(id, (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset,
                                  type(None))))
_SEQ_TAGS = {id(list): "l", id(tuple): "t", id(set): "S", id(frozenset): "F"}
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
    sys.modules.pop(__name__, None)  # `import sandbox_harness` must not hand the program our globals
    main = sys.modules["__main__"] = types.ModuleType("__main__")  # nor `import __main__` the judge's
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
    for i, checks in _enumerate(tests, start):
        for j, check in _enumerate(checks):
            if not _run_check(check, _test_scope(ns, check, original), report, f"{i} {j}"):
                break
        report(f"D {i}")
    return 0


def _compile_check(check: dict) -> tuple[str, list, list[str]]:
    """(kind, code objects, builtin-looking names they use); kind "error" if it does not compile."""
    kind, src = next(iter(check.items()))
    try:
        if kind == "eq":
            codes = [None if s is None else _compile(s, "<test>", "eval") for s in src]
        else:
            codes = [_compile(src, "<test>", "eval" if kind == "truth" else "exec")]
    except _BaseException as exc:
        return "error", [_name(exc)], []
    names: list[str] = []
    stack = [c for c in codes if c is not None]
    while stack:  # nested code too: comprehensions and lambdas in the test
        code = stack.pop()
        names += [n for n in code.co_names if not n.startswith("__")]
        stack += [c for c in code.co_consts if _type(c) is _CodeType]
    return kind, codes, names


def _test_scope(ns: dict, check: tuple[str, list, list[str]], original: dict) -> dict:
    """The program's globals, but the builtins a test names are the real ones.

    Tests are written against Python's builtins: a program that defines `isinstance` or `sorted`
    at top level (or patches `builtins`) changes what its own code sees, not what the test sees.
    """
    scope = _dict(ns)
    scope["__builtins__"] = _dict(original)
    for name in check[2]:
        if name in original:
            scope[name] = original[name]
    return scope


def _run_check(check: tuple[str, list, list[str]], scope: dict, report: object, ij: str) -> bool:
    """Evaluate one check and report what it saw; True if the test's next check should run."""
    kind, codes, _ = check
    try:
        if kind == "error":
            report(f"F {ij} {codes[0]}")
            return False
        if kind == "eq":
            for k, code in _enumerate(codes):  # each side is reported before the next one runs
                if code is not None:
                    report(f"V {ij} {k} {encode(_eval(code, scope))}")
            return True
        if kind == "truth":
            value = _eval(codes[0], scope)
            # Truthiness of a program-defined class is whatever its __bool__ says: refuse it.
            ok = value is True or (_id(_type(value)) in _TRUTH_TYPES and not not value)  # noqa: SIM208
        else:
            _exec(codes[0], scope)
            ok = True
        report(f"T {ij} {'1' if ok else '0'}")
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
    if t is _int:  # huge ints in hex: decimal conversion is capped at 4300 digits
        return f'["x","{_int.__format__(value, "x")}"]' if value.bit_length() > 4000 else _int.__repr__(value)
    if t is _float:
        return _FLOAT_TOKENS.get(_float.__repr__(value), _float.__repr__(value))
    if t is _str:
        return f'["s","{_str.encode(value, "utf-8", "surrogatepass").hex()}"]'
    if t is _bytes:
        return f'["b","{_bytes.hex(value)}"]'
    if t is _complex:
        return f'["c",{encode(value.real)},{encode(value.imag)}]'
    if depth > 100:
        raise Unencodable("nesting deeper than 100")
    if _id(t) in _SEQ_TAGS:
        return f'["{_SEQ_TAGS[_id(t)]}"' + "".join("," + encode(v, depth + 1) for v in value) + "]"
    if t is _dict:
        pairs = _dict.items(value)
        return '["d"' + "".join(f",{encode(k, depth + 1)},{encode(v, depth + 1)}" for k, v in pairs) + "]"
    for base in _BASES:
        if _isinstance(value, base) and t.__eq__ is base.__eq__:
            return encode(base(value), depth)
    raise Unencodable(f"a {_name_of(t)} is not a plain builtin value")


def _name_of(t: type) -> str:
    name = _type.__dict__["__name__"].__get__(t)  # the real name, whatever a metaclass pretends
    return name if name.isidentifier() and _len(name) <= 60 else "object"


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
