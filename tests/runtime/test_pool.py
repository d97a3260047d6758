"""The buffer pool: large arrays are recycled only after the caller and every view let go;
temporaries are dropped after their last reader; the pool is safe under threads."""

from __future__ import annotations

import gc
import threading

import numpy as np

from xfuse.runtime.pool import MIN_BYTES, BufferPool

N = MIN_BYTES // 4 * 2  # float32 elements of a pooled (2 MiB) array


def test_small_arrays_bypass_the_pool():
    pool = BufferPool()
    a = pool.empty((16,), np.float32)
    assert a.shape == (16,) and a.dtype == np.float32 and a.flags.writeable
    assert pool.allocated == 0


def test_a_block_returns_when_the_last_view_is_gone():
    pool = BufferPool()
    a = pool.empty((N,), np.float32)
    a[:] = 7
    view = a[10:20]
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = pool.empty((N,), np.float32)  # the view still holds the first block
    assert b.__array_interface__["data"][0] != address
    b[:] = 1
    assert np.all(view == 7)
    del view
    gc.collect()
    c = pool.empty((N // 2, 2), np.float32)  # same bytes: the first block again
    assert c.__array_interface__["data"][0] == address
    assert pool.reused == 1 and pool.allocated == 2


def test_idle_memory_is_bounded():
    pool = BufferPool(limit=3 * MIN_BYTES)
    arrays = [pool.empty((MIN_BYTES,), np.uint8) for _ in range(5)]
    del arrays
    gc.collect()
    assert pool.idle_bytes == 3 * MIN_BYTES
    pool.clear()
    assert pool.idle_bytes == 0


def test_threads_never_share_a_live_block():
    pool = BufferPool()
    errors = []

    def work(seed):
        for i in range(200):
            a = pool.empty((N,), np.float32)
            a[:] = seed * 1000 + i
            if not np.all(a == seed * 1000 + i):
                errors.append((seed, i))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.reused > 0
