"""Inside the sandbox: the judge, PID 1 of a fresh PID namespace, supervising one job.

Started by `sandbox.run_program` as `unshare ... python -I -S -B -c "...; sandbox_judge.main()"`
(imported, not run as a script, so its bytecode is cached), with our directory as the first line
of stdin and then the job (a marshal dict); writes {"tests": [...], "attempts": n} (a 4-byte
length and marshal) to stdout, which nothing else in the judge writes to (a test's `print` goes
to /dev/null). The judge runs only our code, as root: it builds the job's root (`sandbox_fs`), then
starts one runner per attempt (fork, lock down, execve a fresh interpreter running
`sandbox_harness`). io tests: the runner reads stdin and the judge collects its output. Assert
tests: the judge runs each test itself (`sandbox_checks`), sending the runner one request per
call into the program. Standard library only, and no module that is slow to import
(dataclasses, tempfile, typing, signal, collections, json, ...: every job pays for them).
Threat model: `sandbox.py`.
"""

from __future__ import annotations

import _signal
import marshal
import os
import select
import sys
import time

# Siblings: the launcher puts our directory on sys.path, then takes it off.
import sandbox_cgroup
import sandbox_checks
import sandbox_fs
import sandbox_harness
from sandbox_fs import MS_NODEV, MS_NOSUID, WORKDIR

PROBE_FLAG = "--probe"
TMPFS_MB = 64  # per-attempt working directory; also the largest file a program may write
NPROC = 64  # processes + threads per job; counted per uid, and each job has its own uid
NOFILE = 64  # open files per runner
PRESTART_CPU_S = 3600  # CPU limit of a runner started before its job, until the job sets the job's
_CLONE_NEWIPC = 0x08000000
# The runner's interpreter: a fresh image, so nothing of the judge's memory (the tests) is in it.
# The harness travels compiled, in the job, so the new root needs none of our files.
_BOOT = ("import marshal, os\nwith open(4, 'rb') as f:\n    job = marshal.loads(f.read())\n"
         "harness = {'__name__': 'sandbox_harness'}\nexec(marshal.loads(job['harness']), harness)\n"
         "os._exit(harness['run'](job['code'], job['nonce'], job['serve'], job['stdin'], job['cpu_s']))")


def _harness_code() -> bytes:
    """The harness's code object, marshalled: from its bytecode cache (cheap), else compiled."""
    try:
        with open(sandbox_harness.__cached__, "rb") as f:
            return f.read()[16:]  # after the .pyc header
    except (OSError, TypeError):
        with open(sandbox_harness.__file__) as f:
            return marshal.dumps(compile(f.read(), "sandbox_harness.py", "exec"))


_HARNESS_CODE = _harness_code()
STDERR_TAIL = 2000  # bytes of stderr kept per attempt


class Attempt:
    """What one runner process did: how it ended, what it wrote, what it reported."""

    def __init__(self, end: str, status: int, cpu_s: float, stdout: bytes, stderr: bytes,
                 msgs: tuple[str, ...]) -> None:
        self.end = end  # "exit" | "signal" | "timeout" | "output_limit"
        self.status = status  # exit code, or the signal number when end == "signal"
        self.cpu_s, self.stdout, self.stderr, self.msgs = cpu_s, stdout, stderr, msgs


