"""The decode-attention kernel (`decode_attention.c`), compiled on first use with the system C compiler.

`decode_attention` is what `generate._LlamaDecoder` runs for one new token per row: RoPE, the KV-cache
append and softmax attention in one pass (the C file says why by hand). It is built once per machine
with `cc -O3 -march=native -fopenmp` into a cache directory (`$FEEDBACKRL_CACHE`, else
`~/.cache/feedbackrl`) and loaded with ctypes; OpenMP resolves to the libgomp that PyTorch already
loaded, so the kernel shares PyTorch's threads and `torch.set_num_threads` applies to it.

`FEEDBACKRL_NATIVE_MARCH` replaces `native` in `-march` (e.g. `x86-64-v3`: AVX2 and FMA, no AVX-512), for a run
that emulates a narrower CPU alongside PyTorch's own caps (`ATEN_CPU_CAPABILITY` and the like).

Without a C compiler, or with `FEEDBACKRL_NATIVE=0`, `available()` is False and the decoder keeps its
PyTorch path (same maths; the tests run both and compare them).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("decode_attention.c")
# longer caches and larger heads keep the PyTorch path: the kernel's per-thread buffers (len + D floats) live on
# the stack, 64 KB at most, which every thread library's default stack holds
MAX_HEAD_DIM, MAX_CACHE = 256, 1 << 14
_FLAGS = ["-O3", "-fopenmp", "-fPIC", "-shared", "-std=c11"]


def _flags() -> list[str]:
    return [f"-march={os.environ.get('FEEDBACKRL_NATIVE_MARCH') or 'native'}", *_FLAGS]


def _cache_dir() -> Path:
    return Path(os.environ.get("FEEDBACKRL_CACHE") or Path.home() / ".cache" / "feedbackrl") / "native"


def _cpu_id() -> str:
    """The CPU model and flags (-march=native builds for this CPU only): part of the cache key."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))


