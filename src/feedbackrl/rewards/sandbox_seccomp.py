"""A seccomp filter for the sandbox's runners: a second line behind the namespaces and the uid.

It refuses (EPERM) the system calls a Python program has no use for and that widen the kernel
surface a program can reach: namespaces and mounts, tracing and other processes' memory, kernel
keyrings, BPF, perf, io_uring, userfaultfd, module and kexec loading, and the like. `clone3`
answers ENOSYS (its flags are out of a filter's reach, so libc falls back to `clone`, whose
namespace flags are refused). The filter is built on the host with pyseccomp, a ctypes binding
to libseccomp (API-compatible with libseccomp's own Python bindings, which are not on PyPI),
and exported as BPF bytes; the runner only loads them (`sandbox_fs.Libc.seccomp`), so the
judge needs neither. Without pyseccomp or libseccomp, `bpf()` says why and runners go without the filter.
"""

from __future__ import annotations

import errno
import tempfile
from functools import cache

DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "pidfd_getfd", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot",
    "acct", "quotactl", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "lookup_dcookie", "personality", "vhangup", "iopl", "ioperm",
)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_NAMESPACE_FLAGS = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)


@cache
def bpf() -> tuple[bytes | None, str]:
    """(the filter as BPF bytes, "") or (None, why there is none)."""
    try:
        import pyseccomp as sc
    except ImportError:
        return None, "pyseccomp is not installed"
    try:
        f = sc.SyscallFilter(defaction=sc.ALLOW)
        for name in DENIED:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (ValueError, OSError):  # not a system call on this architecture
                continue
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for flag in _NAMESPACE_FLAGS:
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        with tempfile.TemporaryFile() as out:
            f.export_bpf(out)
            out.seek(0)
            return out.read(), ""
    except Exception as exc:  # libseccomp missing or too old: the sandbox still holds without it
        return None, f"libseccomp: {type(exc).__name__}: {exc}"
