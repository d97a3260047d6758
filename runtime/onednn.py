"""float32 products through oneDNN's `dnnl_sgemm`, where the `onednn-cpu-gomp` package is
installed: on these machines it runs at the core's peak on one thread (104-111 GFLOP/s, against
OpenBLAS's 96-104), and a product split over both cores at 195-213 GFLOP/s, where OpenBLAS's
(numpy's) runs at 165-190 and XLA's at 186-192 (the benchmark suite's shapes).

Every call runs on the calling thread alone: oneDNN takes its thread count from OpenMP, which
is set to one around the call and put back after, so OpenMP never starts a team. A team's
threads would spin for milliseconds after each product (GOMP_SPINCOUNT) against the kernels
that follow and against numpy's own BLAS threads; xfuse splits a large product over its own
threads instead (`products.matmul`), which wait without spinning.

Large products go to it only where the CPU has AVX-512 (`preferred`), where those figures
were measured. On an AVX2 EPYC (znver3) here, its one-thread products ran at 23-52 GFLOP/s at
the GELU MLP's shapes (256x1024 @ 1024x2048, 128x1024 @ 1024x4096), where OpenBLAS's ran at
53-63, and gelu's first product split over both cores took 21-36 ms through it against
17.3-17.7 ms through OpenBLAS on one thread in each.

`XFUSE_ONEDNN=0` turns it off; `XFUSE_ONEDNN=1` uses it whatever the CPU;
`XFUSE_ONEDNN=/path/libdnnl.so.3` names the library (and uses it whatever the CPU). Where the
library or OpenMP cannot be loaded, `sgemm` is None and products go to numpy. Imports the
standard library and numpy only.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable

import numpy as np

_F32 = np.dtype(np.float32)
_loaded: list = []  # [(sgemm, addresses) or None], once looked for
_lock = threading.Lock()


def _library_path() -> str | None:
    setting = os.environ.get("XFUSE_ONEDNN", "")
    if setting == "0":
        return None
    if setting and setting != "1":
        return setting
    try:
        from importlib import metadata

        files = metadata.files("onednn-cpu-gomp") or []
    except Exception:  # not installed (PackageNotFoundError), or unreadable metadata
        return None
    paths = [str(f.locate()) for f in files if f.name.startswith("libdnnl.so")]
    paths.sort(key=lambda path: not path.endswith(".so.3"))  # the soname first
    return next((path for path in paths if os.path.exists(path)), None)


def installed() -> bool:
    """Whether the library is there to load (`XFUSE_ONEDNN` not 0), without loading it."""
    return _library_path() is not None


def _load() -> tuple[Callable, tuple[int, int, int]] | None:
    path = _library_path()
    if path is None:
        return None
    try:
        dnnl = ctypes.CDLL(path)
        omp = ctypes.CDLL("libgomp.so.1")  # oneDNN's OpenMP: already loaded with it
        call = dnnl.dnnl_sgemm
        get_threads, set_threads = omp.omp_get_max_threads, omp.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    dim, ptr = ctypes.c_int64, ctypes.c_void_p
    call.restype = ctypes.c_int
    call.argtypes = [ctypes.c_char, ctypes.c_char, dim, dim, dim, ctypes.c_float, ptr, dim, ptr, dim,
                     ctypes.c_float, ptr, dim]
    get_threads.restype, get_threads.argtypes = ctypes.c_int, []
    set_threads.restype, set_threads.argtypes = None, [ctypes.c_int]

    def sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """out = a @ b for 2-D float32 arrays: each operand rows of contiguous elements (a
        block of a C-contiguous matrix) or the transpose of such; `out` such rows, apart from
        both operands. False (nothing written) for anything else."""
        if a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or not out.flags.writeable:
            return False
        m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0 or k == 0:  # nothing to read: no layout to check
            out.fill(0.0)
            return True
        ta, lda = layout(a)
        tb, ldb = layout(b)
        tc, ldc = layout(out)
        if ta is None or tb is None or tc != b"N" or np.may_share_memory(out, a) \
                or np.may_share_memory(out, b):  # numpy copies an operand the output overlaps
            return False
        threads = get_threads()
        if threads != 1:
            set_threads(1)
        try:
            status = call(ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
                          out.ctypes.data, ldc)
        finally:
            if threads != 1:
                set_threads(threads)
        if status != 0:
            raise RuntimeError(f"dnnl_sgemm failed with status {status} on ({m}, {k}) @ ({k}, {n})")
        return True

    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    return sgemm, (address(call), address(get_threads), address(set_threads))


def layout(x: np.ndarray) -> tuple[bytes | None, int]:
    """(b'N' or b'T', leading dimension) of a 2-D float32 operand as dnnl_sgemm (row-major)
    reads it, or (None, 0)."""
    if x.ndim != 2 or not x.flags.aligned:
        return None, 0
    rows, cols = x.shape
    s0, s1 = x.strides
    if (s1 == 4 or cols <= 1) and s0 >= 4 * max(cols, 1) and s0 % 4 == 0:
        return b"N", max(s0 // 4, cols, 1)
    if (s0 == 4 or rows <= 1) and s1 >= 4 * max(rows, 1) and s1 % 4 == 0:
        return b"T", max(s1 // 4, rows, 1)
    return None, 0


def _library() -> tuple[Callable, tuple[int, int, int]] | None:
    if not _loaded:
        with _lock:  # threads calling first at once load it once
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def sgemm() -> Callable | None:
    """The product function, or None where oneDNN is not there (looked for once)."""
    found = _library()
    return found[0] if found is not None else None


def addresses() -> tuple[int, int, int] | None:
    """The addresses of `dnnl_sgemm`, `omp_get_max_threads` and `omp_set_num_threads`, for a
    backend's compiled code to call them itself (`sgemm`'s contract: one thread a call, see the
    module docstring), or None where oneDNN is not there."""
    found = _library()
    return found[1] if found is not None else None


@functools.cache
def _has_avx512() -> bool:
    """Whether /proc/cpuinfo lists avx512f for the first CPU (False where it cannot be read);
    read once."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def preferred() -> bool:
    """Whether large float32 products should go to oneDNN (`products.matmul`): where the CPU
    has AVX-512, or where `XFUSE_ONEDNN` asks for it (1 or a path); never where it is 0."""
    setting = os.environ.get("XFUSE_ONEDNN", "")
    if setting:
        return setting != "0"
    return _has_avx512()


def loaded() -> bool:
    """Whether oneDNN has been looked for and loaded (it is on the first large product)."""
    return bool(_loaded and _loaded[0])


def _after_fork_in_child() -> None:
    """A child forked while another thread loaded the library starts with a fresh lock."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["addresses", "installed", "layout", "loaded", "preferred", "sgemm"]
