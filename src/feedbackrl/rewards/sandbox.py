"""Run an untrusted Python program in a throwaway Linux sandbox; report what it did, not a score.

This is the host half, called from the trainer. One job (one program, one problem's tests)::

    host --spawn--> unshare --net --pid --mount --ipc --uts --fork --kill-child
                      └─ judge (sandbox_judge.py): PID 1 of a fresh PID namespace, root, our code only;
                         runs assert tests itself (sandbox_checks.py), calling into the runner
                           └─ runner, per attempt: fork, lock down (job uid, rlimits, own IPC
                              namespace), execve a fresh interpreter, which the judge moves into the
                              job's cgroup before it sends the job; it runs the program and answers
                              the judge's calls with plain data (sandbox_harness.py)

Each judge serves one job. It is started before its job comes (`_Judge`: interpreter, imports,
the job's cgroup, the new root; none of it depends on the job beyond the memory limit), so a job
waits only for its runners: one spare per memory limit and concurrent caller boots while a job
runs, and `stop_spares` (also at exit) ends the spares.

Threat model. The program is arbitrary Python written by a policy under optimisation: buggy, or
actively looking for reward. It may burn CPU, memory, disk, processes or output; write or read
files; open sockets; signal or outlive its parent; or fake success. We protect the host (files,
processes, network, environment secrets), concurrent jobs, and the integrity of the score.

Mechanisms, each closing a hole:
- Namespaces. Network: only a loopback that is down, so no connection to anything, host
  services on 127.0.0.1 included. PID: the judge is init, so `kill(-1)` from it after each attempt,
  and the kernel when it exits, kill every process of the job, daemons and double forks included.
  Mount: every mount read-only and nosuid, /root and /home hidden behind empty tmpfs (the Python
  install is re-exposed read-only if it lives there), a fresh /proc that shows only the job, and a
  fresh size-capped tmpfs working directory and /dev/shm per attempt. IPC: one namespace per
  attempt, so SysV shared memory and message queues die with it. UTS: private.
- Privileges. The runner switches to a uid/gid drawn at random from [UID_MIN, UID_MAX), no groups,
  PR_SET_NO_NEW_PRIVS: it cannot signal, ptrace or read the judge or any host process, and
  RLIMIT_NPROC (which root ignores) caps fork bombs per job. The environment is empty.
- Memory and processes. A cgroup per job (`sandbox_cgroup.py`) caps memory, counting what the
  address-space limit misses (memfd, SysV shm, tmpfs pages: a file mapped 33 times is charged
  once, each private copy of a page again), and processes; where no cgroup can
  be made, a warning says why and rlimits alone apply. rlimits also cap CPU time, address space,
  file size, open files (64) and core dumps.
- Time and output. The judge gives each test `timeout_s` of wall clock and caps output, reading
  the pipes as they fill; the host adds an overall deadline, kills the session, removes the job's
  cgroup (killing anything in it) and scans /proc for any process still running as the job's uid
  (expected none; the count is returned).
- Score integrity. Expected stdout stays on the host. Assert tests are run by the judge, with
  its own builtins and standard library: the program's functions are proxies whose calls the
  runner answers with plain data (exact builtin types, encoded by C-level methods) or an opaque
  handle that refuses to be compared or tested for truth. So an object whose `__eq__` always says
  True, a patched `math.isclose` or `math.pi` (whether the test imports `math` or names the
  program's) or a fake module in `sys.modules` changes nothing the judge sees, and a reply
  forged through frames, `gc` or `sys.settrace` is only a value the program could have returned.
  A builtin exception the program raises reaches the test as itself, but StopIteration (and
  StopAsyncIteration) comes as RuntimeError: out of a call that `map` or `iter(f, sentinel)`
  makes, it would end the test's loop early, as if every case had passed. What a test prints (a
  value the program returned, say) goes to /dev/null: the judge sends its results on a private
  copy of its stdout, framed, and the host takes exactly one framed result, so no output can pose
  as them.
  The runner is a fresh interpreter (execve), so the tests' literals are in none of its memory;
  it cannot read the judge's (another uid).

Residual risks, accepted: a test that passes the program something other than plain data (a
function, say) cannot be decided by the judge, and fails as "undecidable"; with
`sandbox_checks=True` it runs inside the sandbox instead, in the program's namespace (its modules
patched as the program left them), its entry says `"decided": "sandbox"`, and a program that digs
into the harness can fake it. Test code sees the judge's own builtins and standard-library modules
even where the program defines a name of the same spelling (`math`, `abs`), so a task may not ask
for a function named like a builtin or a standard-library module; any other name the test uses
without defining it is the program's, and what it gives back is the program's word. Files that
everyone may read stay readable (read-only, not invisible). Kernel exploits and timing side
channels are out of scope. Without root and the namespaces `require_isolation` raises
`SandboxUnavailable`; with `isolate=False` programs run with rlimits, a session and (as root) a
separate uid only: no network, filesystem, PID or IPC isolation and no cgroup, and the runner is
forked without a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import marshal
import os
import py_compile
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from feedbackrl.rewards import sandbox_cgroup, sandbox_seccomp

log = logging.getLogger(__name__)

UID_MIN, UID_MAX = 1 << 20, 1 << 30  # far above real accounts, so one uid names one job
NPROC = 64  # processes + threads per job (the cgroup's pids.max; the judge's RLIMIT_NPROC too)
_CGROUP_WARNED: list[str] = []
_SECCOMP_WARNED: list[str] = []
_HERE = os.path.dirname(os.path.abspath(__file__))
# -I: ignore PYTHON* variables and the user site; -S: no site-packages (programs get the
# standard library only, and start faster); -B: the filesystem is read-only anyway. Our directory
# holds modules (math.py, ...) that would shadow the standard library, so it is on sys.path only
# while the judge is imported, and the judge's own extension modules are imported before. That
# directory comes as the first line of stdin, not on the command line, which /proc/1/cmdline shows
# the program; and the interpreter is the real binary, not a venv's link to it.
_JUDGE_CMD = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c",
              "import select, sys; sys.path.insert(0, sys.stdin.buffer.readline()[:-1].decode()); "
              "import sandbox_judge; del sys.path[0]; sandbox_judge.main()"]
_JUDGE_DIR = _HERE.encode() + b"\n"
_UNSHARE = ["unshare", "--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--"]


class SandboxUnavailable(RuntimeError):
    """The kernel or the privileges here cannot provide the isolation the sandbox needs."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one program; `timeout_s` applies to each test separately."""

    timeout_s: float = 2.0
    memory_mb: int = 512
    max_output_bytes: int = 1_000_000


