"""Splitting a kernel's rows across threads. Kernels release the GIL, so a small pool of
Python threads runs them in parallel; the calling thread takes the first chunk itself.
The thread count is `XFUSE_NUM_THREADS`, or `set_num_threads(n)`, or the number of cores.
Imports the standard library only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

_lock = threading.Lock()
_pool = None  # a concurrent.futures.ThreadPoolExecutor, made on first use
_threads = 0


def num_threads() -> int:
    if _threads:
        return _threads
    env = os.environ.get("XFUSE_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"XFUSE_NUM_THREADS={env!r} is not a whole number") from None
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def set_num_threads(n: int | None) -> None:
    """How many threads run one kernel (1: every kernel runs on the calling thread; None: back
    to `XFUSE_NUM_THREADS` or the number of cores)."""
    global _threads, _pool
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"the thread count must be a positive integer or None, got {n!r}")
    n = n or 0
    with _lock:
        _threads = n
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def _get_pool(workers: int):
    from concurrent.futures import ThreadPoolExecutor

    global _pool
    with _lock:
        if _pool is None or _pool._max_workers < workers:  # noqa: SLF001 - sizing only
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xfuse")
        return _pool


def run_rows(fn: Callable[[int, int], None], rows: int, split: bool = True) -> None:
    """Runs fn(start, end) over [0, rows), in one chunk per thread when `split`."""
    threads = min(num_threads(), rows) if split else 1
    if threads <= 1:
        fn(0, rows)
        return
    bounds = [rows * i // threads for i in range(threads + 1)]
    pool = _get_pool(threads - 1)
    futures = [pool.submit(fn, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    try:
        fn(bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()
