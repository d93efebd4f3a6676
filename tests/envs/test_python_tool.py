"""The Python tool under the sandbox's adversarial cases: a call that forks, sleeps, escapes, or
hides state for a later episode is contained; state carries within one episode only."""

from __future__ import annotations

import os

import pytest

from feedbackrl.envs.python_tool import PythonTool
from feedbackrl.envs.tools import Toolbox, ToolCall, parse_tool_call
from feedbackrl.rewards.sandbox import UID_MAX, UID_MIN, Limits, spare_uids

pytestmark = pytest.mark.sandbox


def _tool() -> PythonTool:
    return PythonTool(limits=Limits(timeout_s=1.0, memory_mb=256, max_output_bytes=65_536))


def _sandbox_processes() -> int:
    """Processes under sandbox uids, but the runners started ahead for the next calls."""
    n, spares = 0, set(spare_uids())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            continue
        n += UID_MIN <= uid < UID_MAX and uid not in spares
    return n


def test_state_carries_within_an_episode_and_failed_cells_are_not_replayed() -> None:
    py = _tool()
    assert py("x = 41\nprint('set')") == "set\n"
    assert py("print(x + 1)") == "42\n"  # the earlier cell ran again, its output dropped
    assert py("y = 1/0") == "error: ZeroDivisionError: division by zero"
    assert py("print(x, 'y' in dir())") == "41 False\n"
    assert py("def f(n):\n    return n * 2\nprint(f(x))") == "82\n"
    assert py.cells == ["x = 41\nprint('set')", "print(x + 1)", "print(x, 'y' in dir())",
                        "def f(n):\n    return n * 2\nprint(f(x))"]


def test_a_later_episode_sees_nothing_an_earlier_one_left() -> None:
    first = _tool()
    hide = ("import os\nfor p in ('/tmp/h', '/dev/shm/h', 'h', os.path.expanduser('~/h')):\n"
            "    try:\n        open(p, 'w').write('secret')\n        print('wrote', p)\n"
            "    except OSError as e:\n        pass\nos.environ['HIDDEN'] = '1'\n")
    wrote = first(hide)
    assert "wrote" in wrote  # a writable scratch directory exists within the call
    second = _tool()
    look = ("import os\nfound = [p for p in ('/tmp/h', '/dev/shm/h', 'h', os.path.expanduser('~/h'))"
            " if os.path.exists(p)]\nprint(found, os.environ.get('HIDDEN'))")
    assert second(look) == "[] None\n"


def test_a_call_that_forks_leaves_no_process_behind() -> None:
    py = _tool()
    out = py("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
             "        time.sleep(60)\n        os._exit(0)\nprint('parent done')")
    assert out == "parent done\n"
    assert py.leaked == 0 and _sandbox_processes() == 0


def test_a_call_that_sleeps_times_out_as_an_observation() -> None:
    box = Toolbox({"py": _tool()}, timeout_s=30.0)
    call = parse_tool_call("py(import time\ntime.sleep(30))")
    assert isinstance(call, ToolCall)
    res = box.call(call)
    assert not res.ok and res.content == "error: py failed: TimeoutError: python cell ran past 1s"
    assert _sandbox_processes() == 0


# a host file is either absent from the sandbox's root (built from an allowlist) or read-only in it
HIDDEN_OR_READ_ONLY = ("error: FileNotFoundError: [Errno 2]", "error: PermissionError: [Errno 13]",
                       "error: OSError: [Errno 30] Read-only file system")


@pytest.mark.parametrize("code, expected", [
    ("import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', 22))", ("error: OSError",)),
    ("open('/etc/passwd', 'a').write('x')", HIDDEN_OR_READ_ONLY),
    (f"open({__file__!r}, 'a').write('x')", HIDDEN_OR_READ_ONLY),
    ("import os\nprint(sorted(os.environ))", ("[]\n",)),
    ("import os\nos.kill(1, 9)\nprint('alive')", ("error: PermissionError: [Errno 1] Operation not permitted",)),
], ids=["network", "host-file", "own-source", "environment", "kill-init"])
def test_escapes_are_contained(code: str, expected: tuple[str, ...]) -> None:
    out = _tool()(code)
    assert out.startswith(expected), out
