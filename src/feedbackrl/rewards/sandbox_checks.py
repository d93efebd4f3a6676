"""The judge's side of an assert-style test: run the test's code here, calling into the program.

A test is any block of Python: `assert add(1, 2) == 3`, a loop over cases, or HumanEval's
`def check(candidate): ...` followed by `check(entry_point)`. The judge (a process the program
cannot signal, trace or read, running none of the program's code) executes it with its own
builtins and standard library; every name the program defined is bound to a `Remote` that turns
calls and attribute reads into requests to the runner. Replies are plain data (exact builtin
types, rebuilt by `decode_value`) or an opaque handle, so every comparison, `isinstance`,
`math.isclose` or loop in the test runs on values the program cannot make lie, and the test's
literals never reach the program. Standard library only, and nothing slow to import (typing,
collections): this runs inside the judge, once per job.
"""

from __future__ import annotations

import builtins
import marshal
import sys

# Exceptions a program's reply may name that a test may catch: the builtin ones, rebuilt here.
_CATCHABLE = {name: cls for name, cls in vars(builtins).items()
              if isinstance(cls, type) and issubclass(cls, Exception)}
# ... but not the ones that end an iteration: raised out of a call that `map`, `filter` or
# `iter(f, sentinel)` makes, StopIteration would end the test's loop (or make `all(map(...))`
# True) as if every case had passed. They come as RuntimeError, as PEP 479 does for generators.
_CATCHABLE["StopIteration"] = _CATCHABLE["StopAsyncIteration"] = RuntimeError
_DIED = {"MemoryError": "memory", "SystemExit": "early_exit"}
# Standard-library modules the judge never imports for a test that names them without importing
# them: they print (the judge's stdout carries its results), open a browser or a window.
_NOT_IMPORTED = frozenset({"this", "antigravity", "idlelib", "turtle", "turtledemo", "tkinter", "__hello__",
                           "__phello__"})


class ProgramError(Exception):
    """The program raised an exception that is not a builtin one (named in the message)."""


class NotPlainData(Exception):
    """The test used a program object that is not plain data as a value (compared it, ...)."""


class Stop(BaseException):  # noqa: N818 - ends the test; a bare `except:` in it cannot keep it alive
    """The test cannot go on: the runner died, the time ran out, or the test is undecidable here."""


class Remote:
    """A program object (a global, or a value that is not plain data), reachable only by request."""

    __slots__ = ("_conn", "_target", "_label")

    def __init__(self, conn: Connection, target: str | int, label: str) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_label", label)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._conn.request("call", self._target, (args, kwargs))

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._conn.request("get", self._target, name)

    def __iter__(self) -> object:
        return iter(self._conn.request("list", self._target, None))

    def __repr__(self) -> str:
        return f"<program object {self._label}>"

    def _refuse(self, *args: object) -> object:
        raise NotPlainData(f"the program's {self._label} is not plain data and cannot be compared or tested")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
    __hash__ = object.__hash__


class Connection:
    """Requests to one runner, through `send` (a callable of the judge); remembers why it stopped."""

    def __init__(self, send: object) -> None:
        self.send, self.seq, self.stopped = send, 0, ""

    def request(self, op: str, target: str | int, arg: object) -> object:
        if self.stopped:
            raise Stop(self.stopped)
        if op == "call":
            arg = _call_args(self, *arg)
        self.seq += 1
        reply = self.send((self.seq, op, target, arg))
        if isinstance(reply, str):  # the runner is gone: reply is why
            self.stop(reply)
        kind, rest = reply
        if kind == "v":
            return decode_value(rest)
        if kind == "h":
            handle, _, type_name = rest.partition(" ")
            return Remote(self, int(handle), f"{type_name[:60]} object")
        if rest in _DIED:
            self.stop(_DIED[rest])
        raise _CATCHABLE.get(rest, ProgramError)(f"{rest}, raised by the program")

    def stop(self, why: str) -> None:
        self.stopped = self.stopped or why
        raise Stop(self.stopped)


def _call_args(conn: Connection, args: tuple, kwargs: dict) -> tuple:
    """(args, kwargs, handles): program objects among the arguments travel as their handle numbers."""
    handles, args, kwargs = [], list(args), dict(kwargs)
    for key, value in [*enumerate(args), *kwargs.items()]:
        if type(value) is Remote and value._conn is conn and type(value._target) is int:
            handles.append((key, value._target))
            (args if type(key) is int else kwargs)[key] = None
    try:  # exact builtin types only: marshal refuses anything else, subclasses included
        marshal.dumps((args, kwargs))
    except ValueError:
        conn.stop("undecidable: the test passes the program a value that is not plain data")
    return args, kwargs, handles


