"""Inside the sandbox: the judge, PID 1 of a fresh PID namespace, supervising one job.

Started by `sandbox.run_program` as `unshare ... python -I -S -B -c "...; sandbox_judge.main()"`
(imported, not run as a script, so its bytecode is cached), with the job (a marshal dict) on
stdin; writes {"tests": [...], "attempts": n} (marshal) to stdout. The judge runs only our code,
as root: it isolates the filesystem, then forks one runner per attempt, which drops to the job's
uid and runs `sandbox_harness.run`. Standard library only, and no module that is slow to import
(dataclasses, tempfile, ...: every execution pays for them). Threat model: `sandbox.py`.
"""

from __future__ import annotations

import _signal
import marshal
import os
import select
import sys
import time

import sandbox_harness  # a sibling: the launcher puts our directory on sys.path, then takes it off

PROBE_FLAG = "--probe"
WORKDIR = "/tmp/w"
TMPFS_MB = 64  # per-attempt working directory; also the largest file a program may write
NPROC = 64  # processes + threads per job; counted per uid, and each job has its own uid
STDERR_TAIL = 2000  # bytes of stderr kept per attempt
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18


class _Libc:
    """The syscalls the standard library lacks: mount, umount2 and prctl."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def mount(self, src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
        enc = lambda s: None if s is None else s.encode()
        if self.lib.mount(enc(src), enc(target), enc(fstype), flags, enc(data or None)) != 0:
            errno = self.ctypes.get_errno()
            raise OSError(errno, f"mount {src} on {target}: {os.strerror(errno)}")

    def umount(self, target: str) -> None:
        self.lib.umount2(target.encode(), 2)  # MNT_DETACH; failing just means nothing was there

    def no_new_privs(self) -> None:
        self.lib.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid binaries gain nothing


def isolate_fs(libc: _Libc) -> None:
    """Private mounts, a fresh /proc, /root and /home hidden, every mount read-only and nosuid."""
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here reaches the host
    libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    # The Python install must stay readable by the runner's uid even if it lives under /root.
    # Resolve its paths before /tmp is covered: a venv under /tmp (a CI clone, say) links to it.
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    prefixes: list[str] = []
    for p in sorted({os.path.realpath(sys.base_prefix), exe_dir}):
        if not any(p.startswith(q + "/") for q in prefixes):
            prefixes.append(p)
    libc.mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    os.makedirs(WORKDIR)
    hidden = [d for d in ("/root", "/home") if os.path.isdir(d)]
    hidden += [a for p in prefixes if (a := _closed_ancestor(p)) and a not in hidden]
    buried = [p for p in prefixes if any(p.startswith(d + "/") for d in hidden)]
    staged = [(f"/tmp/.py{i}", p) for i, p in enumerate(buried)]
    for stage, prefix in staged:
        os.mkdir(stage)
        libc.mount(prefix, stage, None, _MS_BIND | _MS_REC)
    for d in hidden:
        libc.mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for stage, prefix in staged:
        os.makedirs(prefix)
        libc.mount(stage, prefix, None, _MS_MOVE)
    _readonly_all(libc)


def _closed_ancestor(path: str) -> str | None:
    """The first directory above `path` that others cannot traverse (e.g. /root, mode 700)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _readonly_all(libc: _Libc) -> None:
    """Remount every mount in this namespace read-only and nosuid (devices keep working)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]  # octal escapes
    for point in points:
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
        try:
            libc.mount(None, point, None, flags)
        except OSError:  # a mount with nodev/noexec must keep them when remounted
            libc.mount(None, point, None, flags | _MS_NODEV | _MS_NOEXEC)


class Attempt:
    """What one runner process did: how it ended, what it wrote, what it reported."""

    def __init__(self, end: str, status: int, cpu_s: float, stdout: bytes, stderr: bytes,
                 msgs: tuple[str, ...]) -> None:
        self.end = end  # "exit" | "signal" | "timeout" | "output_limit"
        self.status = status  # exit code, or the signal number when end == "signal"
        self.cpu_s, self.stdout, self.stderr, self.msgs = cpu_s, stdout, stderr, msgs


class Judge:
    """Forks runners, watches them with deadlines and caps, and kills everything they leave."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.libc = _Libc() if spec["isolate"] else None
        self.pid1 = os.getpid() == 1  # only then is kill(-1) confined to the job
        self.root = os.geteuid() == 0
        self.cpu_s = int(spec["timeout_s"] * (len(spec["checks"] or []) + 1)) + 1
        self.attempts = 0

    def run(self) -> list[dict]:
        if self.spec["inputs"] is not None:
            return [self._io_test(stdin) for stdin in self.spec["inputs"]]
        results: list[dict] = []
        while len(results) < len(self.spec["checks"]):
            results += self._assert_tests(start=len(results))
        return results

    def _io_test(self, stdin: str) -> dict:
        att = self._attempt(stdin.encode("utf-8", "surrogateescape"), start=None)
        outcome = "done" if att.end == "exit" and att.status == 0 else self._failure(att, io=True)
        return {"outcome": outcome, "stdout": att.stdout.decode(errors="replace"),
                "stderr": att.stderr.decode(errors="replace"), "msgs": list(att.msgs)}

    def _assert_tests(self, start: int) -> list[dict]:
        """Run tests start.. in one runner; stop at the first test it did not finish."""
        att = self._attempt(b"", start=start)
        n = len(self.spec["checks"])
        results = []
        for i in range(start, n):
            mine = [m for m in att.msgs if m.split(" ", 2)[1:2] == [str(i)]]
            if "L" in att.msgs and f"D {i}" in mine:
                results.append({"outcome": "done", "msgs": mine, "stderr": ""})
                continue
            failed = {"outcome": self._failure(att, io=False), "msgs": mine,
                      "stderr": att.stderr.decode(errors="replace")}
            if "L" in att.msgs:  # test i ended its runner; the next tests get a fresh one
                return [*results, failed]
            return [failed] * (n - start)  # the program did not load: every test fails alike
        return results

    def _attempt(self, stdin: bytes, start: int | None) -> Attempt:
        self.attempts += 1
        workdir = self._fresh_workdir()
        stdin_fd = os.memfd_create("stdin")  # any size, no writer to block
        os.write(stdin_fd, stdin)
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, reports
        pid = os.fork()
        if pid == 0:
            _runner(self, workdir, stdin_fd, [w for _, w in pipes], start)  # never returns
        for _, w in pipes:
            os.close(w)
        os.close(stdin_fd)
        try:
            return self._watch(pid, [r for r, _ in pipes], start)
        finally:
            for r, _ in pipes:
                os.close(r)
            if self.libc is None:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)

    def _fresh_workdir(self) -> str:
        uid = self.spec["uid"]
        if self.libc is None:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="feedbackrl-sandbox-")
            if self.root:
                os.chown(workdir, uid, uid)
            return workdir
        for target, opts in ((WORKDIR, f"uid={uid},gid={uid},mode=700"), ("/dev/shm", "mode=1777")):
            self.libc.umount(target)  # the previous attempt's files go with its tmpfs
            self.libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={TMPFS_MB}m,{opts}")
        return WORKDIR

    def _watch(self, pid: int, fds: list[int], start: int | None) -> Attempt:
        """Read the runner's pipes until it exits, its deadline passes or it writes too much."""
        timeout, cap, nonce = self.spec["timeout_s"], self.spec["max_output_bytes"], self.spec["nonce"]
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in [*fds, pidfd]:
            poller.register(fd, select.POLLIN)
        bufs = [bytearray(), bytearray(), bytearray()]  # stdout, stderr tail, reports
        deadline, end, total, done, open_fds = time.monotonic() + timeout, None, 0, 0, set(fds)
        while end is None and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                if fd == pidfd:
                    end = "exit"
                    continue
                total += _read_into(fd, bufs[fds.index(fd)], poller, open_fds)
                if fd == fds[2] and start is not None:
                    stages = sum(m[:1] in "LD" for m in _messages(bufs[2], nonce))
                    if stages > done:  # the load or a test finished: the next one gets its own deadline
                        deadline, done = time.monotonic() + timeout, stages
                del bufs[1][:-STDERR_TAIL]
                if total > cap:
                    end = "output_limit"
        os.close(pidfd)
        status, cpu_s = self._reap(pid)
        for fd, buf in zip(fds, bufs, strict=True):  # the writers are dead: drain up to the cap
            # (a short wait, not EOF: outside a PID namespace an escaped daemon may hold the pipe)
            while fd in open_fds and total <= cap and select.select([fd], [], [], 0.05)[0]:
                total += _read_into(fd, buf, poller, open_fds)
        if end == "exit" and os.WIFSIGNALED(status):
            end, code = "signal", os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        return Attempt(end or "timeout", code, cpu_s, bytes(bufs[0][:cap]), bytes(bufs[1][-STDERR_TAIL:]),
                       tuple(_messages(bufs[2], nonce)))

    def _reap(self, pid: int) -> tuple[int, float]:
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
        if att.end in ("timeout", "output_limit"):
            return att.end
        if att.end == "signal":
            cpu_killed = att.status == _signal.SIGKILL and att.cpu_s >= self.cpu_s - 0.5
            if att.status == _signal.SIGXCPU or cpu_killed:
                return "timeout"
            return "memory" if memory else "crash"
        if memory:
            return "memory"
        if not io and exc in ("", "SystemExit"):  # the asserts never got to report
            return "early_exit"
        return "runtime_error"


