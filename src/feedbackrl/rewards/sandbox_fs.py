"""The sandbox's filesystem: a root built from an allowlist, and the syscalls to build it.

The judge calls `build_root` in its private mount namespace. The new root is an empty tmpfs that
holds only read-only binds of what the interpreter needs (its binary, the standard library with
its extension modules, the dynamic loader and the system library directories, each reached
through the same symlinks as on the host), a minimal /dev (null, zero, full, random, urandom), a
fresh /proc, and /tmp with the working directory. No host folder (/etc, /var, /run, /srv, /home,
/tmp, the project, the user's data) and so no host unix socket is there; the Python install's
site-packages is covered by an empty tmpfs. The judge then moves the new root onto / and chroots
into it, which leaves the old root covered, unreachable from any path. Standard library only.
"""

from __future__ import annotations

import os
import sys

WORKDIR = "/tmp/w"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
DEVICES = ("null", "zero", "full", "random", "urandom")
EXECUTABLE = os.path.realpath(sys.executable)  # taken now: a venv's link is not in the new root
_NEW_ROOT = "/tmp"  # a tmpfs mounted here in the judge's namespace; the host's /tmp is untouched


class Libc:
    """The syscalls the standard library lacks: mount, umount2, unshare, prctl (and seccomp through it)."""

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

    def unshare(self, flags: int) -> None:
        if self.lib.unshare(flags) != 0:
            errno = self.ctypes.get_errno()
            raise OSError(errno, f"unshare: {os.strerror(errno)}")

    def no_new_privs(self) -> None:
        self.lib.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid binaries gain nothing

    def seccomp(self, program: bytes) -> None:
        """Install a BPF filter (`sandbox_seccomp.bpf()`); needs no_new_privs first. Kept by execve."""
        ctypes = self.ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        buf = ctypes.create_string_buffer(program, len(program))
        prog = SockFprog(len(program) // 8, ctypes.addressof(buf))  # 8 bytes per BPF instruction
        if self.lib.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            errno = ctypes.get_errno()
            raise OSError(errno, f"seccomp: {os.strerror(errno)}")


def build_root(libc: Libc) -> None:
    """Replace this mount namespace's root with one built from the allowlist (see the module doc)."""
    libc.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host
    links, dirs, files, hidden = allowlist()
    # Opened before the new root covers anything (a venv or the install may live under /tmp);
    # bound below through /proc/self/fd.
    sources = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in [*dirs, *files]]
    devices = [(f"/dev/{d}", os.open(f"/dev/{d}", os.O_PATH | os.O_CLOEXEC)) for d in DEVICES]
    libc.mount("tmpfs", _NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    new = lambda path: _NEW_ROOT + path
    for link, target in links:
        os.makedirs(os.path.dirname(new(link)), exist_ok=True)
        os.symlink(target, new(link))
    for path, fd in sources:
        _bind(libc, fd, new(path), os.path.isdir(path), MS_NODEV)
    for path in hidden:  # site-packages: what is installed there is not the program's business
        libc.mount("tmpfs", new(path), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=555")
    os.makedirs(new("/dev"))
    libc.mount("tmpfs", new("/dev"), "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for path, fd in devices:
        _bind(libc, fd, new(path), False, 0)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, new(f"/dev/{name}"))
    os.makedirs(new("/dev/shm"))
    libc.mount(None, new("/dev"), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.makedirs(new("/proc"))
    libc.mount("proc", new("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    os.makedirs(new(WORKDIR))
    os.chdir(_NEW_ROOT)
    libc.mount(_NEW_ROOT, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    libc.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _bind(libc: Libc, fd: int, target: str, is_dir: bool, nodev: int) -> None:
    os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
    if not is_dir:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
    libc.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    os.close(fd)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | nodev
    try:
        libc.mount(None, target, None, flags)
    except OSError:  # a source mounted noexec must keep it when remounted
        libc.mount(None, target, None, flags | MS_NOEXEC)


def allowlist() -> tuple[list[tuple[str, str]], list[str], list[str], list[str]]:
    """(symlinks to recreate, directories and files to bind, directories to cover), host paths."""
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    multiarch = getattr(sys.implementation, "_multiarch", "")
    dirs = {stdlib}
    dirs |= {os.path.dirname(os.path.realpath(m.__file__)) for m in list(sys.modules.values())
             if (getattr(m, "__file__", None) or "").endswith(".so")}  # lib-dynload
    dirs |= {d for d in (f"/usr/lib/{multiarch}", f"/lib/{multiarch}") if multiarch and os.path.isdir(d)}
    wanted = [EXECUTABLE, _interpreter(EXECUTABLE), *_mapped_libraries(), *dirs]
    links: dict[str, str] = {}
    reals = [_resolve(path, links) for path in wanted if path]
    dirs = {r for r in reals if os.path.isdir(r)}
    dirs = sorted(d for d in dirs if not any(d.startswith(o + "/") for o in dirs))
    inside = lambda p: any(p == d or p.startswith(d + "/") for d in dirs)
    files = sorted({r for r in reals if os.path.isfile(r) and not inside(r)})
    hidden = [os.path.join(stdlib, name) for name in ("site-packages", "dist-packages")
              if os.path.isdir(os.path.join(stdlib, name))]
    return [(k, v) for k, v in links.items() if not inside(k)], dirs, files, hidden


def _resolve(path: str, links: dict[str, str]) -> str:
    """`path` with every symlink along it followed; the links met are added to `links`."""
    parts, done = [p for p in path.split("/") if p], "/"
    for _ in range(64):  # a link loop gives up here; the bind of its target then just fails
        if not parts:
            return done
        step = os.path.join(done, parts.pop(0))
        if os.path.islink(step):
            target = os.readlink(step)
            links[step] = target
            parts = [p for p in target.split("/") if p] + parts
            done = "/" if target.startswith("/") else done
        else:
            done = os.path.normpath(step)
    return done


def _interpreter(executable: str) -> str | None:
    """The dynamic loader an ELF64 executable names (its PT_INTERP), else None."""
    with open(executable, "rb") as f:
        head = f.read(64)
        if head[:5] != b"\x7fELF\x02":
            return None
        phoff, phentsize, phnum = (int.from_bytes(head[a:b], "little") for a, b in ((32, 40), (54, 56), (56, 58)))
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            if int.from_bytes(ph[:4], "little") == 3:  # PT_INTERP
                f.seek(int.from_bytes(ph[8:16], "little"))
                return f.read(int.from_bytes(ph[32:40], "little")).rstrip(b"\0").decode()
    return None


def _mapped_libraries() -> list[str]:
    """Shared libraries this process has mapped (the interpreter's own, libffi for ctypes, ...)."""
    with open("/proc/self/maps") as f:
        paths = {fields[5] for line in f if len(fields := line.split(maxsplit=5)) == 6}
    return sorted(p.strip() for p in paths if p.startswith("/") and ".so" in os.path.basename(p.strip())
                  and os.path.isfile(p.strip()))