class Runner:
    """One runner process (forked, locked down, then a fresh interpreter) and its pipes.

    Made in two steps: `Runner(judge)` starts the process, which waits for its job on fd 4 (so
    the judge can start one before the job is known), and `start(stdin)` sends it the job. io
    style: `stdin` is the program's input (it comes with the job) and the runner ends by itself.
    Call style (`stdin=None`): fd 0 carries the judge's requests and the runner serves until it
    is killed.
    """

    def __init__(self, judge: Judge) -> None:
        self.judge, self.workdir = judge, judge.fresh_workdir()
        job, self.job_w = os.pipe()  # written once the runner is in the job's cgroup: it waits for it
        child_in, self.requests = os.pipe()
        pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, reports
        pid = os.fork()
        if pid == 0:
            _runner(judge, self.workdir, [child_in, *[w for _, w in pipes], job])  # never returns
        for fd in (child_in, job, *[w for _, w in pipes]):
            os.close(fd)
        self.pid, self.pidfd, self.fds = pid, os.pidfd_open(pid), [r for r, _ in pipes]
        self.poller = select.poll()
        for fd in [*self.fds, self.pidfd]:
            self.poller.register(fd, select.POLLIN)
        self.bufs = [bytearray(), bytearray(), bytearray()]  # stdout, stderr tail, reports
        self.open_fds, self.total, self.end, self.msgs, self.parsed = set(self.fds), 0, None, [], 0
        self.events = judge.memory_events()
        try:  # while the runner's interpreter starts; it reads nothing of the job before this
            if judge.cgroup is not None:
                judge.cgroup.add(pid)
        except OSError as exc:
            self._abandon(exc)

    def start(self, stdin: bytes | None) -> Runner:
        """Give the runner its job: the program, the nonce, its CPU limit, and (io style) its stdin."""
        self.judge.attempts += 1
        if self.job_w < 0:
            return self  # it never got into the cgroup: it is dead, and runs nothing
        try:
            job = marshal.dumps({"code": self.judge.spec["code"], "nonce": self.judge.spec["nonce"],
                                 "serve": stdin is None, "stdin": stdin, "cpu_s": self.judge.cpu_s,
                                 "harness": _HARNESS_CODE})
            view = memoryview(job)
            while view:  # the runner reads it all at once; a dead runner closes the pipe (EPIPE)
                view = view[os.write(self.job_w, view):]
            os.close(self.job_w)
            self.job_w = -1
        except OSError as exc:
            self._abandon(exc)
        if stdin is not None:  # io style: no requests
            os.close(self.requests)
            self.requests = -1
        return self

    def _abandon(self, exc: OSError) -> None:
        """The runner cannot be given its job safely (not in the cgroup, or dead): kill it."""
        self.judge._kill_all(self.pid)
        os.write(2, f"sandbox: the runner did not start: {type(exc).__name__}: {exc}\n".encode())
        os.close(self.job_w)
        self.job_w = -1

    def pump(self, deadline: float, want: object) -> bool:
        """Read the pipes until `want()` holds (True) or the runner exits, overruns or overwrites."""
        cap = self.judge.spec["max_output_bytes"]
        while not want():
            left = deadline - time.monotonic()
            if self.end is not None or left <= 0:
                self.end = self.end or "timeout"
                return False
            for fd, _ in self.poller.poll(left * 1000):
                if fd == self.pidfd:
                    self.end = "exit"
                    continue
                self.total += _read_into(fd, self.bufs[self.fds.index(fd)], self.poller, self.open_fds)
                del self.bufs[1][:-STDERR_TAIL]
                if self.total > cap:
                    self.end = "output_limit"
            self._parse()
        return True

    def loaded(self) -> bool:
        return any(m[:2] in ("L ", "E ") for m in self.msgs)

    def _parse(self) -> None:
        buf, prefix = self.bufs[2], self.judge.spec["nonce"] + " "
        end = buf.rfind(b"\n") + 1
        if end > self.parsed:
            for line in bytes(buf[self.parsed:end]).decode(errors="replace").split("\n")[:-1]:
                if line.startswith(prefix):  # a line without the job's nonce is a forgery: dropped
                    self.msgs.append(line[len(prefix):])
            self.parsed = end

    def request(self, req: tuple, deadline: float) -> tuple[str, str] | None:
        """Send one request; its reply (kind, rest), or None if the runner ended first."""
        data = marshal.dumps(req)
        try:
            os.write(self.requests, len(data).to_bytes(4, "big") + data)
        except BrokenPipeError:
            self.end = self.end or "exit"
        tag, first = f"R {req[0]} ", len(self.msgs)
        mine = lambda: next((m for m in self.msgs[first:] if m.startswith(tag)), None)
        if not self.pump(deadline, lambda: mine() is not None):
            return None
        kind, _, rest = mine()[len(tag):].partition(" ")
        return kind, rest

    def finish(self) -> Attempt:
        """Kill the runner and everything it started, drain its pipes, say how it ended."""
        cap = self.judge.spec["max_output_bytes"]
        for fd in (self.requests, self.job_w):
            if fd >= 0:
                os.close(fd)
        self.requests = self.job_w = -1
        os.close(self.pidfd)
        status, cpu_s = self.judge.reap(self.pid)
        for fd, buf in zip(self.fds, self.bufs, strict=True):  # the writers are dead: drain up to the cap
            # (a short wait, not EOF: outside a PID namespace an escaped daemon may hold the pipe)
            while fd in self.open_fds and self.total <= cap and select.select([fd], [], [], 0.05)[0]:
                self.total += _read_into(fd, buf, self.poller, self.open_fds)
            os.close(fd)
        self._parse()
        if self.judge.libc is None:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)
        end = self.end or "exit"
        if end == "exit" and os.WIFSIGNALED(status):
            end, code = "signal", os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        if not (end == "exit" and code == 0) and self.judge.memory_events() != self.events:
            end = "memory"  # it failed after reaching the job's memory limit: that is why
        return Attempt(end, code, cpu_s, bytes(self.bufs[0][:cap]), bytes(self.bufs[1][-STDERR_TAIL:]),
                       tuple(self.msgs))