def _read_into(fd: int, buf: bytearray, poller: select.poll, open_fds: set[int]) -> int:
    data = os.read(fd, 1 << 16)
    if not data:
        poller.unregister(fd)
        open_fds.discard(fd)
    buf += data
    return len(data)


def _messages(buf: bytes | bytearray, nonce: str) -> list[str]:
    """Complete report lines that carry the job's nonce, nonce stripped; forgeries are dropped."""
    prefix = nonce + " "
    lines = bytes(buf).decode(errors="replace").split("\n")[:-1]
    return [line[len(prefix):] for line in lines if line.startswith(prefix)]


def _runner(judge: Judge, workdir: str, stdin_fd: int, writers: list[int], start: int | None) -> None:
    """The forked child: lock itself down, then run the program; never returns to judge code."""
    code = 1
    try:
        _lock_down(judge, workdir, stdin_fd, writers)
        sys.modules.pop(__name__, None)  # `import sandbox_judge` must not hand the program the judge
        code = sandbox_harness.run(judge.spec, start)
    finally:
        os._exit(code)


def _lock_down(judge: Judge, workdir: str, stdin_fd: int, writers: list[int]) -> None:
    """New session, fds 0-3 only, rlimits, a job-unique uid with no groups, empty environment."""
    import resource

    os.setsid()
    for target, fd in enumerate([stdin_fd, *writers]):
        os.dup2(fd, target)
    os.closerange(4, 1 << 16)
    uid = judge.spec["uid"]
    for res, value in ((resource.RLIMIT_CPU, judge.cpu_s), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_AS, judge.spec["memory_mb"] << 20),
                       (resource.RLIMIT_FSIZE, TMPFS_MB << 20)):
        resource.setrlimit(res, (value, value))
    if judge.root:  # root ignores RLIMIT_NPROC; the job's own uid does not
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if judge.libc is not None:
        judge.libc.no_new_privs()
    os.chdir(workdir)
    os.environ.clear()


def probe_main(libc: _Libc) -> dict[str, bool]:
    """In a fresh sandbox: check that each isolation mechanism really holds."""
    import socket

    found = {"pid_namespace": os.getpid() == 1}
    try:
        isolate_fs(libc)
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


def main() -> None:
    """Read the job from stdin, run it, write the results to stdout."""
    if sys.argv[1:] == [PROBE_FLAG]:
        os.write(1, marshal.dumps(probe_main(_Libc())))
        return
    judge = Judge(marshal.loads(sys.stdin.buffer.read()))
    if judge.libc is not None:
        isolate_fs(judge.libc)
    sys.stdout.buffer.write(marshal.dumps({"tests": judge.run(), "attempts": judge.attempts}))
    sys.stdout.buffer.flush()
