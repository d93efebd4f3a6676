"""Hostile programs: each is contained, reported with a reason, and leaves the host as it was.

Every test runs under `host_unchanged`, which checks afterwards that no process runs under a
sandbox uid, that the host's mount table is the same, and that no stray files appeared in /tmp.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent

import pytest

from feedbackrl.rewards import sandbox
from feedbackrl.rewards.code import CodeVerifier
from feedbackrl.rewards.verdict import Problem, Verdict

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
ADD_TESTS = {"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 4",
                        "assert isinstance(add('a', 'b'), str)", "assert sorted([add(2, 1)]) == [3]",
                        "assert add(0, 1)"]}
GOLD_ADD = "def add(a, b):\n    return a + b\n"  # passes every test above
WRONG_ADD = "def add(a, b):\n    return 0\n"  # fails every test above


def sandbox_processes() -> list[int]:
    """Host pids running under any sandbox uid, but those of the runners started for the next jobs."""
    pids, spares = [], set(sandbox.spare_uids())
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if sandbox.UID_MIN <= uid < sandbox.UID_MAX and uid not in spares:
            pids.append(int(name))
    return pids


@pytest.fixture(autouse=True)
def host_unchanged() -> Iterator[None]:
    mounts, tmp = Path("/proc/self/mountinfo").read_text(), set(os.listdir("/tmp"))
    yield
    assert sandbox_processes() == [], "a sandboxed process outlived its job"
    assert Path("/proc/self/mountinfo").read_text() == mounts, "sandbox mounts leaked to the host"
    stray = {name for name in set(os.listdir("/tmp")) - tmp if "pwned" in name or "sandbox" in name}
    assert not stray, f"files appeared in the host's /tmp: {stray}"
    assert job_cgroups() == [], "a job's cgroup outlived it"


def job_cgroups() -> list[str]:
    """cgroups the sandbox made for jobs and left behind (it removes each after its job), apart from
    those of the judges started ahead for the next jobs."""
    spares = set(sandbox.spare_cgroups())
    return [str(p) for p in Path("/sys/fs/cgroup").rglob("feedbackrl-*") if p.is_dir() and str(p) not in spares]


@pytest.fixture(scope="module")
def verifier() -> CodeVerifier:
    return CodeVerifier(timeout_s=1.0, memory_mb=256, max_output_bytes=100_000)


def run_io(verifier: CodeVerifier, program: str, expected: str = "", stdin: str = "") -> Verdict:
    return verifier(Problem("", {"io": [{"input": stdin, "output": expected}]}), program)


def reason(verdict: Verdict) -> str:
    return verdict.details["tests"][0]["reason"]


# --------------------------------------------------------------------------- resource exhaustion


@pytest.mark.parametrize("program", [
    pytest.param("while True:\n    pass", id="busy-loop"),
    pytest.param("import time\ntime.sleep(60)", id="sleep"),
    pytest.param("import threading\nthreading.Event().wait()", id="block-forever"),
    pytest.param("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
                 id="ignore-sigterm"),
])
def test_hangs_time_out(verifier: CodeVerifier, program: str) -> None:
    start = time.monotonic()
    verdict = run_io(verifier, program)
    assert reason(verdict) == "timeout" and verdict.score == 0.0
    assert time.monotonic() - start < 4.0


def test_fork_bomb_is_contained(verifier: CodeVerifier) -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    verdict = run_io(verifier, program)
    assert reason(verdict) in ("timeout", "runtime_error") and verdict.score == 0.0
    assert os.system("true") == 0  # the host can still start processes


MEMFD_BOMB = dedent("""\
    import os
    files = []
    while True:  # one in-memory file after another, each up to the file-size limit
        files.append(os.memfd_create('x'))
        try:
            while True:
                os.write(files[-1], b'x' * 2**20)
        except OSError as e:
            if e.errno != 27:  # EFBIG: this file is full, start the next
                raise
    """)
SHM_BOMB = dedent("""\
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    while True:  # 64 MiB segments, touched page by page: no mapping of ours counts them
        shm = libc.shmget(0, 64 << 20, 0o1600)
        addr = libc.shmat(shm, None, 0)
        ctypes.memset(addr, 1, 64 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
    """)


@pytest.fixture(scope="module")
def patient_verifier() -> CodeVerifier:
    # A deadline far beyond what any bomb below needs (well under a second of CPU), so the
    # verdict is decided by the memory limit alone, however loaded the machine is.
    return CodeVerifier(timeout_s=60.0, memory_mb=256, max_output_bytes=100_000)


@pytest.mark.parametrize("program", [
    pytest.param("x = bytearray(10**10)", id="one-huge-allocation"),
    pytest.param("x = []\nwhile True:\n    x.append(' ' * 10**6)", id="gradual-growth"),
    pytest.param("import threading\nthreads = [threading.Thread(target=lambda: bytearray(10**9))"
                 " for _ in range(8)]\n[t.start() for t in threads]\n[t.join() for t in threads]\n"
                 "raise MemoryError", id="allocating-threads"),
    pytest.param(MEMFD_BOMB, id="memfd", marks=pytest.mark.sandbox("cgroup")),
    pytest.param(SHM_BOMB, id="sysv-shm", marks=pytest.mark.sandbox("cgroup")),
])
def test_memory_bombs_hit_the_limit(patient_verifier: CodeVerifier, program: str) -> None:
    verdict = run_io(patient_verifier, program)
    assert (reason(verdict), verdict.score) == ("memory", 0.0), verdict.details


MAPPED_33_TIMES = dedent("""\
    import mmap, os
    size = 60 << 20  # one 60 MiB file in the working directory (its tmpfs holds 64 MiB)
    with open('data', 'wb') as f:
        f.truncate(size)
    fd = os.open('data', os.O_RDWR)
    maps = [mmap.mmap(fd, size, flags=mmap.MAP_{kind}) for _ in range(33)]  # 1,980 MiB of mappings
    for m in maps:
        for offset in range(0, size, 4096):
            m[offset] = 1  # every page of every mapping touched
    print(sum(m[size - 1] == 0 for m in maps))
    """)


@pytest.fixture(scope="module")
def verifier_512() -> CodeVerifier:
    return CodeVerifier(timeout_s=60.0, memory_mb=512, max_output_bytes=100_000)


@pytest.mark.sandbox("cgroup")
def test_one_file_mapped_33_times_is_charged_once(verifier_512: CodeVerifier) -> None:
    # 33 shared mappings of one 60 MiB file, every page written: the job holds 1,980 MiB of
    # mappings against a 512 MiB limit, but the pages are the file's, charged to the job once.
    verdict = run_io(verifier_512, MAPPED_33_TIMES.replace("{kind}", "SHARED"), expected="33\n")
    assert (reason(verdict), verdict.score) == ("ok", 1.0), verdict.details


def test_private_copies_of_a_mapped_file_hit_the_limit(verifier_512: CodeVerifier) -> None:
    # The same 33 mappings, private: each written page is the job's own copy (1,980 MiB in all),
    # so the memory limit (the cgroup's, or the address-space limit without one) stops it.
    verdict = run_io(verifier_512, MAPPED_33_TIMES.replace("{kind}", "PRIVATE"), expected="33\n")
    assert (reason(verdict), verdict.score) == ("memory", 0.0), verdict.details


def test_ipc_objects_do_not_outlive_a_test(verifier: CodeVerifier) -> None:
    # Two io tests, two runners: the first leaves a SysV message queue and shared memory segment
    # under a fixed key; in the second they are gone (each run has its own IPC namespace).
    program = dedent("""\
        import ctypes, sys
        libc = ctypes.CDLL(None, use_errno=True)
        first = sys.stdin.read() == 'first'
        flags = 0o1600 if first else 0o600  # IPC_CREAT the first time only
        queue, shm = libc.msgget(4242, flags), libc.shmget(4243, 4096, flags)
        if first:
            msg = ctypes.create_string_buffer(b'\\1\\0\\0\\0\\0\\0\\0\\0secret', 16)
            libc.msgsnd(queue, msg, 6, 0)
        print(queue >= 0, shm >= 0)
        """)
    io = [{"input": "first", "output": "True True\n"}, {"input": "second", "output": "False False\n"}]
    verdict = verifier(Problem("", {"io": io}), program)
    assert verdict.score == 1.0, verdict.details


@pytest.mark.parametrize(("program", "stream"), [
    pytest.param("while True:\n    print('x' * 1000)", "stdout", id="stdout"),
    pytest.param("import os\nwhile True:\n    os.write(1, b'x' * 65536)", "stdout", id="raw-fd"),
    pytest.param("import sys\nwhile True:\n    sys.stderr.write('y' * 1000)", "stderr", id="stderr"),
])
def test_huge_output_is_cut_off(verifier: CodeVerifier, program: str, stream: str) -> None:
    start = time.monotonic()
    verdict = run_io(verifier, program)
    assert reason(verdict) == "output_limit"
    assert time.monotonic() - start < 3.0
    assert len(verdict.to_json()) < 5_000  # the details keep a capped tail, not the flood


def test_disk_is_capped(verifier: CodeVerifier) -> None:
    program = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 2**20)\n"
    verdict = run_io(verifier, program)
    assert reason(verdict) == "runtime_error"  # EFBIG / ENOSPC inside the per-attempt tmpfs
    assert "OSError" in verdict.details["stderr_tail"]


# ------------------------------------------------------------------------ escaping the sandbox


def test_cannot_write_outside_the_work_dir(verifier: CodeVerifier) -> None:
    targets = [f"/tmp/pwned_{uuid.uuid4().hex}", str(REPO / f"pwned_{uuid.uuid4().hex}"),
               str(Path(__file__).with_name("test_pwned.py")), "/etc/pwned", "/var/tmp/pwned"]
    program = dedent(f"""\
        for path in {targets!r}:
            try:
                open(path, 'w').write('x')
                print('wrote', path)
            except OSError as e:
                print('denied' if e.errno in (2, 13, 30) else e.errno)  # ENOENT, EACCES, EROFS
        open('inside.txt', 'w').write('fine')
        print(open('inside.txt').read())
        """)
    # EROFS for read-only mounts; ENOENT where the target's directory is hidden (a repo under /tmp)
    verdict = run_io(verifier, program, expected="denied\n" * len(targets) + "fine\n")
    assert verdict.score == 1.0, verdict.details
    assert not any(os.path.exists(path) for path in targets)


def test_runs_unprivileged_in_a_root_built_from_an_allowlist(verifier: CodeVerifier) -> None:
    # /root keeps only the way to the Python install, if that lives there (pyenv does).
    python = Path(sys.base_prefix).resolve().parts
    root = [python[2]] if python[:2] == ("/", "root") else []
    program = ("import os\nprint(os.getuid() != 0, os.getgid() != 0, os.getgroups())\n"
               "top = set(os.listdir('/'))\n"
               "print(sorted(top & {'etc', 'var', 'run', 'srv', 'home', 'mnt', 'opt', 'sys', 'work', 'boot'}))\n"
               "print(sorted(top & {'dev', 'proc', 'tmp'}), os.listdir('/root') if 'root' in top else [])\n"
               "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n")
    verdict = run_io(verifier, program, expected=f"True True []\n[]\n['dev', 'proc', 'tmp'] {root}\n['1', '2']\n")
    assert verdict.score == 1.0, verdict.details  # /proc shows only the judge (1) and itself (2)


def test_host_files_and_paths_are_out_of_sight(verifier: CodeVerifier) -> None:
    # World-readable files a program could otherwise read: a planted answer file, the project's
    # own files, the install path through the judge's command line.
    # The interpreter's own site-packages is covered by an empty folder; a venv's is not there at all.
    site_packages = sorted({str(Path(p).resolve()) for p in sys.path if p.endswith("-packages") and os.path.isdir(p)}
                           | {str(Path(os.__file__).resolve().parent / "site-packages")})
    planted = [Path(f"/var/tmp/pwned_answer_{uuid.uuid4().hex}"), REPO / f"pwned_answer_{uuid.uuid4().hex}",
               Path(f"/tmp/pwned_answer_{uuid.uuid4().hex}")]
    for path in planted:
        path.write_text("42")
        path.chmod(0o644)
    program = dedent(f"""\
        import os
        for path in {[str(p) for p in planted] + [str(REPO / "pyproject.toml"), "/etc/passwd"]!r}:
            try:
                print(open(path).read())
            except OSError as e:
                print('hidden' if e.errno == 2 else e.errno)
        print({str(REPO)!r}.encode() in open('/proc/1/cmdline', 'rb').read() + open('/proc/self/cmdline', 'rb').read())
        for path in {site_packages!r}:  # where a project (and its data) may be installed
            print(os.listdir(path) if os.path.isdir(path) else 'hidden')
        """)
    shown = ["[]" if Path(p).resolve().parent == Path(os.__file__).resolve().parent else "hidden"
             for p in site_packages]
    try:
        verdict = run_io(verifier, program, expected="hidden\n" * 5 + "False\n" + "".join(x + "\n" for x in shown))
    finally:
        for path in planted:
            path.unlink()
    assert verdict.score == 1.0, verdict.details


def test_unix_sockets_at_host_paths_are_unreachable(verifier: CodeVerifier) -> None:
    path = f"/tmp/pwned_sock_{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    server.settimeout(0.2)
    program = dedent(f"""\
        import socket
        for address in ({path!r}, '\\0feedbackrl-abstract'):
            try:
                socket.socket(socket.AF_UNIX).connect(address)
                print('connected')
            except OSError:
                print('blocked')
        """)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0feedbackrl-abstract")
    abstract.listen()
    try:
        verdict = run_io(verifier, program, expected="blocked\nblocked\n")
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
        abstract.close()
        os.unlink(path)
    assert verdict.score == 1.0, verdict.details


@pytest.mark.sandbox("seccomp")
def test_seccomp_refuses_kernel_surface_a_program_has_no_use_for(verifier: CodeVerifier) -> None:
    # Without the filter: io_uring_setup(1, NULL) -> EFAULT (14), add_key(...) -> EINVAL (22), and a
    # user namespace (unshare(CLONE_NEWUSER)) succeeds (0). With it, each is EPERM (1).
    program = dedent("""\
        import ctypes, os, threading
        libc = ctypes.CDLL(None, use_errno=True)
        err = lambda r: ctypes.get_errno() if r == -1 else 0
        print(err(libc.syscall(425, 1, None)), err(libc.syscall(248, b'user', b'x', None, 0, -2)),
              err(libc.unshare(0x10000000)))
        t = threading.Thread(target=print, args=('threads work',))
        t.start()
        t.join()
        if os.fork() == 0:
            os._exit(0)
        print('fork works', os.wait()[1])
        """)
    verdict = run_io(verifier, program, expected="1 1 1\nthreads work\nfork works 0\n")
    assert verdict.score == 1.0, verdict.details


def test_without_a_cgroup_jobs_run_and_the_log_says_why(verifier: CodeVerifier, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sandbox.sandbox_cgroup, "create", lambda *a: (None, "no cgroup v2 here (test)"))
    monkeypatch.setattr(sandbox, "_CGROUP_WARNED", [])
    with caplog.at_level("WARNING", logger="feedbackrl.rewards.sandbox"):
        verdict = verifier(Problem("", ADD_TESTS), GOLD_ADD)
    assert verdict.score == 1.0, verdict.details
    assert [r.getMessage() for r in caplog.records] == [
        "sandbox: no cgroup for the job's memory and processes (no cgroup v2 here (test)); falling back to "
        "rlimits, which do not count in-memory files or shared memory"]


def test_inherited_secrets_are_invisible(verifier: CodeVerifier, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = uuid.uuid4().hex
    monkeypatch.setenv("FEEDBACKRL_TEST_SECRET", secret)
    program = dedent(f"""\
        import os
        leaks = list(os.environ)
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                leaks += ['proc'] * ({secret.encode()!r} in open(f'/proc/{{pid}}/environ', 'rb').read())
            except OSError:
                pass
        print(leaks)
        """)
    assert run_io(verifier, program, expected="[]\n").score == 1.0


def test_network_is_unreachable(verifier: CodeVerifier) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port, accepted = server.getsockname()[1], []
    thread = threading.Thread(target=lambda: accepted.extend(_accept_all(server)), daemon=True)
    thread.start()
    program = dedent(f"""\
        import socket
        for address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:
            try:
                socket.create_connection(address, timeout=0.5)
                print('connected')
            except OSError:
                print('blocked')
        """)
    verdict = run_io(verifier, program, expected="blocked\nblocked\n")
    thread.join()
    server.close()
    assert verdict.score == 1.0, verdict.details
    assert accepted == []


def _accept_all(server: socket.socket, seconds: float = 2.5) -> list[tuple]:
    peers, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn, peer = server.accept()
            conn.close()
            peers.append(peer)
        except TimeoutError:
            continue
    return peers


def test_killing_the_parent_and_everything_else(verifier: CodeVerifier) -> None:
    program = dedent(f"""\
        import os, signal
        for target in (os.getppid(), 1, {os.getpid()}, -1):
            try:
                os.kill(target, signal.SIGKILL)
                print('sent', target)
            except OSError as e:
                print('refused', e.errno)
        """)
    verdict = run_io(verifier, program)
    # getppid() is the judge (pid 1): EPERM. Our pid does not exist in its namespace: ESRCH.
    # kill(-1) reaches only processes of the job's own uid: it "succeeds" and kills nothing else.
    out = verdict.details["tests"][0]["stdout"].split("\n")
    assert out[:3] == ["refused 1", "refused 1", "refused 3"] and out[3] in ("sent -1", "refused 3"), out
    assert run_io(verifier, "print('still working')", expected="still working\n").score == 1.0


def test_detached_daemon_dies_with_the_job(verifier: CodeVerifier, tmp_path: Path) -> None:
    marker = f"/tmp/pwned_daemon_{uuid.uuid4().hex}"
    program = dedent(f"""\
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 1024)
                time.sleep(0.5)
                for path in ({marker!r}, 'daemon-was-here'):
                    try:
                        open(path, 'w').write('alive')
                    except OSError:
                        pass
                time.sleep(60)
            os._exit(0)
        print('parent done')
        """)
    verdict = run_io(verifier, program, expected="parent done\n")
    assert verdict.score == 1.0, verdict.details
    assert sandbox_processes() == []  # gone the moment the verdict is back, not at some later sweep
    time.sleep(1.0)
    assert not os.path.exists(marker)


# ------------------------------------------------------------------------------- faking success


@pytest.mark.parametrize("program", [
    pytest.param("import sys\nsys.exit(0)", id="sys-exit"),
    pytest.param("import os\nos._exit(0)", id="os-exit"),
    pytest.param("raise SystemExit(0)", id="raise-systemexit"),
    pytest.param("exit()", id="exit-builtin"),
    pytest.param("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", id="kill-self"),
    pytest.param("import atexit, os\natexit.register(lambda: print('3 tests passed'))\n"
                 "def add(a, b):\n    os._exit(0)", id="atexit-then-exit-in-call"),
    pytest.param("def add(a, b):\n    raise SystemExit(0)", id="systemexit-in-call"),
    pytest.param("import threading, os\nthreading.Timer(0.0, lambda: os._exit(0)).start()\n"
                 "import time\ntime.sleep(0.5)", id="exit-from-thread"),
    pytest.param("import os\nos.close(3)\nos.close(1)", id="close-report-pipe"),
])
def test_early_exit_scores_zero(verifier: CodeVerifier, program: str) -> None:
    verdict = verifier(Problem("", ADD_TESTS), WRONG_ADD + program)
    assert verdict.score == 0.0, verdict.details
    assert {t["reason"] for t in verdict.details["tests"]} <= {"early_exit", "crash", "runtime_error"}


@pytest.mark.parametrize("program", [
    pytest.param("import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                 "AssertionError = None", id="override-assertionerror"),
    pytest.param("import sys\nsys.excepthook = lambda *a: None", id="excepthook"),
    pytest.param("import builtins\nbuiltins.__build_class__ = None", id="build-class"),
    pytest.param("import builtins\nfor name in ('eval', 'exec', 'isinstance', 'int', 'type', 'enumerate',"
                 " 'BaseException', 'dict', 'str', 'id', 'len'):\n"
                 "    setattr(builtins, name, lambda *a, **k: True)", id="patch-builtins"),
    pytest.param("isinstance = lambda *a: True\nsorted = lambda x: [3]\nstr = int",
                 id="shadow-names-the-asserts-use"),
    pytest.param("class Eq:\n    __eq__ = lambda self, other: True\n    __bool__ = lambda self: True\n"
                 "    __hash__ = None\ndef add(a, b):\n    return Eq()", id="always-equal"),
    pytest.param("class Eq(int):\n    __eq__ = lambda self, other: True\n    __hash__ = int.__hash__\n"
                 "def add(a, b):\n    return Eq(0)", id="int-subclass-always-equal"),
    pytest.param("class Meta(type):\n    __eq__ = lambda cls, other: True\n"
                 "    __hash__ = lambda cls: hash(str)\n"
                 "class Fake(metaclass=Meta):\n    __eq__ = lambda self, other: True\n"
                 "def add(a, b):\n    return Fake()", id="metaclass-posing-as-str"),
    pytest.param("print('PASS\\nPASS\\nPASS')\nimport os\nfor i in range(3):\n"
                 "    os.write(3, f'0123 D {i}\\n'.encode())", id="forged-markers-without-nonce"),
    pytest.param("import sys\nfor name, module in list(sys.modules.items()):\n"
                 "    if hasattr(module, 'encode') and 'sandbox' in name:\n"
                 "        module.encode = lambda value, depth=0: '3'", id="patch-the-harness-encoder"),
])
def test_tampering_scores_zero(verifier: CodeVerifier, program: str) -> None:
    verdict = verifier(Problem("", ADD_TESTS), WRONG_ADD + program)
    assert verdict.score == 0.0, verdict.details


def test_stolen_nonce_cannot_fake_equality_checks(verifier: CodeVerifier) -> None:
    # Past the threat model (it digs the harness's report function out of the heap), yet the
    # `==` checks still fail: the expected values never entered the sandbox.
    program = dedent("""\
        import gc, os
        report = next(f for f in gc.get_objects() if getattr(f, '__qualname__', '') == 'run.<locals>.report')
        report('L')
        for i in range(5):
            report(f'V {i} 0 0 1')
            report(f'D {i}')
        os._exit(0)
        """)
    verdict = verifier(Problem("", ADD_TESTS), program)
    assert verdict.score == 0.0, verdict.details


def test_benign_programs_still_pass_next_to_attacks(verifier: CodeVerifier) -> None:
    completions = [GOLD_ADD, "while True:\n    pass", GOLD_ADD, "import os\nos._exit(0)"]
    verdicts = verifier.batch([Problem("", ADD_TESTS)] * 4, completions, workers=2)
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0]


# ------------------------------------------- checks decided outside the program: each cheat class

SECRET = f"secret-{uuid.uuid4().hex}"
CHECK_BLOCK = {"asserts": [dedent(f"""\
    def check(candidate):
        assert candidate(1, 2) == 3
        assert candidate(2, 2) != 5
        assert 0 < candidate(0, 1) <= 1
        assert candidate(-1, 1) in (0, None)
        assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9
        for a, b in [(3, 4), (10, -2)]:
            assert candidate(a, b) == a + b
        assert candidate('a', 'b') == {SECRET!r}[:0] + 'ab'
    check(add)
    """)]}


@pytest.mark.parametrize("program", [
    pytest.param("class Eq:\n    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True\n"
                 "    __bool__ = lambda s: True\n    __contains__ = lambda s, o: True\n"
                 "    __sub__ = __rsub__ = __abs__ = __add__ = __radd__ = lambda s, *o: s\n"
                 "    __hash__ = None\ndef add(a, b):\n    return Eq()", id="always-equal"),
    pytest.param("class Eq(int):\n    __eq__ = __ne__ = __lt__ = __le__ = lambda s, o: True\n"
                 "    __hash__ = int.__hash__\ndef add(a, b):\n    return Eq(0)", id="int-subclass-always-equal"),
    pytest.param("class Eq(str):\n    __eq__ = __ne__ = lambda s, o: True\n    __hash__ = str.__hash__\n"
                 "def add(a, b):\n    return Eq('x')", id="str-subclass-always-equal"),
])
def test_always_equal_objects_pass_no_check_block(verifier: CodeVerifier, program: str) -> None:
    verdict = verifier(Problem("", CHECK_BLOCK), program)
    assert verdict.score == 0.0, verdict.details
    entry = verdict.details["tests"][0]
    assert (entry["reason"], entry["decided"]) == ("wrong_output", "judge"), entry
    assert verifier(Problem("", CHECK_BLOCK), GOLD_ADD).score == 1.0


@pytest.mark.parametrize("program", [
    pytest.param("import math\nmath.isclose = lambda *a, **k: True\nmath.pi = 3", id="patch-math"),
    pytest.param("import sys, types\nfake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\n"
                 "fake.pi = 3\nsys.modules['math'] = fake", id="fake-module-in-sys-modules"),
    pytest.param("import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
                 "builtins.AssertionError = KeyError", id="patch-builtins"),
])
def test_stdlib_monkeypatching_does_not_reach_the_checks(verifier: CodeVerifier, program: str) -> None:
    tests = {"asserts": ["import math\nassert math.isclose(area(1), math.pi)",
                         "assert abs(area(2) - 12.566370614359172) < 1e-9",
                         "assert isinstance(area(1), float) and area(1) > 3.1"]}
    wrong = program + "\ndef area(r):\n    return 3\n"
    verdict = verifier(Problem("", tests), wrong)
    assert verdict.score == 0.0, verdict.details
    assert [t["reason"] for t in verdict.details["tests"]] == ["wrong_output"] * 3
    right = program + "\nimport math as m\ndef area(r):\n    return 3.141592653589793 * r * r\n"
    assert verifier(Problem("", tests), right).score == 1.0


AREA_TESTS = {"asserts": [
    "assert math.isclose(area(2), 12.566370614359172)",  # `math`: the program's import, not the test's
    "assert area(2) == 4 * math.pi",
    "import math\nassert math.isclose(area(2), 12.566370614359172)",
    "from math import pi\nassert area(2) == 4 * pi",
    "assert abs(area(2) - 12.566370614359172) < 1e-6",  # HumanEval's shape
    "assert round(area(1), 2) == 3.14 and len([area(1)]) == 1 and sorted([area(2), area(1)])[0] < 4",
    "assert operator.eq(area(1), math.pi) and functools.reduce(operator.add, [area(1)]) > 3",
    "assert collections.Counter([area(1)])[math.pi] == 1 and sys.modules['math'].pi == math.pi",
]}
AREA = "\ndef area(r):\n    return {}\n"  # the program's area(), a wrong or the right body
PATCH_MODULES = "import math, operator, functools, collections, sys, types\n"


@pytest.mark.parametrize("patch", [
    pytest.param("math.isclose = lambda *a, **k: True\nmath.pi = 0.0\n", id="patch-math-isclose-and-pi"),
    pytest.param("class math:\n    pi = 0.0\n    isclose = staticmethod(lambda *a, **k: True)\n",
                 id="class-named-math"),
    pytest.param("fake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\nfake.pi = 0.0\n"
                 "sys.modules['math'] = math = fake\n", id="fake-math-in-sys-modules"),
    pytest.param("import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.round = lambda *a: 3.14\n"
                 "builtins.len = lambda x: 1\nbuiltins.sorted = lambda x: [0]\n"
                 "abs, round, len, sorted = builtins.abs, builtins.round, builtins.len, builtins.sorted\n",
                 id="patch-builtins-abs-round-len-sorted"),
    pytest.param("operator.eq = lambda a, b: True\noperator.add = lambda a, b: 99\n"
                 "functools.reduce = lambda f, xs: 99\ncollections.Counter = lambda xs: {math.pi: 1}\n",
                 id="patch-operator-functools-collections"),
    pytest.param("class Mods(dict):\n    def __getitem__(self, k):\n        return types.SimpleNamespace(pi=0.0)\n"
                 "sys.modules = Mods(sys.modules)\nsys = types.SimpleNamespace(modules={'math': "
                 "types.SimpleNamespace(pi=0.0)})\n", id="fake-sys-modules"),
])
def test_patched_modules_decide_no_check_when_the_test_names_the_program_s_module(
        verifier: CodeVerifier, patch: str) -> None:
    # Each test names stdlib modules the program imported (`math`, `operator`, ...) or imports
    # them itself; the judge evaluates all of it with its own modules, whatever the program did.
    wrong = PATCH_MODULES + patch + AREA.format("1.0")
    verdict = verifier(Problem("", AREA_TESTS), wrong)
    assert [t["reason"] for t in verdict.details["tests"]] == ["wrong_output"] * 8, verdict.details
    assert all(t["decided"] == "judge" for t in verdict.details["tests"])
    right = PATCH_MODULES + patch + AREA.format("3.141592653589793 * r * r")
    verdict = verifier(Problem("", AREA_TESTS), right)
    assert verdict.score == 1.0, verdict.details


@pytest.mark.parametrize("value", [
    pytest.param("class F(float):\n    __sub__ = __rsub__ = lambda s, o: 0.0\n    __abs__ = lambda s: 0.0\n"
                 "    __round__ = lambda s, n=None: 3.14\nresult = F(1.0)", id="float-subclass-arithmetic"),
    pytest.param("class I(int):\n    __sub__ = __rsub__ = lambda s, o: 0\n    __abs__ = lambda s: 0\n"
                 "    __lt__ = __gt__ = lambda s, o: True\nresult = I(1)", id="int-subclass-ordering"),
    pytest.param("class S(str):\n    __contains__ = lambda s, o: True\n    lower = lambda s: 'pi'\n"
                 "    __len__ = lambda s: 2\nresult = S('no')", id="str-subclass-methods"),
    pytest.param("class L(list):\n    __len__ = lambda s: 1\n    __getitem__ = lambda s, i: 3.14\n"
                 "    __contains__ = lambda s, o: True\nresult = L([9, 9])", id="list-subclass-methods"),
    pytest.param("class N:\n    __float__ = lambda s: 3.14159\n    __sub__ = __rsub__ = lambda s, o: 0.0\n"
                 "    __abs__ = lambda s: 0.0\n    __lt__ = __eq__ = lambda s, o: True\n    __hash__ = None\n"
                 "result = N()", id="object-with-numeric-dunders"),
])
def test_returned_objects_are_compared_as_plain_data_only(verifier: CodeVerifier, value: str) -> None:
    # `area` returns an object whose type rewrites arithmetic, ordering, containment or length:
    # the judge sees the plain value (a subclass of a builtin becomes that builtin) or a handle
    # that refuses to be compared, never the object's methods.
    tests = {"asserts": ["assert abs(area(2) - 3.14159) < 1e-6", "assert round(area(2), 2) == 3.14",
                         "import math\nassert math.isclose(area(2), 3.14159)", "assert area(2) < 0",
                         "assert 'pi' in area(2) or area(2).lower() == 'pi'",
                         "assert len(area(2)) == 1 and area(2)[0] == 3.14"]}
    program = value + "\ndef area(r):\n    return result\n"
    verdict = verifier(Problem("", tests), program)
    assert verdict.score == 0.0, verdict.details
    assert {t["decided"] for t in verdict.details["tests"]} == {"judge"}


def test_test_literals_are_nowhere_in_the_program_s_reach(patient_verifier: CodeVerifier) -> None:
    # The program looks for the expected value everywhere it can read: the frames above its
    # call, every object on its heap, its own memory, the judge's memory and command line. (The
    # long deadline: scanning its memory takes a while on a loaded machine.)
    program = dedent("""\
        import gc, os, re, sys
        def find():
            pattern = re.compile(rb'secret-[0-9a-f]{32}')
            frame, seen = sys._getframe(), []
            while frame is not None:
                seen += [repr(frame.f_locals), repr(frame.f_code.co_consts)]
                frame = frame.f_back
            seen += [repr(o)[:10000] for o in gc.get_objects() if isinstance(o, (str, dict, tuple, list))]
            blob = '\\n'.join(seen).encode()
            for pid in ('self', '1'):
                for name in ('cmdline', 'environ'):
                    try:
                        blob += open(f'/proc/{pid}/{name}', 'rb').read()
                    except OSError:
                        pass
                try:
                    mem = open(f'/proc/{pid}/mem', 'rb')
                    for line in open(f'/proc/{pid}/maps'):
                        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
                        if 'r' in line.split()[1] and hi - lo < 1 << 28:
                            try:
                                mem.seek(lo)
                                blob += mem.read(hi - lo)
                            except (OSError, OverflowError, ValueError):
                                pass
                except OSError:
                    pass
            found = pattern.search(blob)
            return found.group().decode() if found else 'nothing'
        def add(a, b):
            return find()
        """)
    verdict = patient_verifier(Problem("", {"asserts": [f"assert add(1, 2) == {SECRET!r}"]}), program)
    assert verdict.score == 0.0, verdict.details
    assert verdict.details["tests"][0]["detail"] == f"failed: assert add(1, 2) == {SECRET!r}"
    probe = patient_verifier(Problem("", {"asserts": ["assert add(1, 2) == 'nothing'"]}), program)
    assert probe.score == 1.0, probe.details  # the search ran to the end and found nothing


@pytest.mark.parametrize("program", [
    pytest.param(dedent("""\
        import gc, os
        report = next(f for f in gc.get_objects() if getattr(f, '__qualname__', '') == 'run.<locals>.report')
        for seq in range(1, 50):
            report(f'R {seq} v true')
        """), id="forge-replies-through-gc"),
    pytest.param(dedent("""\
        import sys
        def tracer(frame, event, arg):
            if frame.f_code.co_name == '_serve' and event == 'line':
                frame.f_locals.clear()
            return tracer
        sys.settrace(tracer)
        """), id="settrace-on-the-harness"),
    pytest.param(dedent("""\
        import sys, os
        def add(a, b):
            frame = sys._getframe(1)
            while frame is not None:  # climb to the harness and rewrite what it is about to send
                if 'report' in frame.f_locals:
                    frame.f_locals['report']('R 99 v true')
                    nonce = frame.f_globals.get('nonce')
                frame = frame.f_back
            os.write(3, b'L [\"l\"]\\n')
            return True
        """), id="forge-through-frames"),
])
def test_forged_reports_decide_nothing(verifier: CodeVerifier, program: str) -> None:
    tests = {"asserts": [f"assert add(1, 2) == {SECRET!r}", "assert add(2, 2) == 4 and add(0, 0) == 0",
                         "assert add(1, 1) == 2"]}
    verdict = verifier(Problem("", tests), WRONG_ADD + program)
    assert verdict.score == 0.0, verdict.details
    assert all(t["decided"] == "judge" for t in verdict.details["tests"] if "decided" in t)


def test_undecidable_tests_fail_unless_allowed_inside_the_sandbox(verifier: CodeVerifier) -> None:
    # A test that hands the program a function: the judge cannot call into it with plain data.
    tests = {"asserts": ["assert apply(lambda x: x + 1, 2) == 3", "assert apply(abs, -2) == 2"]}
    program = "def apply(f, x):\n    return f(x)\n"
    verdict = verifier(Problem("", tests), program)
    assert verdict.score == 0.0
    assert [t["reason"] for t in verdict.details["tests"]] == ["undecidable"] * 2
    assert "not plain data" in verdict.details["tests"][0]["detail"]
    lenient = CodeVerifier(timeout_s=1.0, memory_mb=256, sandbox_checks=True)
    verdict = lenient(Problem("", tests), program)
    assert verdict.score == 1.0, verdict.details
    assert [t["decided"] for t in verdict.details["tests"]] == ["sandbox", "sandbox"]


@pytest.mark.parametrize("test", [
    "assert all(map(lambda case: add(*case[0]) == case[1], [((1, 2), 3), ((2, 2), 4)]))",
    "def check(candidate):\n    for got, want in zip(map(candidate, [1, 2], [2, 2]), [3, 4]):\n"
    "        assert got == want\ncheck(add)",
    "assert [x for x in iter(lambda: add(1, 2), 3)] == []",
], ids=["all-of-map", "loop-over-map", "iter-sentinel"])
@pytest.mark.parametrize("stop", ["StopIteration", "StopAsyncIteration"])
def test_a_program_raising_stop_iteration_ends_no_test_loop(verifier: CodeVerifier, test: str, stop: str) -> None:
    # Raised out of a call that map() or iter(f, sentinel) makes, StopIteration would end the
    # test's iteration early, as if every case had passed; it comes to the test as RuntimeError.
    verdict = verifier(Problem("", {"asserts": [test]}), f"def add(a, b):\n    raise {stop}\n")
    assert verdict.score == 0.0, verdict.details
    entry = verdict.details["tests"][0]
    assert (entry["reason"], entry["decided"]) == ("runtime_error", "judge"), entry
    assert entry["detail"] == f"RuntimeError: {stop}, raised by the program", entry
    assert verifier(Problem("", {"asserts": [test]}), GOLD_ADD).score == 1.0


# A marshal dict, all ASCII, that reads as the judge's results with every test "ok": returned as
# a string, and printed by a test, it would reach the judge's stdout ahead of the real results.
FORGED_RESULTS = dedent("""\
    def _forged(n):
        entry = b"{z\\x07outcomez\\x02okz\\x06detailz\\x00z\\x07decidedz\\x05judge0"
        tests = b"[" + n.to_bytes(4, "little") + entry * n
        return (b"{z\\x05tests" + tests + b"z\\x08attemptsi\\x01\\x00\\x00\\x000").decode("ascii")
    def add(a, b):
        return _forged(3) + " " * 20000  # past the judge's stdout buffers: written at once
    """)


def test_what_a_test_prints_cannot_pose_as_the_judge_s_results(verifier: CodeVerifier) -> None:
    tests = {"asserts": ["print(add(1, 2))\nassert add(1, 2) == 3", "assert add(2, 2) == 4",
                         "print(add(0, 0))\nassert add(0, 0) == 0"]}
    verdict = verifier(Problem("", tests), FORGED_RESULTS)
    assert verdict.score == 0.0, verdict.details
    assert verdict.details["tests"][0] == {"test": "asserts[0]", "passed": False, "reason": "wrong_output",
                                           "detail": "failed: assert add(1, 2) == 3", "decided": "judge"}
    loud = "def add(a, b):\n    print('x' * 20000)\n    return a + b\n"  # a test that prints: no harm
    assert verifier(Problem("", {"asserts": ["print(add(1, 2) * 9999)\nassert add(1, 2) == 3"]}), loud).score == 1.0


def test_the_host_takes_exactly_one_framed_result_from_the_judge() -> None:
    framed = sandbox._framed({"tests": [], "attempts": 0})
    assert sandbox._unframed(framed) == {"tests": [], "attempts": 0}
    for bad in (framed + b"junk", b"junk" + framed, framed[:-1], b"", sandbox._framed([1, 2])):
        with pytest.raises((ValueError, TypeError, EOFError)):
            sandbox._unframed(bad)


# ------------------------------------------------------------------ judges started ahead of their job


def judge_pids() -> set[int]:
    """Host pids of `unshare` processes (each spare judge sits under one)."""
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[0].endswith(b"unshare"):
                found.add(int(name))
        except OSError:
            continue
    return found


def test_each_job_gets_a_judge_of_its_own_started_ahead(verifier: CodeVerifier) -> None:
    sandbox.stop_spares()
    assert sandbox.spare_cgroups() == []
    assert run_io(verifier, "print(1)", expected="1\n").score == 1.0  # started its judge on the spot
    spare = sandbox.spare_cgroups()  # the next job's judge, started while that job ran
    assert len(spare) in (1, 2)  # cgroup v2: one directory, v1: memory and pids
    # The next job runs in the spare's cgroup (its runner was moved in before it ran anything).
    program = ("print(sorted({line.rsplit('/', 1)[1] for line in open('/proc/self/cgroup').read().split()\n"
               "             if line.rsplit('/', 1)[1].startswith('feedbackrl-')}))")
    verdict = run_io(verifier, program, expected="none")
    names = sorted({os.path.basename(d) for d in spare})
    assert verdict.details["tests"][0]["stdout"].strip() == repr(names), verdict.details
    assert not any(os.path.exists(d) for d in spare), "the spare's cgroup went with the job it served"
    assert sandbox.spare_cgroups() != spare and len(sandbox.spare_cgroups()) == len(spare)


def test_a_spare_judge_that_died_is_replaced(verifier: CodeVerifier) -> None:
    run_io(verifier, "print(1)", expected="1\n")
    before = judge_pids()
    (spare,) = sandbox._Judge._spares[verifier.limits.memory_mb]
    os.killpg(spare.proc.pid, 9)
    spare.proc.wait()
    verdict = run_io(verifier, "print(2)", expected="2\n")
    assert verdict.score == 1.0, verdict.details
    assert spare.cgroup is None  # removed with the dead judge
    sandbox.stop_spares()
    assert sandbox.spare_cgroups() == [] and not judge_pids() - before


def test_a_runner_started_ahead_gets_its_job_s_cpu_limit_and_stdin(verifier: CodeVerifier) -> None:
    # The first runner of a job is started before the job; its CPU limit (an io test's: the 1 s
    # timeout + 1 s) and its stdin (here 3 MB, far over a pipe's buffer) come with the job,
    # before the program runs.
    program = ("import resource, sys\ndata = sys.stdin.read()\n"
               "print(resource.getrlimit(resource.RLIMIT_CPU), len(data), data[-3:])")
    for _ in range(2):  # the first job may start its runner on the spot; the second gets one started ahead
        verdict = run_io(verifier, program, expected="(2, 2) 3000000 xyz\n", stdin="a" * 2999997 + "xyz")
        assert verdict.score == 1.0, verdict.details