@cache
def _judge_cmd() -> list[str]:
    """The judge's command line, after making sure its bytecode is cached (else ~10 ms a run)."""
    for name in ("sandbox_judge.py", "sandbox_harness.py", "sandbox_checks.py", "sandbox_cgroup.py", "sandbox_fs.py"):
        with contextlib.suppress(OSError, py_compile.PyCompileError):  # a read-only install: slower
            py_compile.compile(os.path.join(_HERE, name), doraise=True)
    return _JUDGE_CMD


def probe() -> dict[str, bool]:
    """Which isolation mechanisms this machine grants, {mechanism: works}; checked once per process."""
    return _probe()[0]


@cache
def _probe() -> tuple[dict[str, bool], str]:
    found = {"linux": sys.platform == "linux", "root": os.geteuid() == 0,
             "unshare": shutil.which("unshare") is not None}
    if not all(found.values()):
        return found | {"namespaces": False}, ""
    try:
        out = subprocess.run([*_UNSHARE, *_judge_cmd(), "--probe"], input=_JUDGE_DIR, capture_output=True, env={},
                             timeout=30)
        return found | {"namespaces": True} | marshal.loads(out.stdout), ""
    except (subprocess.SubprocessError, OSError, EOFError, ValueError, TypeError) as exc:
        stderr = out.stderr[-300:].decode(errors="replace") if "out" in locals() else ""
        return found | {"namespaces": False}, f"{type(exc).__name__}: {exc} {stderr}".strip()