def evaluate(source: str, conn: Connection, names: dict[str, str]) -> tuple[str, str]:
    """Run one test against the program here; (reason, detail), reason "ok" when it passed.

    `names` maps the program's globals to "c" (callable) or "v" (a value, fetched when bound).
    A test name that is a builtin stays the builtin, and one that names a standard-library module
    is the judge's own import of it, whatever the program binds to that name (a patched `math`,
    a fake in its `sys.modules`, a class called `math`); every other name the program defines is
    the program's, reached by request.
    """
    code = compile(source, "<test>", "exec")
    scope: dict[str, object] = {"__name__": "__test__", "__builtins__": builtins}
    try:
        for name in _free_names(code):
            if name not in names or hasattr(builtins, name):
                continue
            if name in sys.stdlib_module_names:
                if name not in _NOT_IMPORTED:  # not installed here: the name stays unbound (NameError)
                    try:  # noqa: SIM105 - contextlib would cost the judge its import on every job
                        scope[name] = __import__(name)
                    except ImportError:
                        pass
                continue
            kind = names[name]
            scope[name] = Remote(conn, name, f"'{name}'") if kind == "c" else conn.request("get", name, None)
        exec(code, scope)
        outcome = ("ok", "")
    except AssertionError as exc:
        outcome = ("wrong_output", f"failed: {_failed_line(source, exc)}")
    except Exception as exc:
        outcome = _error(exc)
    except Stop:
        outcome = ("", "")
    except (SystemExit, KeyboardInterrupt) as exc:  # the test's own code left: it did not pass
        outcome = ("runtime_error", f"the test raised {type(exc).__name__}")
    return _stopped(conn) or outcome


def evaluate_inside(source: str, conn: Connection) -> tuple[str, str]:
    """Run one test in the runner, in the program's namespace: for tests `evaluate` cannot decide."""
    try:
        conn.request("exec", "", source)
        outcome = ("ok", "")
    except AssertionError:
        outcome = ("wrong_output", "failed (decided inside the sandbox)")
    except Exception as exc:
        outcome = _error(exc)
    except Stop:
        outcome = ("", "")
    return _stopped(conn) or outcome


def _error(exc: Exception) -> tuple[str, str]:
    if isinstance(exc, NotPlainData):
        return "wrong_output", str(exc)
    if isinstance(exc, RecursionError):
        return "runtime_error", "the test hit the recursion limit"
    return "runtime_error", f"{type(exc).__name__}: {str(exc)[:200]}"


def _stopped(conn: Connection) -> tuple[str, str] | None:
    """Whatever the test caught, a dead runner, a lapsed deadline or an undecidable call decides."""
    if not conn.stopped:
        return None
    reason, _, why = conn.stopped.partition(": ")
    return reason, why


def _free_names(code: object) -> list[str]:
    names, stack = [], [code]
    while stack:  # nested code too: functions, comprehensions and lambdas in the test
        c = stack.pop()
        names += c.co_names
        stack += [k for k in c.co_consts if isinstance(k, type(code))]
    return list(dict.fromkeys(names))


def _failed_line(source: str, exc: BaseException) -> str:
    tb, line = exc.__traceback__, 0
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    return lines[line - 1].strip()[:200] if 0 < line <= len(lines) else "assert"


def decode_value(text: str) -> object:
    """Rebuild a value from `sandbox_harness.encode`'s tagged JSON (untrusted input, never executed).

    A small parser for exactly what `encode` writes (arrays, numbers, null/true/false, Infinity,
    NaN, and strings that are tags or hex, so never an escape): `json` would cost the judge the
    import of `re` and `enum` on every job. Malformed text raises ValueError or IndexError.
    """
    value, end = _parse(text, 0)
    if end != len(text):
        raise ValueError(f"trailing data at {end}")
    return _untag(value)


_CONSTANTS = {"null": None, "true": True, "false": False, "Infinity": float("inf"), "-Infinity": float("-inf"),
              "NaN": float("nan")}


def _parse(s: str, i: int) -> tuple[object, int]:
    if s[i] == "[":
        items, i = [], i + 1
        if s[i] == "]":
            return items, i + 1
        while True:
            item, i = _parse(s, i)
            items.append(item)
            if s[i] == "]":
                return items, i + 1
            if s[i] != ",":
                raise ValueError(f"expected ',' or ']' at {i}")
            i += 1
    if s[i] == '"':
        end = s.index('"', i + 1)
        return s[i + 1:end], end + 1
    end = i
    while end < len(s) and s[end] not in ",]":
        end += 1
    token = s[i:end]
    if token in _CONSTANTS:
        return _CONSTANTS[token], end
    return (float(token) if "." in token or "e" in token else int(token)), end


def _untag(x: object) -> object:
    if not isinstance(x, list):
        return x
    tag, items = x[0], x[1:]
    scalars = {"s": lambda h: bytes.fromhex(h).decode("utf-8", "surrogatepass"), "b": bytes.fromhex,
               "x": lambda h: int(h, 16), "c": lambda re_, im: complex(re_, im)}
    if tag in scalars:
        return scalars[tag](*items)
    values = [_untag(item) for item in items]
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset,
                  "d": lambda v: dict(zip(v[::2], v[1::2], strict=True))}
    return containers[tag](values)


sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))  # decode_value of 100-deep nesting