class Judge:
    """Starts runners, decides the tests with deadlines and caps, and kills everything they leave."""

    def __init__(self, setup: dict, libc: sandbox_fs.Libc | None, cgroup: sandbox_cgroup.JobCgroup | None) -> None:
        self.spec, self.libc, self.cgroup = setup, libc, cgroup  # the job's own fields come with `job`
        self.pid1 = os.getpid() == 1  # only then is kill(-1) confined to the job
        self.root = os.geteuid() == 0
        self.cpu_s: int | None = None  # the runners' CPU limit, once the job says how many tests
        self.attempts, self.shielded = 0, False
        self.spare: Runner | None = None

    def prestart(self) -> None:
        """Start the first runner before the job comes: its interpreter boots while the job travels."""
        self.spare = Runner(self)

    def job(self, spec: dict) -> None:
        self.spec = self.spec | spec
        self.cpu_s = int(spec["timeout_s"] * (len(spec["tests"] or []) + 1)) + 1

    def runner(self, stdin: bytes | None) -> Runner:
        """A runner given the job: the one started ahead if it is still unused, else a new one."""
        runner, self.spare = self.spare or Runner(self), None
        return runner.start(stdin)

    def finish_spare(self) -> None:
        if self.spare is not None:  # a job with no tests: the runner started ahead is not needed
            self.spare.finish()
            self.spare = None

    def memory_events(self) -> int:
        return self.cgroup.limit_hits() if self.cgroup else 0

    def run(self) -> list[dict]:
        if self.spec["inputs"] is not None:
            return [self._io_test(stdin) for stdin in self.spec["inputs"]]
        return self._assert_tests()

    def _io_test(self, stdin: str) -> dict:
        runner = self.runner(stdin.encode("utf-8", "surrogateescape"))
        runner.pump(time.monotonic() + self.spec["timeout_s"], lambda: False)
        att = runner.finish()
        outcome = "done" if att.end == "exit" and att.status == 0 else self._failure(att, io=True)
        return {"outcome": outcome, "stdout": att.stdout.decode(errors="replace"),
                "stderr": att.stderr.decode(errors="replace")}

    def _assert_tests(self) -> list[dict]:
        """Each test runs here, calling into a runner; a runner that dies is replaced for the next."""
        tests, results, runner = self.spec["tests"], [], None
        for i, source in enumerate(tests):
            if runner is None:
                runner = self.runner(None)
                runner.pump(time.monotonic() + self.spec["timeout_s"], runner.loaded)
                names = next((m[2:] for m in runner.msgs if m.startswith("L ")), None)
                if names is None:  # the program did not load: every test fails alike
                    att = runner.finish()
                    failed = {"outcome": self._failure(att, io=False), "stderr": att.stderr.decode(errors="replace")}
                    return results + [failed] * (len(tests) - i)
            result = self._one_test(runner, source, dict(sandbox_checks.decode_value(names)))
            results.append(result)
            if "stderr" in result:  # the runner died or was killed: the next test gets a fresh one
                runner = None
        if runner is not None:
            runner.finish()
        return results

    def _one_test(self, runner: Runner, source: str, names: dict[str, str]) -> dict:
        deadline = time.monotonic() + self.spec["timeout_s"]
        died: list[Attempt] = []

        def send(req: tuple) -> tuple[str, str] | str:
            reply = runner.request(req, deadline + 0.5)  # the alarm below normally fires first
            if reply is not None:
                return reply
            self.shielded = True
            died.append(runner.finish())
            self.shielded = False
            return self._failure(died[0], io=False)

        conn = sandbox_checks.Connection(send)

        def alarm(*_: object) -> None:
            conn.stopped = conn.stopped or "timeout"
            if not self.shielded:
                raise sandbox_checks.Stop("timeout")

        _signal.signal(_signal.SIGALRM, alarm)
        _signal.setitimer(_signal.ITIMER_REAL, self.spec["timeout_s"])
        try:
            reason, detail = sandbox_checks.evaluate(source, conn, names)
            decided = "judge"
            if reason == "undecidable" and self.spec["sandbox_checks"]:
                conn.stopped, decided = "", "sandbox"
                reason, detail = sandbox_checks.evaluate_inside(source, conn)
        finally:
            self.shielded = True
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            self.shielded = False
        result = {"outcome": reason, "detail": detail, "decided": decided}
        if conn.stopped and not died and not conn.stopped.startswith("undecidable"):
            died.append(runner.finish())  # timed out mid-test: its state is unknown
        if died:
            if died[0].end == "memory":
                result["outcome"], result["detail"] = "memory", "the job's memory limit was hit"
            result["stderr"] = died[0].stderr.decode(errors="replace")
        return result

    def fresh_workdir(self) -> str:
        uid = self.spec["uid"]
        if self.libc is None:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="feedbackrl-sandbox-")
            if self.root:
                os.chown(workdir, uid, uid)
            return workdir
        for target, opts in ((WORKDIR, f"uid={uid},gid={uid},mode=700"), ("/dev/shm", "mode=1777")):
            self.libc.umount(target)  # the previous attempt's files go with its tmpfs
            self.libc.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_MB}m,{opts}")
        return WORKDIR

    def reap(self, pid: int) -> tuple[int, float]:
        """Kill the runner and everything it started; return its wait status and CPU seconds."""
        self._kill_all(pid)
        _, status, usage = os.wait4(pid, 0)
        while self.pid1:  # orphans were re-parented to us: kill and reap until none is left
            self._kill_all(pid)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        return status, usage.ru_utime + usage.ru_stime

    def _kill_all(self, pid: int) -> None:
        # kill(-1) from a namespace's init reaches every other process in it and nothing outside;
        # anywhere else it would hit the whole host, so fall back to the runner's session.
        for target, kill in ((-1, os.kill) if self.pid1 else (pid, os.killpg), (pid, os.kill)):
            try:
                kill(target, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue

    def _failure(self, att: Attempt, io: bool) -> str:
        """Why an attempt did not finish: one of the reasons in the verdict details."""
        exc = next((m.split()[1] for m in att.msgs if m.startswith("E ")), "")
        memory = exc == "MemoryError" or b"MemoryError" in att.stderr or b"Cannot allocate" in att.stderr
        if att.end in ("timeout", "output_limit", "memory"):
            return att.end
        if att.end == "signal":
            cpu_killed = att.status == _signal.SIGKILL and att.cpu_s >= self.cpu_s - 0.5
            if att.status == _signal.SIGXCPU or cpu_killed:
                return "timeout"
            return "memory" if memory else "crash"
        if memory:
            return "memory"
        if not io and exc in ("", "SystemExit"):  # the tests never got their replies
            return "early_exit"
        return "runtime_error"


def _read_into(fd: int, buf: bytearray, poller: select.poll, open_fds: set[int]) -> int:
    data = os.read(fd, 1 << 16)
    if not data:
        poller.unregister(fd)
        open_fds.discard(fd)
    buf += data
    return len(data)


def _runner(judge: Judge, workdir: str, fds: list[int]) -> None:
    """The forked child: lock itself down, then become a fresh interpreter running the harness."""
    code = 1
    try:
        _lock_down(judge, workdir, fds)
        if judge.libc is None:  # unsafe mode: the install may be unreadable by the job's uid (/root)
            sys.modules.pop(__name__, None)
            code = sandbox_harness.main()
        else:
            os.execve(sandbox_fs.EXECUTABLE, [sandbox_fs.EXECUTABLE, "-I", "-S", "-B", "-c", _BOOT], {})
    except BaseException as exc:
        os.write(2, f"sandbox: the runner did not start: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(code)


def _lock_down(judge: Judge, workdir: str, fds: list[int]) -> None:
    """New session and IPC namespace, fds 0-4 only, rlimits, the job's uid (the judge adds the cgroup)."""
    import resource

    os.setsid()
    if judge.libc is not None:
        judge.libc.unshare(_CLONE_NEWIPC)  # SysV shm and queues die with this attempt
    import fcntl

    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]  # so no target overwrites a source
    for target, fd in enumerate(moved):
        os.dup2(fd, target)
    os.closerange(len(fds), 1 << 16)
    uid = judge.spec["uid"]
    cpu_s = judge.cpu_s or PRESTART_CPU_S  # started before the job: the harness lowers it when the job comes
    for res, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_AS, judge.spec["address_space_mb"] << 20),
                       (resource.RLIMIT_FSIZE, TMPFS_MB << 20), (resource.RLIMIT_NOFILE, NOFILE)):
        resource.setrlimit(res, (value, value))
    if judge.root:  # root ignores RLIMIT_NPROC; the job's own uid does not
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if judge.libc is not None:
        judge.libc.no_new_privs()
        if judge.spec.get("seccomp"):
            judge.libc.seccomp(judge.spec["seccomp"])
    os.chdir(workdir)


