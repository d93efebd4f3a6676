"""A cgroup per sandbox job: a memory limit that counts everything, and a process limit.

The address-space rlimit misses memory a program holds outside its mappings: in-memory files
(`memfd_create`), SysV shared memory, tmpfs pages. A memory cgroup charges all of them to the
job. The host creates the cgroup (`create`) and removes it after the job (`remove`, which also
kills anything still in it); the judge opens it before it hides the host's filesystem
(`open_job`) and moves each runner in (`JobCgroup.add`) before the runner reads its job, so no
program code runs outside it (the move waits out an RCU grace period, ~10 ms on cgroup v1, which
then overlaps the runner's interpreter start-up). Whether
the limit was reached is read from the kernel's counters (v2 memory.events `max` and `oom_kill`,
v1 memory.failcnt and `oom_kill`), so a program that fails after reaching it is reported as
"memory" whichever deadline came next, not as whatever error or timer happened to end it.

cgroup v2 is used where the memory and pids controllers are delegated to our cgroup; a v1
hierarchy (memory + pids mounted separately) otherwise; neither: `create` says why, and the
sandbox falls back to rlimits alone. Standard library only: the judge imports this too (so the
host-side functions import what they need themselves).
"""

from __future__ import annotations

import os

ROOT = "/sys/fs/cgroup"


def _own_paths() -> dict[str, str]:
    """{controller or "" (v2): our cgroup's path} from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _v2_base() -> str | None:
    base = os.path.join(ROOT, _own_paths().get("", "/").lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        if not {"memory", "pids"} <= set(enabled):  # delegated to us, or our cgroup is the root
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory +pids")
    except OSError:
        return None
    return base


def create(name: str, memory_mb: int, pids: int) -> tuple[dict | None, str]:
    """Make the job's cgroup with its limits: (job, "") or (None, why it is not available)."""
    import contextlib

    if os.geteuid() != 0:
        return None, "not root"
    base = _v2_base()
    if base is not None:
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
            _write(path, "memory.max", memory_mb << 20)
            _write(path, "pids.max", pids)
            _write(path, "memory.oom.group", 1)
            with contextlib.suppress(OSError):  # no swap configured: the file is missing
                _write(path, "memory.swap.max", 0)
            return {"version": 2, "dirs": [path]}, ""
        except OSError as exc:
            remove({"version": 2, "dirs": [path]})
            return None, f"cgroup v2 at {base}: {exc}"
    own = _own_paths()
    dirs = [os.path.join(ROOT, c, own.get(c, "/").lstrip("/"), name) for c in ("memory", "pids")]
    job = {"version": 1, "dirs": []}
    try:
        for d in dirs:
            os.mkdir(d)
            job["dirs"].append(d)
        _write(dirs[0], "memory.limit_in_bytes", memory_mb << 20)
        with contextlib.suppress(OSError):  # swap accounting off: swap is then not limited
            _write(dirs[0], "memory.memsw.limit_in_bytes", memory_mb << 20)
        _write(dirs[1], "pids.max", pids)
    except OSError as exc:
        remove(job)
        return None, (f"no cgroup v2 with the memory and pids controllers delegated at {ROOT}, "
                      f"and no writable v1 memory and pids hierarchies ({exc})")
    return job, ""


def _write(path: str, name: str, value: int) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def remove(job: dict) -> int:
    """Kill whatever is left in the job's cgroup and remove it; returns how many processes were left."""
    import contextlib
    import signal
    import time

    left = 0
    for path in reversed(job["dirs"]):
        for _ in range(100):
            pids = _read_pids(path)
            left = max(left, len(pids))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the killed processes are reaped
                time.sleep(0.01)
    return left


def _read_pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


class JobCgroup:
    """The judge's handles on the job's cgroup, opened before the host's filesystem is hidden."""

    def __init__(self, job: dict) -> None:
        self.version = job["version"]
        self.procs = [os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY) for d in job["dirs"]]
        events = ["memory.events"] if self.version == 2 else ["memory.failcnt", "memory.oom_control"]
        self.events = [os.open(os.path.join(job["dirs"][0], name), os.O_RDONLY) for name in events]

    def add(self, pid: int) -> None:
        """Move process `pid` (a runner that has not read its job yet) into the job's cgroup."""
        for fd in self.procs:
            os.write(fd, str(pid).encode())

    def limit_hits(self) -> int:
        """How often this job's memory reached its limit so far (a charge refused, an OOM kill)."""
        hits = 0
        for fd in self.events:
            for line in os.pread(fd, 4096, 0).decode().splitlines():
                key, _, value = line.rpartition(" ")
                if key in ("", "max", "oom_kill"):  # v1 memory.failcnt is one bare number
                    hits += int(value)
        return hits


def open_job(job: dict) -> JobCgroup:
    return JobCgroup(job)
