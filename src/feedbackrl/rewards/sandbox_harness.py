"""Inside the sandbox's runner process: run the program, then serve the judge's calls into it.

A fresh interpreter (`python -I -S -B`, standard library only) that the judge starts with `execve`
once the process is locked down (uid, rlimits, fds), so nothing of the judge's memory (the tests
included) is in it; see `sandbox.py` for the threat model. fd 4 holds the job (marshal: code,
nonce, mode, the CPU limit, and the program's stdin in io mode). Reports are lines `<nonce> <message>` on fd 3:

    L <names>         the program loaded (its top level ran); <names> is `encode`d [[name, kind], ...]
    E <ExcName>       the program's top level raised (SystemExit included, in call mode)
    R <seq> v <json>  reply to request <seq>: a plain value, encoded by `encode`
    R <seq> h <n> <T> reply: not plain data, kept here as handle <n> (of type T)
    R <seq> e <Exc>   reply: the request raised Exc

In call mode, requests come from the judge on fd 0 as length-prefixed marshal tuples
(seq, op, target, arg): op "get" (a global, or an attribute of a handle), "call" (arg is (args,
kwargs, [(position or keyword, handle)]): plain data, and handles in the listed places), "list"
(materialise an iterable) or "exec" (a test the judge could not decide, run here, in the
program's namespace). The judge decides every check; this process only
computes values, and the judge trusts nothing it says beyond plain data.
"""

from __future__ import annotations

import os
import sys

# Taken at import, before any program runs. After it starts, the harness reaches builtins only
# through these saved references (and methods of the exact builtin types, which Python code cannot
# patch), so a program that rebinds `builtins.int`, `eval`, `BaseException`, ... cannot bend it.
_exec, _compile, _type, _isinstance, _id, _len, _callable = exec, compile, type, isinstance, id, len, callable
_int, _float, _complex, _str, _bytes, _dict, _list = int, float, complex, str, bytes, dict, list
_enumerate, _getattr = enumerate, getattr
_BaseException, _SystemExit = BaseException, SystemExit
_SEQ_TAGS = {id(list): "l", id(tuple): "t", id(set): "S", id(frozenset): "F"}
_BASES = (str, bytes, int, float, complex, list, tuple, dict, set, frozenset)
_FLOAT_TOKENS = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}
_LIST_CAP = 100_000  # items taken from an iterable the judge asks to materialise


def main() -> int:
    """Entry point after `execve`: read the job from fd 4 and run it; returns the exit code."""
    import marshal

    with open(4, "rb") as f:
        job = marshal.loads(f.read())
    return run(job["code"], job["nonce"], job["serve"], job["stdin"], job["cpu_s"])


def run(code: str, nonce_text: str, serve: bool, stdin: bytes | None = None, cpu_s: int | None = None) -> int:
    """Run the program as __main__, then (call mode) serve requests until fd 0 closes.

    The job's CPU limit and (io style) its stdin come with the job: the runner may have been
    started before the job was known. Both are in place before any of the program runs.
    """
    import builtins
    import io
    import types

    if cpu_s is not None:  # lowering a limit needs no privilege
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    if stdin is not None:
        fd = os.memfd_create("stdin")  # the program's stdin: a file, so no writer can block on it
        view = memoryview(stdin)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(fd, 0)
        os.close(fd)
    nonce, write = nonce_text.encode(), os.write

    def report(line: str) -> None:
        write(3, nonce + b" " + line.encode() + b"\n")

    os.environ.clear()  # interpreter start-up may set LC_CTYPE (locale coercion)
    original = dict(builtins.__dict__)
    requests = os.dup(0) if serve else -1
    if serve:  # the program's stdin is empty; the judge's requests stay on a private fd
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    stdout = sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = ["program.py"]
    sys.modules.pop(__name__, None)  # `import sandbox_harness` must not hand the program our globals
    main_module = sys.modules["__main__"] = types.ModuleType("__main__")
    ns = main_module.__dict__
    try:
        _exec(_compile(code, "program.py", "exec"), ns)
    except _SystemExit as exc:
        if serve:
            report("E SystemExit")  # the tests never ran: an early exit, whatever the code
        return _exit_code(exc, stdout)
    except _BaseException as exc:
        report(f"E {_name(exc)}")
        _print_exception(exc)
        return 1
    if not serve:
        return _finish_script(stdout)
    names = [[k, "c" if _callable(v) else "v"] for k, v in _list(_dict.items(ns))
             if _type(k) is _str and not k.startswith("__")]
    report(f"L {encode(names)}")
    _serve(requests, ns, original, report)
    _flush(stdout)
    return 0


def _serve(fd: int, ns: dict, original: dict, report: object) -> None:
    import marshal

    handles: list = []
    while True:
        frame = _read_exactly(fd, 4)
        if frame is None:
            return
        request = _read_exactly(fd, _int.from_bytes(frame, "big"))
        if request is None:
            return
        seq, op, target, arg = marshal.loads(request)
        try:
            reply = "v " + encode(_answer(op, target, arg, ns, original, handles))
        except _Handle as kept:
            handles.append(kept.value)
            reply = f"h {_len(handles) - 1} {_name_of(_type(kept.value))}"
        except _BaseException as exc:
            reply = f"e {_name(exc)}"
        report(f"R {seq} {reply}")


class _Handle(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, value: object) -> None:
        self.value = value


def _answer(op: str, target: object, arg: object, ns: dict, original: dict, handles: list) -> object:
    if op == "exec":
        scope = _dict(ns)
        scope["__builtins__"] = _dict(original)
        _exec(_compile(arg, "<test>", "exec"), scope)
        return True
    obj = ns[target] if _type(target) is _str else handles[target]
    if op == "get":
        value = obj if arg is None else _getattr(obj, arg)
    elif op == "call":
        args, kwargs, kept = arg
        for key, handle in kept:  # arguments that are the program's own objects, by handle
            (args if _type(key) is _int else kwargs)[key] = handles[handle]
        value = obj(*args, **kwargs)
    elif op == "list":
        value = []
        for item in obj:
            if _len(value) >= _LIST_CAP:
                break
            value.append(item)
    else:
        raise ValueError(op)
    try:
        encode(value)
    except Unencodable:
        raise _Handle(value) from None
    return value


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = b""
    while _len(data) < n:
        chunk = os.read(fd, n - _len(data))
        if not chunk:
            return None
        data += chunk
    return data


class Unencodable(Exception):
    """A value that is not made of plain builtin types, so the judge cannot compare it safely."""


def encode(value: object, depth: int = 0) -> str:
    """JSON text for a plain builtin value, tagged so the judge can rebuild it exactly.

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
