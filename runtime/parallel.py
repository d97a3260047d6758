"""Splitting a kernel's rows across threads. Kernels release the GIL, so a small pool of
Python threads runs them in parallel; the calling thread takes the first chunk itself.
The thread count is `XFUSE_NUM_THREADS`, or `set_num_threads(n)`, or the number of cores the
process may run on (read when the setting is first used).

The pool is lean: its threads wait on one `queue.SimpleQueue` of chunks (a lock in C), and
each chunk reports back on a queue of its own. Splitting a numba kernel over two threads cost
about 65 us more than running it on one through `concurrent.futures` (whose futures wait on
Python-level conditions), and 40 us this way, most of it the OS waking the other thread. A
chunk's exception reaches the caller once every chunk is done (they write the caller's
buffers). A split asked for inside a chunk runs serially on that chunk's thread, so nested
splits cannot wait on each other. A forked child makes a pool of its own (the parent's threads
are not in it). Imports the standard library only.
"""

from __future__ import annotations

import os
import threading
from _queue import SimpleQueue  # queue.SimpleQueue, without the rest of queue (heapq) to import
from collections.abc import Callable

_lock = threading.Lock()
_pool = None  # a _Pool, made on first use
_threads = 0
_local = threading.local()  # .worker: this thread is one of the pool's
_default = (0, 1)  # (XFUSE_NUM_THREADS when last read, the count it gives); 0 is never a setting
# os.environ's own mapping of encoded names to encoded values, which every change through
# os.environ updates: a lookup there takes 24 ns, os.environ.get 0.6 us (it encodes the name and
# decodes the value), and a split kernel asks for the thread count on every call.
_ENVIRON = getattr(os.environ, "_data", None)
_NAME = os.environ.encodekey("XFUSE_NUM_THREADS") if _ENVIRON is not None else "XFUSE_NUM_THREADS"


def num_threads() -> int:
    global _default
    if _threads:
        return _threads
    raw = _ENVIRON.get(_NAME) if _ENVIRON is not None else os.environ.get(_NAME)
    if _default[0] != raw:  # worked out once per setting: the affinity call costs 2-3 us
        env = os.environ.decodevalue(raw) if _ENVIRON is not None and raw is not None else raw
        _default = (raw, _default_threads(env))
    return _default[1]


def _default_threads(env: str | None) -> int:
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
            _pool.shutdown()
            _pool = None


class _Pending:
    """A chunk handed to the pool: `result()` waits for it and raises what it raised."""

    __slots__ = ("_done",)

    def __init__(self, done: SimpleQueue) -> None:
        self._done = done

    def result(self) -> None:
        error = self._done.get()
        if error is not None:
            raise error


def _run(fn: Callable, args: tuple) -> BaseException | None:
    """Runs a chunk; what it raised, for its caller to raise (`_Pending.result`)."""
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
        return e
    return None


class _Pool:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._tasks: SimpleQueue = SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        for i in range(workers):
            threading.Thread(target=self._work, name=f"xfuse_{i}", daemon=True).start()

    def _work(self) -> None:
        _local.worker = True
        while True:
            task = self._tasks.get()
            if task is None:
                return
            fn, args, done = task
            error = _run(fn, args)
            # the chunk's closure holds the caller's arrays (its output buffer among them):
            # let go of it before the caller hears the chunk is done, so the buffer can be
            # reused at once (not only when the next chunk arrives)
            task = fn = args = None
            done.put(error)
            done = error = None

    def submit(self, fn: Callable, *args) -> _Pending:
        done: SimpleQueue = SimpleQueue()
        with self._lock:
            if not self._closed:
                self._tasks.put((fn, args, done))
                return _Pending(done)
        # a caller that took this pool just before a new thread count retired it: its threads
        # are leaving, so the chunk runs here
        done.put(_run(fn, args))
        return _Pending(done)

    def shutdown(self) -> None:
        """The threads leave once the chunks already handed over are done; later chunks run
        on their caller's thread."""
        with self._lock:
            self._closed = True
            for _ in range(self.workers):
                self._tasks.put(None)


def _get_pool(workers: int) -> _Pool:
    global _pool
    with _lock:
        if _pool is None or _pool.workers < workers:
            if _pool is not None:
                _pool.shutdown()
            _pool = _Pool(workers)
        return _pool


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: it makes its own pool when it splits."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_quiet_hooks: list[Callable[[], None]] = []


def on_quiet(hook: Callable[[], None]) -> None:
    """Registers hook() to run at `quiet()` (a backend's threads that spin while they wait)."""
    _quiet_hooks.append(hook)


def quiet() -> None:
    """Work is about to run on other threads (numpy's BLAS with its own, or this module's
    pool): a backend's threads that watch for work with the cores spinning stop watching, so
    as not to take a core from them."""
    for hook in _quiet_hooks:
        hook()


def in_worker() -> bool:
    """Whether this thread runs a chunk of a split (there a split runs serially)."""
    return getattr(_local, "worker", False)


def run_rows(fn: Callable[[int, int], None], rows: int, split: bool = True) -> None:
    """Runs fn(start, end) over [0, rows), in one chunk per thread when `split`."""
    threads = min(num_threads(), rows) if split and not in_worker() else 1
    if threads <= 1:
        fn(0, rows)
        return
    bounds = [rows * i // threads for i in range(threads + 1)]
    quiet()  # this pool's threads take the cores
    pool = _get_pool(threads - 1)
    pending = [pool.submit(fn, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    try:
        fn(bounds[0], bounds[1])
    except BaseException:
        _wait(pending)  # every chunk is done before the caller goes on: they write its buffers
        raise
    error = _wait(pending)
    if error is not None:
        raise error


def run_each(fns: list[Callable[[], None]]) -> None:
    """Runs each of `fns` at once, the first in this thread and the others in the pool's
    (independent loops: the parts of a loop split by rows). Each runs as a pool worker: what it
    calls does not split its rows again, so no part waits for a thread another part holds. With
    one thread, or from a pool thread, they run one after another."""
    threads = min(num_threads(), len(fns)) if not in_worker() else 1
    if threads <= 1:
        for fn in fns:
            fn()
        return
    bounds = [len(fns) * i // threads for i in range(threads + 1)]

    def chunk(start: int, end: int) -> None:
        for fn in fns[start:end]:
            fn()

    quiet()
    pool = _get_pool(threads - 1)
    pending = [pool.submit(chunk, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    _local.worker = True
    try:
        chunk(bounds[0], bounds[1])
    except BaseException:
        _wait(pending)
        raise
    finally:
        _local.worker = False
    error = _wait(pending)
    if error is not None:
        raise error


def _wait(pending: list[_Pending]) -> BaseException | None:
    """Waits for every chunk; the first exception raised in one, if any."""
    error = None
    for p in pending:
        try:
            p.result()
        except BaseException as e:  # noqa: BLE001 - the caller raises it
            error = error or e
    return error