def require_isolation() -> None:
    """Return if every isolation mechanism works here; else raise SandboxUnavailable naming the gaps."""
    found = probe()
    missing = [name for name, ok in found.items() if not ok]
    if missing:
        error = _probe()[1]
        raise SandboxUnavailable(
            f"the code sandbox cannot isolate programs here: {', '.join(missing)} unavailable "
            f"(probe: {found}{'; ' + error if error else ''}). It needs Linux, root, util-linux "
            "`unshare`, and network, PID and mount namespaces (a VM, or a container run with "
            "--privileged). Pass allow_unsafe=True to run programs anyway with rlimits and a "
            "process session only.")


def run_program(code: str, *, inputs: list[str] | None = None, tests: list[str] | None = None,
                limits: Limits = Limits(), isolate: bool = True, sandbox_checks: bool = False) -> dict:
    """Run `code` once per stdin string in `inputs` (io style), or decide `tests` against it.

    Each of `tests` is Python source the judge runs itself, calling into the program (see
    `sandbox_checks`); a test the judge cannot decide fails ("undecidable"), unless
    `sandbox_checks=True`, which runs it inside the sandbox instead. Returns {"tests": [{"outcome",
    "stderr", "stdout" (io), "detail" and "decided" (tests)}, ...], "attempts": n, "leaked": n} or
    {"error": text}.

    With `isolate`, the job goes to a judge started ahead of it (see `_Judge`), and a judge for the
    next job with the same memory limit starts while this one runs.
    """
    n_tests = len(inputs if inputs is not None else tests or [])
    judge = _Judge.take(limits.memory_mb) if isolate else _Judge(limits.memory_mb, isolate=False)
    if isolate:  # the next job's judge boots while this job runs; if it cannot, the next job starts one
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _Judge.prepare(limits.memory_mb)
    spec = {"code": code, "inputs": inputs, "tests": tests, "nonce": secrets.token_hex(16),
            "timeout_s": float(limits.timeout_s), "max_output_bytes": int(limits.max_output_bytes),
            "sandbox_checks": bool(sandbox_checks)}
    # A crash can cost a test a reload as well: two deadlines per test, plus start-up slack.
    budget = 2 * (n_tests + 1) * limits.timeout_s + 10
    proc = judge.proc
    try:
        try:
            out, err = proc.communicate(_framed(spec), timeout=budget)
        except subprocess.TimeoutExpired:
            out, err = b"", b"the judge overran the job's overall deadline"
        finally:
            _kill_group(proc.pid)  # --kill-child takes the judge, and with it the PID namespace
            proc.wait()
    finally:
        leaked = judge.close()
    leaked += _kill_uid(judge.uid) if os.geteuid() == 0 else 0
    try:
        return _unframed(out) | {"leaked": leaked}
    except (EOFError, ValueError, TypeError):
        tail = err[-500:].decode(errors="replace")
        return {"error": f"sandbox failed (exit {proc.returncode}): {tail}", "leaked": leaked}


def _unframed(out: bytes) -> dict:
    """The judge's results: one length-prefixed marshal dict, and nothing before or after it."""
    if len(out) < 4 or int.from_bytes(out[:4], "big") != len(out) - 4:
        raise ValueError(f"the judge's output is not one framed result ({len(out)} bytes)")
    result = marshal.loads(out[4:])
    if type(result) is not dict:
        raise TypeError(f"the judge's result is a {type(result).__name__}, not a dict")
    return result


def _framed(value: object) -> bytes:
    data = marshal.dumps(value)
    return len(data).to_bytes(4, "big") + data


