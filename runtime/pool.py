"""A pool of large buffers, reused once nothing refers to them any more.

Fresh pages fault slowly (the first write to each page of a new mapping costs far more than
the write), and numpy maps every large array afresh, so a kernel writing a 64 MiB output into
a new array spends much of its time in the kernel's page-fault handler. The pool keeps the
memory of large arrays instead: `empty()` hands out an array over a recycled block; when the
array and every view of it are gone, a finalizer puts the block back. An array given to a user
is therefore never reused while the user (or any view) holds it.

Arrays below `MIN_BYTES` come from numpy directly: malloc already recycles small blocks. The
pool keeps at most `XFUSE_POOL_BYTES` (default 1 GiB) of idle memory. Standard library and
numpy only; thread-safe.
"""

from __future__ import annotations

import os
import threading
import weakref
from math import prod

import numpy as np

MIN_BYTES = 1 << 20


class BufferPool:
    def __init__(self, limit: int | None = None) -> None:
        if limit is None:
            limit = int(os.environ.get("XFUSE_POOL_BYTES", 1 << 30))
        self.limit = limit
        self._free: dict[int, list[np.ndarray]] = {}
        self._idle = 0
        self._lock = threading.Lock()
        self.reused = 0  # blocks handed out again
        self.allocated = 0  # blocks made

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = prod(shape)
        nbytes = size * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                self._idle -= nbytes
                self.reused += 1
            else:
                self.allocated += 1
        if block is None:
            block = np.empty(nbytes, np.uint8)
        # The owner is an array over a memoryview, so every view of it keeps it (not the block)
        # alive: its finalizer runs only when the last view is gone.
        owner = np.frombuffer(memoryview(block), dtype=dtype, count=size)
        weakref.finalize(owner, self._release, block)
        return owner.reshape(shape)

    def _release(self, block: np.ndarray) -> None:
        with self._lock:
            if self._idle + block.nbytes <= self.limit:
                self._free.setdefault(block.nbytes, []).append(block)
                self._idle += block.nbytes

    @property
    def idle_bytes(self) -> int:
        return self._idle

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._idle = 0


POOL = BufferPool()


def c_ordered(x, writable: bool = False):
    """(`x` as a C-ordered array, writable where asked; whether it is a copy made here, which no
    one else holds). An ndarray that is not so is copied into a block of the pool: fresh pages
    fault slowly, and the parts of a split loop copy the views of their state at each call
    (`runtime.split_loops`). Anything else (a scalar) comes back as it is."""
    if not isinstance(x, np.ndarray) or x.flags.c_contiguous and (x.flags.writeable or not writable):
        return x, False
    y = POOL.empty(x.shape, x.dtype)
    np.copyto(y, x)
    return y, True