def probe_main(libc: sandbox_fs.Libc) -> dict[str, bool]:
    """In a fresh sandbox: check that each isolation mechanism really holds."""
    import socket

    found = {"pid_namespace": os.getpid() == 1}
    try:
        sandbox_fs.build_root(libc)
        found["mount_namespace"] = True
    except OSError:
        found["mount_namespace"] = False
    path = f"/.feedbackrl-probe-{os.getpid()}"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.unlink(path)  # we could write to the host's root: the read-only remount failed
        found["read_only_fs"] = False
    except OSError:
        found["read_only_fs"] = True
    with open("/proc/net/dev") as f:
        found["network_namespace"] = [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
    with socket.socket() as s:
        found["no_network"] = s.connect_ex(("127.0.0.1", 1)) != 0
    return found


def _read_framed(stream: object) -> object:
    """One length-prefixed marshal value from `stream`; EOF first (the host is gone) exits quietly."""
    head = stream.read(4)
    data = stream.read(int.from_bytes(head, "big")) if len(head) == 4 else b""
    if not data:
        raise SystemExit(1)
    return marshal.loads(data)


def main() -> None:
    """Set up (the job's cgroup, the new root, the first runner), then read the job, run it, write the results.

    stdin: our directory (a line, read by the launcher), the set-up {"cgroup", "isolate", "uid",
    "address_space_mb", "seccomp"}, then the job, each a 4-byte length and marshal. The host may
    start the judge before it has a job for it: everything before the job depends on the memory
    limit only, and nothing of any job (no test, no program) is in this process before its own
    arrives.
    """
    if sys.argv[1:] == [PROBE_FLAG]:
        os.write(1, marshal.dumps(probe_main(sandbox_fs.Libc())))
        return
    # The results go to the host on a private copy of fd 1; fd 1 itself (where a test's `print`
    # lands, with whatever the program returned) goes nowhere, so no test output can pose as them.
    results_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    stdin = sys.stdin.buffer
    setup = _read_framed(stdin)
    cgroup = sandbox_cgroup.open_job(setup["cgroup"]) if setup["cgroup"] else None  # before the host is hidden
    libc = sandbox_fs.Libc() if setup["isolate"] else None
    if libc is not None:
        sandbox_fs.build_root(libc)
    judge = Judge(setup, libc, cgroup)
    judge.prestart()
    judge.job(_read_framed(stdin))
    results = judge.run()
    judge.finish_spare()
    data = marshal.dumps({"tests": results, "attempts": judge.attempts})
    view = memoryview(len(data).to_bytes(4, "big") + data)  # framed: the host takes exactly this
    while view:
        view = view[os.write(results_fd, view):]
    os._exit(0)  # every runner is reaped; the interpreter's clean-up would only delay the host