class _Judge:
    """One judge process and its job's cgroup and uid, started before the job (one judge per job).

    What a judge does before its job (start the interpreter, import, open the cgroup, build the
    root, start the first runner: its lock-down and fresh interpreter) depends on the memory limit
    alone, so `prepare` starts one ahead for the next job with that limit, and `take` hands it out
    (or starts one then). Each judge still serves exactly one job and has seen no other, and the
    runner gets its CPU limit and stdin with the job, before any of the program runs: the isolation
    is the same as starting them when the job comes. Spare judges are stopped at exit
    (`stop_spares`).
    """

    _spares: ClassVar[dict[int, list[_Judge]]] = {}
    _lock = threading.Lock()

    def __init__(self, memory_mb: int, isolate: bool = True) -> None:
        self.owner = os.getpid()
        self.uid = UID_MIN + secrets.randbelow(UID_MAX - UID_MIN)
        self.cgroup = _job_cgroup(f"feedbackrl-{self.uid}", memory_mb) if isolate else None
        # With a cgroup counting real memory, the address-space limit only stops absurd reservations
        # (thread stacks and malloc arenas reserve far more than they use).
        address_space_mb = max(4 * memory_mb, memory_mb + 1024) if self.cgroup else memory_mb
        setup = {"cgroup": self.cgroup, "isolate": isolate, "uid": self.uid, "address_space_mb": int(address_space_mb),
                 "seccomp": _seccomp() if isolate else None}
        cmd = [*_UNSHARE, *_judge_cmd()] if isolate else _judge_cmd()
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env={}, cwd="/", start_new_session=True)
            self.proc.stdin.write(_JUDGE_DIR + _framed(setup))
            self.proc.stdin.flush()
        except BaseException:
            self.close()
            raise

    @classmethod
    def take(cls, memory_mb: int) -> _Judge:
        with cls._lock:
            spares = cls._spares.get(memory_mb, [])
            while spares:
                judge = spares.pop()
                if judge.owner == os.getpid() and judge.proc.poll() is None:
                    return judge
                if judge.owner == os.getpid():
                    judge.close()  # died before its job: start another
        return cls(memory_mb)

    @classmethod
    def prepare(cls, memory_mb: int) -> None:
        judge = cls(memory_mb)
        with cls._lock:
            cls._spares.setdefault(memory_mb, []).append(judge)

    def close(self) -> int:
        """Kill the judge (if still running) and remove its cgroup; how many processes were left in it."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr) if proc is not None else ():
            with contextlib.suppress(OSError):
                stream.close()
        cgroup, self.cgroup = self.cgroup, None
        return sandbox_cgroup.remove(cgroup) if cgroup else 0


def stop_spares() -> None:
    """Stop the judges started ahead of jobs (and remove their cgroups); the next job starts its own."""
    with _Judge._lock:
        spares = [j for js in _Judge._spares.values() for j in js if j.owner == os.getpid()]
        _Judge._spares.clear()
    for judge in spares:
        judge.close()


atexit.register(stop_spares)


def spare_uids() -> list[int]:
    """The uids of judges waiting for a job (each has one runner under it, locked down, waiting too)."""
    with _Judge._lock:
        return [j.uid for js in _Judge._spares.values() for j in js]


def spare_cgroups() -> list[str]:
    """The cgroup directories held by judges waiting for a job (each removed with its judge)."""
    with _Judge._lock:
        return [d for js in _Judge._spares.values() for j in js if j.cgroup for d in j.cgroup["dirs"]]


@cache
def cgroup_available() -> bool:
    """Whether jobs here get a cgroup (memory and process limits that count everything)."""
    job, _ = sandbox_cgroup.create(f"feedbackrl-probe-{os.getpid()}", 64, NPROC)
    if job is not None:
        sandbox_cgroup.remove(job)
    return job is not None


def _seccomp() -> bytes | None:
    program, why = sandbox_seccomp.bpf()
    if program is None and not _SECCOMP_WARNED:
        _SECCOMP_WARNED.append(why)
        log.warning("sandbox: runners go without a seccomp filter (%s); the namespaces and uid still hold", why)
    return program


def _job_cgroup(name: str, memory_mb: int) -> dict | None:
    job, why = sandbox_cgroup.create(name, memory_mb, NPROC)
    if job is None and not _CGROUP_WARNED:
        _CGROUP_WARNED.append(why)
        log.warning("sandbox: no cgroup for the job's memory and processes (%s); falling back to rlimits, "
                    "which do not count in-memory files or shared memory", why)
    return job


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return  # already gone


def _kill_uid(uid: int) -> int:
    """SIGKILL every host process whose real uid is `uid`; return how many there were."""
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                line = next(line for line in f if line.startswith(b"Uid:"))
            if int(line.split()[1]) == uid:
                found += 1
                os.kill(int(name), signal.SIGKILL)
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # the process ended while we looked
    return found