def _build(cc: str) -> Path:
    source = _SOURCE.read_bytes()
    flags = _flags()
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), cc.encode(), _cpu_id().encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    lib = _cache_dir() / f"decode_attention-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    # build beside the target, then rename: concurrent first uses (pytest workers, Ray actors) never see half a file
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = Path(tmp) / lib.name
        proc = subprocess.run([cc, *flags, str(_SOURCE), "-o", str(out), "-lm"], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed to build {_SOURCE.name}:\n{proc.stderr.strip()}")
        os.replace(out, lib)
    return lib


@cache
def _kernel() -> ctypes._CFuncPtr | None:
    if os.environ.get("FEEDBACKRL_NATIVE", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler found: generation uses the PyTorch decode path")
        return None
    try:
        fn = ctypes.CDLL(str(_build(cc))).frl_decode_attention
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        log.warning("decode-attention kernel unavailable, using the PyTorch path: %s", err)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    fn.restype = None
    return fn


def available() -> bool:
    """True when the kernel is built and loaded (CPU tensors only)."""
    return _kernel() is not None


def _check(qkv: Tensor, rot: Tensor, k: Tensor, v: Tensor, at: int, keep: Tensor | None, out: Tensor,
           heads: int) -> None:
    n, kv_heads, t, d = v.shape
    if not (qkv.dtype == k.dtype == v.dtype == out.dtype == torch.float32 and rot.dtype == torch.complex64):
        raise TypeError("decode_attention takes float32 tensors and a complex64 rot")
    tensors = (qkv, rot, k, v, out) + (() if keep is None else (keep,))
    if any(x.device.type != "cpu" for x in tensors):
        raise ValueError("decode_attention: CPU tensors only (the kernel reads their memory directly)")
    if not (k.is_contiguous() and v.is_contiguous() and rot.is_contiguous() and k.shape == v.shape
            and qkv.stride(1) == 1 and qkv.stride(0) >= qkv.shape[1] and out.stride(1) == 1
            and out.stride(0) >= out.shape[1]):
        raise ValueError("decode_attention: contiguous caches and row-major qkv/out (distinct rows) expected")
    if d <= 0 or d % 2 or kv_heads <= 0:
        raise ValueError(f"decode_attention: head dim {d} must be even (RoPE pairs) and kv heads {kv_heads} > 0")
    if qkv.shape != (n, (heads + 2 * kv_heads) * d) or out.shape != (n, heads * d) or rot.shape != (n, d // 2):
        raise ValueError(f"decode_attention: shapes qkv {tuple(qkv.shape)}, out {tuple(out.shape)}, "
                         f"rot {tuple(rot.shape)} do not match the cache {tuple(v.shape)} with {heads} heads")
    if d > MAX_HEAD_DIM or t > MAX_CACHE:
        raise ValueError(f"decode_attention: head dim {d} or cache length {t} above the kernel's "
                         f"{MAX_HEAD_DIM} / {MAX_CACHE} (its per-thread buffers live on the stack)")
    if not 0 <= at < t or heads % kv_heads:
        raise ValueError(f"decode_attention: position {at} outside a cache of {t}, or {heads} heads "
                         f"not a multiple of {kv_heads} kv heads")
    if keep is not None and (keep.dtype != torch.bool or keep.shape != (n, t) or not keep.is_contiguous()):
        raise ValueError("decode_attention: keep must be a contiguous (N, T) bool tensor")


def decode_attention(qkv: Tensor, rot: Tensor, k: Tensor, v: Tensor, at: int, keep: Tensor | None, out: Tensor,
                     heads: int, scale: float) -> None:
    """One new token per row: RoPE q and k of `qkv` in place, write k and v to cache position `at`, attend.

    qkv (N, (H + 2 Hkv) D) float32 with unit column stride, q/k heads in `rope_pair_rows` order; rot
    (N, D/2) complex64 (cos + j sin of each row's position); k, v (N, Hkv, T, D) the key and value
    caches, both contiguous; keep (N, T) bool or None (every key visible); out (N, H D) with unit
    column stride. Keys 0..at of each row are attended (the new one included).
    """
    fn = _kernel()
    if fn is None:
        raise RuntimeError("decode-attention kernel not available (check native.available() first)")
    _check(qkv, rot, k, v, at, keep, out, heads)
    n, kv_heads, t, d = v.shape
    fn(qkv.data_ptr(), qkv.stride(0), rot.data_ptr(), k.data_ptr(), v.data_ptr(), at,
       None if keep is None else keep.data_ptr(), out.data_ptr(), out.stride(0), n, heads, kv_heads, t, d, scale,
       torch.get_num_threads())


class DecodeAttention:
    """`decode_attention` with everything but the position fixed, checked once: the decoder's per-layer call.

    qkv, rot and out are buffers the caller refills every step in place (an `out=` that resized one would move
    its storage: each call checks it did not); caches is one (k, v) per layer, all of one shape.
    """

    def __init__(self, qkv: Tensor, rot: Tensor, caches: list[tuple[Tensor, Tensor]], keep: Tensor | None,
                 out: Tensor, heads: int, scale: float) -> None:
        for k, v in caches:  # every check of decode_attention, once
            if k.shape != caches[0][0].shape:
                raise ValueError(f"decode_attention: layer caches differ in shape: {tuple(k.shape)} and "
                                 f"{tuple(caches[0][0].shape)}")
            _check(qkv, rot, k, v, k.shape[2] - 1, keep, out, heads)
        self.fn = _kernel()
        n, kv_heads, t, d = caches[0][1].shape
        self.t = t
        self.buffers = (qkv, rot, out)
        self.pointers = tuple(b.data_ptr() for b in self.buffers)
        self.head = (qkv.data_ptr(), qkv.stride(0), rot.data_ptr())
        self.layers = [(k.data_ptr(), v.data_ptr()) for k, v in caches]
        self.tail = (None if keep is None else keep.data_ptr(), out.data_ptr(), out.stride(0), n, heads, kv_heads, t,
                     d, scale)
        self._keep_alive = (qkv, rot, caches, keep, out)

    def __call__(self, layer: int, at: int) -> None:
        if not 0 <= at < self.t:
            raise ValueError(f"decode_attention: position {at} outside a cache of {self.t}")
        if tuple(b.data_ptr() for b in self.buffers) != self.pointers:
            raise RuntimeError("decode_attention: a buffer moved (resized by an out= of another shape?)")
        self.fn(*self.head, *self.layers[layer], at, *self.tail, torch.get_num_threads())
