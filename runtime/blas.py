"""One set of threads for products and kernels: while xfuse splits a product over its own
threads, the BLAS under numpy runs single-threaded in each of them.

OpenBLAS's worker threads spin after every multi-threaded call (with sched_yield, for up to
2**28 cycles, about 0.1 s on these machines) before they sleep. A kernel that xfuse splits over
both cores right after such a product shares the cores with a spinning worker: attention's
softmax took 6.3 ms after its product against 2.7 ms alone. So a program with kernels split
over threads (`program.build` decides) runs its products in xfuse's threads too, each thread a
block of rows or of the batch, with OpenBLAS set to one thread meanwhile, and no BLAS worker
is woken.

`single_threaded()` sets every OpenBLAS that the process has loaded to one thread and puts the
previous count back when the last user leaves; it does nothing where no OpenBLAS is found
(other BLAS libraries, or no /proc/self/maps). Products numpy runs meanwhile in other threads
of the process also run single-threaded. `XFUSE_SPLIT_PRODUCTS=0` turns the split off: BLAS
then runs every product with its own threads. Imports the standard library only.
"""

from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

# The thread-count functions of OpenBLAS builds: numpy's wheels ship scipy-openblas (64-bit
# integers, prefixed symbols); other builds keep the plain names.
_NAMES = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)

ENABLED = os.environ.get("XFUSE_SPLIT_PRODUCTS", "1") != "0"

_lock = threading.Lock()
_found: list[tuple] | None = None  # (get, set) of each OpenBLAS loaded
_looked_at: set[str] = set()  # the libraries' paths
_depth = 0
_saved: list[int] = []


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if "openblas" in os.path.basename(p).lower() and ".so" in p)


def controls() -> list[tuple]:
    """(get, set) for each OpenBLAS loaded in this process (found once, and again by `rescan`;
    empty if none)."""
    global _found
    if _found is None:
        _found = []
        _add(_loaded_openblas())
    return _found


def _add(paths: list[str]) -> list[tuple]:
    """Controls for the libraries among `paths` not looked at before, added to `_found`."""
    added = []
    for path in paths:
        if path in _looked_at:
            continue
        _looked_at.add(path)
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _NAMES:
            if hasattr(lib, get_name) and hasattr(lib, set_name):
                get, set_ = getattr(lib, get_name), getattr(lib, set_name)
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                added.append((get, set_))
                break
    _found.extend(added)
    return added


def rescan() -> None:
    """Looks again for OpenBLAS libraries loaded since the first look: numba's np.dot calls
    scipy's, another OpenBLAS than numpy's, loaded when scipy.linalg is imported. Inside a
    `single_threaded` block, one found now runs on one thread at once."""
    with _lock:
        if _found is None:
            controls()
            return
        for get, set_ in _add(_loaded_openblas()):
            if _depth:
                _saved.append(get())
                set_(1)


def available() -> bool:
    """Whether products can run in xfuse's threads: the split is on and BLAS's thread count
    can be set."""
    return ENABLED and bool(controls())


def threads() -> list[int]:
    """The thread count of each OpenBLAS loaded."""
    return [get() for get, _ in controls()]


@contextmanager
def single_threaded():
    """Every OpenBLAS loaded runs on one thread inside the block (nested and concurrent blocks
    share one setting; the last to leave restores the counts)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = threads()
            for _, set_ in controls():
                set_(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()


def _restore() -> None:
    for (_, set_), count in zip(controls(), _saved):
        set_(count)


def _after_fork_in_child() -> None:
    """A child forked inside a block (from another thread) never sees it close: it puts the
    counts back now, and starts with a fresh lock."""
    global _lock, _depth
    _lock = threading.Lock()
    if _depth:
        _depth = 0
        _restore()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["ENABLED", "available", "controls", "rescan", "single_threaded", "threads"]
